//! Real TiDB servers for tests and benchmarks: a standalone `tidb-server` with its embedded store
//! (unistore), built once by `scripts/tidb.sh`. Each one gets its own data folder, loopback SQL
//! and status ports and a Unix socket (its second address: two addresses of one server stand in
//! for two TiDB servers sharing one store), TLS with a certificate it makes itself, and what
//! moving sessions needs: a session-token signing certificate (one per machine, shared by every
//! server, as TiDB servers of one cluster share theirs) and a graceful wait before shutdown.

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::mariadb::{FileLock, free_port, spawn, work_root};

/// Users and schemas every TiDB test server has (the MariaDB servers' users, without the
/// ed25519 one, and a caching_sha2_password one).
pub const SETUP_SQL: &str = "
CREATE USER 'app'@'%' IDENTIFIED BY 'apppw';
GRANT ALL ON *.* TO 'app'@'%' WITH GRANT OPTION;
CREATE USER 'other'@'%' IDENTIFIED BY 'otherpw';
GRANT ALL ON test.* TO 'other'@'%';
CREATE USER 'nopw'@'%';
GRANT ALL ON test.* TO 'nopw'@'%';
CREATE USER 'sha2'@'%' IDENTIFIED WITH caching_sha2_password BY 'sha2pw';
GRANT ALL ON test.* TO 'sha2'@'%';
CREATE USER 'sm3'@'%' IDENTIFIED WITH tidb_sm3_password BY 'sm3pw';
GRANT ALL ON test.* TO 'sm3'@'%';
CREATE USER 'monitor'@'%' IDENTIFIED BY 'monitorpw';
CREATE USER 'sbtest'@'%' IDENTIFIED BY 'sbtest';
GRANT ALL ON *.* TO 'sbtest'@'%';
CREATE DATABASE IF NOT EXISTS test;
CREATE DATABASE IF NOT EXISTS sbtest;
";

/// The tidb-server binary: `SLUICE_TIDB_SERVER` when set, else the one `scripts/tidb.sh` built
/// (built now when missing; the script serialises concurrent builds).
pub fn ensure_built() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_TIDB_SERVER") {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/tidb.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("SLUICE_TESTKIT_DIR", work_root())
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/tidb.sh");
    assert!(out.status.success(), "scripts/tidb.sh could not build tidb-server");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.exists(), "scripts/tidb.sh printed {path:?}, which does not exist");
    path
}

/// The session-token signing certificate and key every test server shares (made once).
fn token_cert() -> (PathBuf, PathBuf) {
    let dir = work_root().join("tidb");
    std::fs::create_dir_all(&dir).expect("tidb dir");
    let (cert, key) = (dir.join("token-cert.pem"), dir.join("token-key.pem"));
    if cert.exists() && key.exists() {
        return (cert, key);
    }
    let _lock = FileLock::acquire(&dir.join("token.lock"));
    if !(cert.exists() && key.exists()) {
        let ok = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=sluice-test-tidb-token"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "openssl could not make the session-token certificate");
    }
    (cert, key)
}

/// How a test server is started.
#[derive(Clone, Debug)]
pub struct Options {
    /// `graceful-wait-before-shutdown`: after SIGTERM, the server reports itself closing on its
    /// status port for this long before it closes its sessions.
    pub graceful_wait: Duration,
    /// Extra lines for the configuration file's top level.
    pub extra: String,
}

impl Default for Options {
    fn default() -> Options {
        Options { graceful_wait: Duration::from_secs(0), extra: String::new() }
    }
}

/// One running tidb-server. Killed and its folder removed when dropped.
pub struct TiDb {
    pub port: u16,
    pub status_port: u16,
    pub socket: PathBuf,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl TiDb {
    pub fn start() -> TiDb {
        Self::start_with(&Options::default())
    }

    pub fn start_with(opts: &Options) -> TiDb {
        let bin = ensure_built();
        let (cert, key) = token_cert();
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(crate::mariadb::remove_stale_dirs);
        let dir = work_root().join(format!("tidb-{}-{}", std::process::id(), crate::unique_id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("tidb data dir");
        let (port, status_port) = (free_port(), free_port());
        let socket = dir.join("tidb.sock");
        let config = format!(
            "host = \"127.0.0.1\"\nport = {port}\nstore = \"unistore\"\npath = \"{store}\"\nsocket = \"{sock}\"\n\
             tmp-storage-path = \"{dir}\"\ngraceful-wait-before-shutdown = {wait}\n{extra}\n\
             [status]\nstatus-host = \"127.0.0.1\"\nstatus-port = {status_port}\nreport-status = true\n\
             [security]\nauto-tls = true\nrsa-key-size = 2048\n\
             session-token-signing-cert = \"{cert}\"\nsession-token-signing-key = \"{key}\"\n\
             [performance]\nrun-auto-analyze = false\n\
             [log]\nlevel = \"warn\"\nslow-query-file = \"{slow}\"\n[log.file]\nfilename = \"{log}\"\n",
            store = dir.join("store").display(),
            sock = socket.display(),
            dir = dir.display(),
            wait = opts.graceful_wait.as_secs(),
            extra = opts.extra,
            cert = cert.display(),
            key = key.display(),
            log = dir.join("tidb.log").display(),
            slow = dir.join("slow.log").display(),
        );
        let path = dir.join("tidb.toml");
        std::fs::write(&path, config).expect("write tidb.toml");
        let mut cmd = Command::new(&bin);
        cmd.arg(format!("--config={}", path.display()))
            .env("GOMAXPROCS", std::env::var("SLUICE_TIDB_GOMAXPROCS").unwrap_or_else(|_| "2".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(dir.join("stderr.log")).expect("stderr log")));
        let child = spawn(cmd).expect("spawn tidb-server");
        let mut db = TiDb { port, status_port, socket, dir, child: Some(child) };
        db.wait_ready();
        db.sql(SETUP_SQL);
        db
    }

    /// Waits until the server greets on its SQL port (its bootstrap runs first).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.greets() {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
                let tail = &log[log.len().saturating_sub(4000)..];
                panic!("tidb-server exited with {st} during start:\n{tail}");
            }
            assert!(Instant::now() < deadline, "tidb-server did not come up within 120 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn status_addr(&self) -> String {
        format!("127.0.0.1:{}", self.status_port)
    }

    /// Runs SQL as root (no password) over TCP with the `mariadb` client; its tab-separated
    /// output.
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        crate::mariadb::run_client(&["-h127.0.0.1", &format!("-P{}", self.port), "-uroot", "--skip-ssl"], sql)
    }

    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql).unwrap_or_else(|e| panic!("SQL failed on TiDB: {sql}: {e}"))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        crate::mariadb::kill_child(&mut self.child);
    }

    /// SIGTERM without waiting: the server begins its graceful shutdown.
    pub fn terminate(&self) {
        if let Some(pid) = self.pid() {
            crate::mariadb::signal(pid, "TERM");
        }
    }

    /// Waits for the process to end after [`TiDb::terminate`] (killed after `limit`); whether
    /// it ended by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let Some(mut c) = self.child.take() else { return true };
        let deadline = Instant::now() + limit;
        while matches!(c.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Whether the server answers with a greeting right now.
    pub fn greets(&self) -> bool {
        crate::mariadb::greets_at(self.port)
    }

    /// The status port's answer to `GET path`: its HTTP status code and body.
    pub fn status(&self, path: &str) -> Option<(u16, String)> {
        use std::io::Write;
        let mut s = TcpStream::connect(("127.0.0.1", self.status_port)).ok()?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((code, body))
    }
}

impl Drop for TiDb {
    fn drop(&mut self) {
        self.kill();
        if std::env::var_os("SLUICE_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

//! Real MariaDB servers for tests and benchmarks: each one gets its own data directory (copied
//! from a template initialised once per machine), its own loopback port and Unix socket.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Users every test server has (created in the template).
pub const SETUP_SQL: &str = "
CREATE USER 'app'@'%' IDENTIFIED BY 'apppw';
GRANT ALL ON *.* TO 'app'@'%' WITH GRANT OPTION;
CREATE USER 'other'@'%' IDENTIFIED BY 'otherpw';
GRANT ALL ON test.* TO 'other'@'%';
CREATE USER 'nopw'@'%';
GRANT ALL ON test.* TO 'nopw'@'%';
CREATE USER 'ed'@'%' IDENTIFIED VIA ed25519 USING PASSWORD('edpw');
GRANT ALL ON test.* TO 'ed'@'%';
CREATE USER 'monitor'@'%' IDENTIFIED BY 'monitorpw';
CREATE USER 'sbtest'@'%' IDENTIFIED BY 'sbtest';
GRANT ALL ON *.* TO 'sbtest'@'%';
CREATE DATABASE IF NOT EXISTS test;
CREATE DATABASE IF NOT EXISTS sbtest;
FLUSH PRIVILEGES;
";

fn server_binary() -> Option<PathBuf> {
    ["/usr/sbin/mariadbd", "/usr/bin/mariadbd", "/usr/sbin/mysqld"].iter().map(PathBuf::from).find(|p| p.exists())
}

/// Installs mariadb-server with apt when no server binary is present (serialised by a lock so
/// that parallel tests do not run apt twice).
pub fn ensure_installed() -> PathBuf {
    if let Some(p) = server_binary() {
        return p;
    }
    let _lock = FileLock::acquire(&std::env::temp_dir().join("sluice-testkit-apt.lock"));
    if let Some(p) = server_binary() {
        return p;
    }
    eprintln!("testkit: installing mariadb-server with apt-get");
    let ok = Command::new("sh")
        .arg("-c")
        .arg("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server mariadb-client >/dev/null")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "could not install mariadb-server with apt-get");
    server_binary().expect("mariadbd after install")
}

/// A crude cross-process lock on a file (held while the value lives).
pub struct FileLock(PathBuf);

impl FileLock {
    pub fn acquire(path: &Path) -> FileLock {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            match fs::OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(mut f) => {
                    let _ = write!(f, "{}", std::process::id());
                    return FileLock(path.to_path_buf());
                }
                Err(_) => {
                    // A lock left by a dead process is taken over.
                    let stale = fs::read_to_string(path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok())
                        .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                    if stale {
                        let _ = fs::remove_file(path);
                        continue;
                    }
                    assert!(Instant::now() < deadline, "timed out waiting for {}", path.display());
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Where test servers live: under the cargo target directory when known, else the temp dir.
pub fn work_root() -> PathBuf {
    let base = std::env::var_os("SLUICE_TESTKIT_DIR").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
            .join("testkit")
    });
    fs::create_dir_all(&base).expect("create testkit dir");
    base
}

/// A server's own directory for temporary files, next to its data directory (not inside it,
/// where the server would take it for a database). Each server needs its own: at start-up a
/// server deletes every `#sql*` file in its temporary directory, which in a shared `/tmp` are the
/// on-disk temporary tables of the servers already running.
fn tmp_dir(datadir: &Path) -> PathBuf {
    let mut name = datadir.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    datadir.with_file_name(name)
}

/// The options of every test server; `binlog`: it writes a binary log (a replication topology's
/// servers), else none.
fn server_args(bin: &Path, datadir: &Path, socket: &Path, port: Option<u16>, binlog: bool) -> Command {
    let tmp = tmp_dir(datadir);
    fs::create_dir_all(&tmp).expect("create the server's temporary directory");
    let mut c = Command::new(bin);
    c.arg("--no-defaults")
        .arg(format!("--datadir={}", datadir.display()))
        .arg(format!("--tmpdir={}", tmp.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--pid-file={}", datadir.join("mariadb.pid").display()))
        .arg(format!("--log-error={}", datadir.join("error.log").display()))
        .arg("--user=root")
        .arg("--innodb-buffer-pool-size=64M")
        .arg("--innodb-log-file-size=16M")
        .arg("--innodb-flush-log-at-trx-commit=2")
        .arg("--skip-name-resolve")
        .arg("--max-connections=4000")
        .arg("--max-allowed-packet=256M")
        .arg("--plugin-load-add=auth_ed25519")
        .arg("--local-infile=1")
        .arg("--performance-schema=OFF");
    if !binlog {
        c.arg("--skip-log-bin");
    }
    match port {
        Some(p) => c.arg(format!("--port={p}")).arg("--bind-address=127.0.0.1"),
        None => c.arg("--skip-networking"),
    };
    c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

/// Spawns a process that is killed when this process ends, however it ends (a crashed test, a
/// killed benchmark), so no server outlives its harness. The parent-death signal is tied to the
/// spawning thread, so every child is spawned from one thread that lives as long as the process.
pub fn spawn(mut c: Command) -> std::io::Result<Child> {
    use std::sync::mpsc;
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Job>>> = std::sync::OnceLock::new();
    die_with_parent(&mut c);
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut c, reply) in rx {
                    let _ = reply.send(c.spawn());
                }
            })
            .expect("spawner thread");
        std::sync::Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::channel();
    tx.lock().map_err(|_| std::io::Error::other("spawner poisoned"))?.send((c, rtx)).map_err(|_| std::io::Error::other("spawner gone"))?;
    rrx.recv().map_err(|_| std::io::Error::other("spawner gone"))?
}

fn die_with_parent(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// Builds the template data directory once per machine (it is reused across test runs).
fn template(bin: &Path) -> PathBuf {
    let root = work_root();
    let dir = root.join("mariadb-template");
    if dir.join("READY").exists() {
        return dir;
    }
    let _lock = FileLock::acquire(&root.join("template.lock"));
    if dir.join("READY").exists() {
        return dir;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("template dir");
    let install = ["/usr/bin/mariadb-install-db", "/usr/bin/mysql_install_db"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("mariadb-install-db");
    let out = Command::new(install)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", dir.display()))
        .arg("--user=root")
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .arg("--innodb-log-file-size=16M")
        .output()
        .expect("run mariadb-install-db");
    assert!(out.status.success(), "mariadb-install-db failed: {}", String::from_utf8_lossy(&out.stderr));
    let socket = root.join("template.sock");
    let mut child = spawn(server_args(bin, &dir, &socket, None, false)).expect("start template server");
    wait_socket(&socket, &mut child, &dir);
    run_sql(&socket, SETUP_SQL).expect("template setup SQL");
    run_sql(&socket, "SHUTDOWN").ok();
    let _ = child.wait();
    fs::write(dir.join("READY"), b"ok").expect("mark template");
    dir
}

fn wait_socket(socket: &Path, child: &mut Child, datadir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            let log = fs::read_to_string(datadir.join("error.log")).unwrap_or_default();
            panic!("mariadbd exited with {st} during start:\n{log}");
        }
        assert!(Instant::now() < deadline, "mariadbd did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs SQL as root over the server's Unix socket with the `mariadb` command-line client and
/// returns its tab-separated output.
pub fn run_sql(socket: &Path, sql: &str) -> Result<String, String> {
    run_client(&[&format!("--socket={}", socket.display()), "-uroot"], sql)
}

/// Runs SQL with the `mariadb` command-line client given `args` (where and as whom) and returns
/// its tab-separated output.
pub fn run_client(args: &[&str], sql: &str) -> Result<String, String> {
    let mut child = Command::new("mariadb")
        .args(args)
        .args(["--batch", "--skip-column-names"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run mariadb client: {e}"))?;
    child.stdin.take().expect("stdin").write_all(sql.as_bytes()).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A free loopback port (bound and released; the server binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One running MariaDB server. Stopped and removed when dropped.
pub struct MariaDb {
    pub port: u16,
    pub socket: PathBuf,
    pub dir: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

impl MariaDb {
    /// Starts a fresh server on a free loopback port.
    pub fn start() -> MariaDb {
        Self::start_with(&[])
    }

    /// Starts a fresh server with extra server options (e.g. `--ssl-cert=...`).
    pub fn start_with(extra: &[String]) -> MariaDb {
        let bin = ensure_installed();
        let tpl = template(&bin);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            remove_stale_dirs();
        }
        let dir = work_root().join(format!("db-{}-{}", std::process::id(), n));
        let _ = fs::remove_dir_all(&dir);
        copy_dir(&tpl, &dir);
        let _ = fs::remove_file(dir.join("READY"));
        let socket = dir.join("mariadb.sock");
        let mut db = MariaDb { port: 0, socket, dir, bin, child: None, extra: extra.to_vec() };
        db.launch(free_port());
        db
    }

    /// Starts the server and waits until it greets on its TCP port. Its sockets exist before it
    /// serves (the listen backlog accepts connections during start-up), and MariaDB 10.11 has
    /// been seen to hang during start-up now and then (in init_slave): a server that does not
    /// greet in time is killed and started again.
    fn launch(&mut self, port: u16) {
        self.port = port;
        for attempt in 1..=3 {
            let binlog = self.extra.iter().any(|a| a.starts_with("--log-bin"));
            let mut cmd = server_args(&self.bin, &self.dir, &self.socket, Some(port), binlog);
            cmd.args(&self.extra);
            let mut child = spawn(cmd).expect("spawn mariadbd");
            wait_socket(&self.socket, &mut child, &self.dir);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if self.greets() {
                    self.child = Some(child);
                    return;
                }
                if let Ok(Some(st)) = child.try_wait() {
                    panic!("mariadbd exited with {st} during start");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("testkit: mariadbd on port {port} did not greet within 30 s (attempt {attempt}); restarting it");
            let _ = child.kill();
            let _ = child.wait();
            let _ = fs::remove_file(&self.socket);
        }
        panic!("mariadbd on port {port} never became ready");
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn sql(&self, sql: &str) -> String {
        run_sql(&self.socket, sql).unwrap_or_else(|e| panic!("SQL failed: {sql}: {e}"))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL: the server dies without closing connections cleanly.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// A normal shutdown (SIGTERM), waiting for the process to exit (killed after 60 s).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(c.try_wait(), Ok(None)) {
                if Instant::now() > deadline {
                    eprintln!("testkit: mariadbd did not stop within 60 s; killing it");
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and data directory.
    pub fn restart(&mut self) {
        self.stop();
        let _ = fs::remove_file(&self.socket);
        self.launch(self.port);
    }

    /// Starts the server again on the same data directory at `port` (where clients configured
    /// with the old port do not see it).
    pub fn restart_at(&mut self, port: u16) {
        self.stop();
        let _ = fs::remove_file(&self.socket);
        self.launch(port);
    }

    /// Whether the server answers with a greeting right now.
    pub fn greets(&self) -> bool {
        greets_at(self.port)
    }
}

/// Whether a server on the loopback `port` answers with a greeting right now.
pub fn greets_at(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut b = [0u8; 5];
    s.read_exact(&mut b).is_ok() && b[4] == 10
}

/// SIGKILL to a server process, waited for.
pub fn kill_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

pub(crate) fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.kill();
        if std::env::var_os("SLUICE_KEEP_TEST_DIRS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
            let _ = fs::remove_dir_all(tmp_dir(&self.dir));
        }
    }
}

/// Removes data directories left by test processes that no longer exist.
pub(crate) fn remove_stale_dirs() {
    let Ok(entries) = fs::read_dir(work_root()) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("db-")
            .or_else(|| name.strip_prefix("tidb-"))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create data dir");
    for entry in fs::read_dir(from).expect("read template") {
        let entry = entry.expect("template entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_type().expect("file type").is_file() {
            fs::copy(entry.path(), &target).expect("copy template file");
        }
    }
}

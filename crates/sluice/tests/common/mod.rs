//! Shared set-up for the integration tests: real MariaDB servers and a sluice process.
#![allow(dead_code, unused_imports)]

use std::path::Path;
use std::sync::OnceLock;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, OptsBuilder};
pub use sluice_testkit::raw::{Raw, err_code};
pub use sluice_testkit::{MariaDb, SluiceProc};

pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_sluice"))
}

/// One MariaDB server shared by the tests of a test binary (killed when the binary exits).
pub fn shared_db() -> &'static MariaDb {
    static DB: OnceLock<MariaDb> = OnceLock::new();
    DB.get_or_init(MariaDb::start)
}

/// A passthrough sluice in front of the shared server, shared by the tests of a binary.
pub fn shared_sluice() -> &'static SluiceProc {
    static S: OnceLock<SluiceProc> = OnceLock::new();
    S.get_or_init(|| start_sluice(&[shared_db()], &[]))
}

/// Starts sluice in front of `dbs` with quick-start flags plus `extra`.
pub fn start_sluice(dbs: &[&MariaDb], extra: &[&str]) -> SluiceProc {
    let mut args = vec!["--listen".to_string(), "127.0.0.1:0".into(), "--admin".into(), "127.0.0.1:0".into()];
    for d in dbs {
        args.push("--backend".into());
        args.push(d.addr());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    SluiceProc::start(bin(), &args)
}

/// Starts sluice with a configuration file whose text is given.
pub fn start_sluice_config(toml: &str) -> SluiceProc {
    let path = sluice_testkit::mariadb::work_root().join(format!("cfg-{}-{}.toml", std::process::id(), sluice_testkit::unique_id()));
    std::fs::write(&path, toml).expect("write config");
    SluiceProc::start(bin(), &["--config".to_string(), path.display().to_string()])
}

/// Starts sluice with the configuration file at `path` (which a test may rewrite, and reload).
pub fn start_sluice_file(path: &Path) -> SluiceProc {
    SluiceProc::start(bin(), &["--config".to_string(), path.display().to_string()])
}

/// A path for a test's configuration file.
pub fn config_path(what: &str) -> std::path::PathBuf {
    sluice_testkit::mariadb::work_root().join(format!("cfg-{what}-{}-{}.toml", std::process::id(), sluice_testkit::unique_id()))
}

/// A configuration file for a test: a listener and the admin API on free loopback ports, and
/// whatever the test adds. Keys of one table given in several calls land in that one table.
#[derive(Clone, Default)]
pub struct TestConfig {
    root: String,
    listener: String,
    admin: Option<String>,
    tables: Vec<(String, String)>,
    arrays: String,
}

impl TestConfig {
    pub fn new() -> TestConfig {
        TestConfig { admin: Some(String::new()), ..Default::default() }
    }

    /// Keys before any table (`tls = "off"`).
    pub fn root(mut self, keys: &str) -> Self {
        self.root.push_str(keys);
        self
    }

    /// More keys of the listener (`auth = "users"`).
    pub fn listener(mut self, keys: &str) -> Self {
        self.listener.push_str(keys);
        self
    }

    /// More keys of `[admin]` (`token = "..."`).
    pub fn admin(mut self, keys: &str) -> Self {
        self.admin.get_or_insert_with(String::new).push_str(keys);
        self
    }

    pub fn without_admin(mut self) -> Self {
        self.admin = None;
        self
    }

    /// Keys of a table such as `proxy` or `health`.
    pub fn table(mut self, name: &str, keys: &str) -> Self {
        match self.tables.iter_mut().find(|(n, _)| n == name) {
            Some((_, k)) => k.push_str(keys),
            None => self.tables.push((name.to_string(), keys.to_string())),
        }
        self
    }

    pub fn proxy(self, keys: &str) -> Self {
        self.table("proxy", keys)
    }

    /// A backend at `address` (`HOST:PORT` or a socket path) with more keys of its own.
    pub fn backend_with(mut self, address: &str, keys: &str) -> Self {
        self.arrays.push_str(&format!("[[backends]]\naddress = \"{address}\"\n{keys}"));
        self
    }

    pub fn backend(self, address: &str) -> Self {
        self.backend_with(address, "")
    }

    /// The servers as backends.
    pub fn dbs(self, dbs: &[&MariaDb]) -> Self {
        dbs.iter().fold(self, |c, d| c.backend(&d.addr()))
    }

    /// A `[[users]]` entry (users mode) with more keys of its own.
    pub fn user(mut self, name: &str, keys: &str) -> Self {
        self.arrays.push_str(&format!("[[users]]\nname = \"{name}\"\n{keys}"));
        self
    }

    /// A `[[rules]]` entry (a query rule).
    pub fn rule(mut self, keys: &str) -> Self {
        self.arrays.push_str(&format!("[[rules]]\n{keys}"));
        self
    }

    /// The users every test server has, app/apppw and other/otherpw, in users mode.
    pub fn app_users(self) -> Self {
        self.user("app", "password = \"apppw\"\n").user("other", "password = \"otherpw\"\n")
    }

    pub fn text(&self) -> String {
        let mut s = format!("{}[[listeners]]\naddress = \"127.0.0.1:0\"\n{}", self.root, self.listener);
        if let Some(admin) = &self.admin {
            s.push_str(&format!("[admin]\nlisten = \"127.0.0.1:0\"\n{admin}"));
        }
        for (name, keys) in &self.tables {
            s.push_str(&format!("[{name}]\n{keys}"));
        }
        s + &self.arrays
    }

    pub fn start(&self) -> SluiceProc {
        start_sluice_config(&self.text())
    }
}

pub fn opts(addr: &str, user: &str, pass: &str) -> OptsBuilder {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    OptsBuilder::default()
        .ip_or_hostname(host.to_string())
        .tcp_port(port.parse().expect("port"))
        .user(Some(user.to_string()))
        .pass(Some(pass.to_string()))
        .prefer_socket(false)
}

pub async fn connect(addr: &str, user: &str, pass: &str) -> Conn {
    Conn::new(Opts::from(opts(addr, user, pass))).await.unwrap_or_else(|e| panic!("connect {user}@{addr}: {e}"))
}

/// Options for a client that requires TLS (and accepts any certificate, as sluice's own is
/// self-signed unless configured).
pub fn tls_opts(addr: &str, user: &str, pass: &str) -> OptsBuilder {
    opts(addr, user, pass).ssl_opts(mysql_async::SslOpts::default().with_danger_accept_invalid_certs(true))
}

/// `SHOW SESSION STATUS LIKE 'Ssl_cipher'` on a connection: empty when it is not encrypted.
pub async fn ssl_cipher(c: &mut Conn) -> String {
    let row: Option<(String, String)> = c.query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'").await.expect("Ssl_cipher");
    row.expect("an Ssl_cipher row").1
}

pub async fn app(s: &SluiceProc) -> Conn {
    connect(&s.listen, "app", "apppw").await
}

/// A fresh database for one test, so that tests sharing a server do not collide.
pub async fn fresh_db(c: &mut Conn, name: &str) {
    c.query_drop(format!("DROP DATABASE IF EXISTS {name}")).await.expect("drop db");
    c.query_drop(format!("CREATE DATABASE {name}")).await.expect("create db");
    c.query_drop(format!("USE {name}")).await.expect("use db");
}

/// Connections the server has from user `app` now.
pub fn app_threads(db: &MariaDb) -> usize {
    db.sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'app'")
        .trim()
        .lines()
        .last()
        .unwrap_or("0")
        .trim()
        .parse()
        .unwrap()
}

/// GET on the admin API; returns (status, body).
pub fn admin_get(s: &SluiceProc, path: &str, token: Option<&str>) -> (u16, String) {
    admin_request(s, "GET", path, token)
}

/// POST (with no body) on the admin API; returns (status, body).
pub fn admin_post(s: &SluiceProc, path: &str) -> (u16, String) {
    admin_request(s, "POST", path, None)
}

/// POST with a JSON body on the admin API; returns (status, body).
pub fn admin_post_json(s: &SluiceProc, path: &str, body: &serde_json::Value) -> (u16, String) {
    admin_send(s, "POST", path, None, Some(&body.to_string()))
}

fn admin_request(s: &SluiceProc, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    admin_send(s, method, path, token, None)
}

fn admin_send(s: &SluiceProc, method: &str, path: &str, token: Option<&str>, json: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = s.admin.as_ref().expect("admin API enabled");
    let mut t = std::net::TcpStream::connect(addr).expect("admin connect");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    // (The API takes a mutation only as JSON.)
    let (kind, body) = match json {
        Some(b) => ("Content-Type: application/json\r\n", b),
        None if method != "GET" => ("Content-Type: application/json\r\n", "{}"),
        None => ("", ""),
    };
    write!(t, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}{kind}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        .expect("admin write");
    let mut out = String::new();
    t.read_to_string(&mut out).expect("admin read");
    let status = out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// Waits (bounded) until `cond` holds; panics with `what` otherwise. Not a timing assertion:
/// the bound only keeps a broken build from hanging.
pub fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    assert!(try_wait_for(cond), "timed out waiting for: {what}");
}

/// Waits (bounded, as [`wait_for`]) until `cond` holds; false when it never did, so that the
/// caller can say why.
pub fn try_wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cond() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    true
}

/// Waits until sluice lists no session: every command of the sessions that ended has been
/// accounted (a command's digest and metrics are recorded after its response is sent).
pub fn wait_sessions_closed(s: &SluiceProc) {
    wait_for("every session closed", || json(&admin_get(s, "/sessions", None).1).as_array().is_some_and(|a| a.is_empty()));
}

/// The value of one series of sluice's metrics (`series` includes the labels), 0 if absent.
pub fn metric(s: &SluiceProc, series: &str) -> u64 {
    let (_, body) = admin_get(s, "/metrics", None);
    body.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok())).unwrap_or(0)
}

/// The sum over every label set of a metric (`prefix` is the name with its opening brace).
pub fn metric_sum(s: &SluiceProc, prefix: &str) -> u64 {
    let (_, body) = admin_get(s, "/metrics", None);
    body.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok()).sum()
}

/// Open file descriptors of the sluice process.
pub fn fd_count(s: &SluiceProc) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", s.pid())).map(|d| d.count()).unwrap_or(0)
}

/// What each of the process's descriptors is (`socket:[inode]`, a path), sorted: printed when
/// a count does not come back, to say which.
pub fn fd_targets(s: &SluiceProc) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", s.pid())) else { return Vec::new() };
    let mut out: Vec<String> = dir
        .flatten()
        .map(|e| {
            format!(
                "{}->{}",
                e.file_name().to_string_lossy(),
                std::fs::read_link(e.path()).map(|t| t.display().to_string()).unwrap_or_default()
            )
        })
        .collect();
    out.sort();
    out
}

pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("bad JSON ({e}): {body}"))
}

/// Writes a fresh self-signed certificate and key for "localhost"/127.0.0.1; returns their paths.
pub fn self_signed_cert() -> (std::path::PathBuf, std::path::PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("certificate");
    let dir = sluice_testkit::mariadb::work_root();
    let n = sluice_testkit::unique_id();
    let cert = dir.join(format!("cert-{}-{n}.pem", std::process::id()));
    let key = dir.join(format!("key-{}-{n}.pem", std::process::id()));
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("write key");
    (cert, key)
}

/// A MariaDB server with TLS (a self-signed certificate made here), and the certificate's path,
/// which serves as the CA to verify it with.
pub fn start_tls_db() -> (MariaDb, std::path::PathBuf) {
    start_tls_db_with(&[])
}

/// What production servers have on that the harness's servers leave off: the performance
/// schema (where connection attributes show) and the binary log (GTIDs in session tracking).
/// The client drivers' suites run against such a server, with TLS.
pub const PRODUCTION_LIKE: [&str; 3] = ["--performance-schema=ON", "--log-bin=binlog", "--server-id=1"];

/// A MariaDB server with TLS and `extra` options.
pub fn start_tls_db_with(extra: &[&str]) -> (MariaDb, std::path::PathBuf) {
    let (cert, key) = self_signed_cert();
    let mut args = vec![format!("--ssl-cert={}", cert.display()), format!("--ssl-key={}", key.display())];
    args.extend(extra.iter().map(|s| s.to_string()));
    let db = MariaDb::start_with(&args);
    (db, cert)
}

/// Runs the `mariadb` command-line client; Ok(stdout) or Err(stderr).
pub fn cli(port: u16, user: &str, pass: &str, extra: &[&str], sql: &str) -> Result<String, String> {
    let mut c = std::process::Command::new("mariadb");
    c.args(["-h127.0.0.1", &format!("-P{port}"), &format!("-u{user}"), "-N", "-B"]);
    if !pass.is_empty() {
        c.arg(format!("-p{pass}"));
    }
    c.args(extra).args(["-e", sql]);
    let out = c.output().expect("run mariadb client");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Waits until `sql` runs on some thread of the server `c` is connected to (through sluice or not).
pub async fn wait_running(c: &mut Conn, sql: &str) {
    let q = format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO = '{sql}'");
    while c.query_first::<i64, _>(&q).await.expect("processlist") != Some(1) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Runs `sql` on `c` in a task, which gives back the result and the connection.
pub fn run_in_background(mut c: Conn, sql: &'static str) -> tokio::task::JoinHandle<(mysql_async::Result<()>, Conn)> {
    tokio::spawn(async move {
        let r = c.query_drop(sql).await;
        (r, c)
    })
}

/// Copies a directory tree (a driver's source, to build and run its tests in a copy).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create source dir");
    for e in std::fs::read_dir(from).expect("read source dir").map(|e| e.expect("dir entry")) {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().expect("file type").is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::write(&dst, std::fs::read(&src).expect("read source file")).expect("write source file");
        }
    }
}

/// What Python runs the client suites with (PyPI's packages, pinned).
pub const SQLALCHEMY: &str = "2.0.36";
pub const PYMYSQL: &str = "1.2.4";
pub const PYTEST: &str = "9.2.0";
pub const TYPING_EXTENSIONS: &str = "4.12.2";

/// A Python with pytest and PyMySQL, and SQLAlchemy's source distribution (its tests)
/// unpacked, under the testkit directory: made once (from PyPI) and kept.
pub struct PythonEnv {
    pub python: std::path::PathBuf,
    pub sqlalchemy: std::path::PathBuf,
}

fn run_ok(cmd: &mut std::process::Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what} failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

pub fn python_env() -> PythonEnv {
    use std::process::Command;
    let root = sluice_testkit::mariadb::work_root().join("python");
    let _lock = sluice_testkit::mariadb::FileLock::acquire(&root.with_extension("lock"));
    let venv = root.join("venv");
    let python = venv.join("bin/python");
    let sqlalchemy = root.join(format!("sqlalchemy-{SQLALCHEMY}"));
    let ready = root.join(format!("ready-{SQLALCHEMY}-{PYMYSQL}-{PYTEST}-{TYPING_EXTENSIONS}"));
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create python dir");
        run_ok(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv");
        let pip = |args: &[&str]| {
            let mut c = Command::new(&python);
            c.args(["-m", "pip", "--disable-pip-version-check", "-q"]).args(args).current_dir(&root);
            c
        };
        let wanted = [format!("pytest=={PYTEST}"), format!("PyMySQL=={PYMYSQL}"), format!("typing_extensions=={TYPING_EXTENSIONS}")];
        run_ok(pip(&["install"]).args(&wanted), "pip install");
        let sdist = format!("SQLAlchemy=={SQLALCHEMY}");
        run_ok(&mut pip(&["download", "--no-deps", "--no-binary", ":all:", "-d", "dist", &sdist]), "pip download SQLAlchemy");
        let tarball = std::fs::read_dir(root.join("dist")).expect("dist").flatten().next().expect("a source distribution").path();
        run_ok(Command::new("tar").arg("xzf").arg(&tarball).current_dir(&root), "tar");
        std::fs::write(&ready, "").expect("mark ready");
    }
    PythonEnv { python, sqlalchemy }
}

/// A sluice with the read/write split (causal reads for the session) in front of a primary and
/// its replicas, users mode, the monitor user reading roles and lag; it returns once every
/// replica serves reads.
pub fn split_sluice(t: &sluice_testkit::Topology) -> SluiceProc {
    split_sluice_with(t, "")
}

/// [`split_sluice`] with more `[routing]` keys (`causal_reads` among them, or "session").
pub fn split_sluice_with(t: &sluice_testkit::Topology, routing: &str) -> SluiceProc {
    let mut c = TestConfig::new()
        .proxy("workers = 1\n")
        .table("health", "interval = \"100ms\"\nuser = \"monitor\"\npassword = \"monitorpw\"\n")
        .table(
            "routing",
            &format!("split = true\n{}{routing}", if routing.contains("causal_reads") { "" } else { "causal_reads = \"session\"\n" }),
        )
        .app_users();
    for (i, s) in t.servers.iter().enumerate() {
        c = c.backend_with(&s.addr(), &format!("name = \"s{i}\"\n"));
    }
    let s = c.start();
    let replicas = t.replica_indexes().len();
    wait_for("every replica serving reads", || {
        let v = json(&admin_get(&s, "/backends", None).1);
        v.as_array().is_some_and(|b| b.iter().filter(|b| b["serves_reads"] == true).count() == replicas)
    });
    s
}

/// What a client's behaviour script saw, scenario by scenario (a JSON object).
pub type Seen = serde_json::Map<String, serde_json::Value>;

/// Runs a driver's behaviour script (`seen`, given an address) directly against a server set
/// up as production servers run, then through sluice in every mode (passthrough, users mode,
/// sessions moved at every safe point over two addresses of the server, multiplexing,
/// multiplexing with a park at every command), and through the read/write split in front of a
/// primary and a replica (against the primary directly); panics listing every scenario that
/// saw through sluice something else than directly.
pub fn compare_behaviours(seen: impl Fn(&str) -> Seen) {
    let (db, _) = start_tls_db_with(&PRODUCTION_LIKE);
    let direct = seen(&db.addr());
    for (name, what) in &direct {
        assert!(what.get("threw").is_none(), "scenario {name} failed directly: {what}");
    }
    let socket = db.socket.display().to_string();
    let modes = [
        ("passthrough", TestConfig::new().backend(&db.addr())),
        ("users mode", TestConfig::new().backend(&db.addr()).app_users()),
        (
            "moving sessions at every safe point",
            TestConfig::new().proxy("move_every_statement = true\n").backend(&db.addr()).backend(&socket).app_users(),
        ),
        ("multiplexing", TestConfig::new().proxy("multiplex = true\nmax_backend_connections = 8\n").backend(&db.addr()).app_users()),
        (
            "multiplexing and parking at every command",
            TestConfig::new().proxy("workers = 1\nmultiplex = true\npark_every_command = true\n").backend(&db.addr()).app_users(),
        ),
    ];
    let mut problems = Vec::new();
    let differences = |label: &str, direct: &Seen, through: &Seen, problems: &mut Vec<String>| {
        for (name, what) in direct {
            if through.get(name) != Some(what) {
                let got = through.get(name).unwrap_or(&serde_json::Value::Null);
                problems.push(format!("{name} ({label}):\n  directly: {what}\n  through sluice: {got}"));
            }
        }
    };
    for (label, config) in modes {
        let s = config.start();
        differences(label, &direct, &seen(&s.listen), &mut problems);
    }
    let t = sluice_testkit::Topology::start(1);
    let direct = seen(&t.primary().addr());
    let s = split_sluice(&t);
    differences("the read/write split", &direct, &seen(&s.listen), &mut problems);
    assert!(problems.is_empty(), "{} scenarios differ:\n{}", problems.len(), problems.join("\n"));
}

/// The SQL admin listener's address, from the log.
pub fn sql_admin_addr(s: &SluiceProc) -> String {
    let mut found = None;
    wait_for("the SQL admin listener", || {
        found = s
            .log_text()
            .lines()
            .find(|l| l.contains("SQL admin listener"))
            .and_then(|l| l.split("address=").nth(1))
            .map(|a| a.trim().to_string());
        found.is_some()
    });
    found.unwrap()
}

//! sysbench as background load for tests: preparing its tables on a server, running a workload
//! through sluice with lost connections ignored (and survived, see
//! scripts/sysbench-reconnect-shim.c), and reading its totals.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// Totals from sysbench's final report.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub queries: u64,
    pub transactions: u64,
    pub ignored_errors: u64,
    pub reconnects: u64,
    pub success: bool,
}

fn base(workload: &str, addr: &str, tables: u32, table_size: u32) -> Command {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let mut c = Command::new("sysbench");
    c.args([
        workload,
        "--db-driver=mysql",
        &format!("--mysql-host={host}"),
        &format!("--mysql-port={port}"),
        "--mysql-user=app",
        "--mysql-password=apppw",
        "--mysql-db=sbtest",
        &format!("--tables={tables}"),
        &format!("--table-size={table_size}"),
    ]);
    c
}

/// Creates the `sbtest` database and its tables on a server (directly, as user app).
pub fn prepare(db: &crate::MariaDb, tables: u32, table_size: u32) {
    db.sql("CREATE DATABASE IF NOT EXISTS sbtest");
    let out = base("oltp_common", &db.addr(), tables, table_size).arg("prepare").output().expect("run sysbench (installed by scripts/setup.sh)");
    assert!(out.status.success(), "sysbench prepare: {}", String::from_utf8_lossy(&out.stderr));
}

/// The reconnect shim, compiled once per test process.
fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/sysbench-reconnect-shim.c");
        let out = crate::mariadb::work_root().join(format!("sysbench-shim-{}.so", std::process::id()));
        let ok = Command::new("cc").args(["-shared", "-fPIC", "-O2", "-o"]).arg(&out).arg(&src).arg("-ldl").status();
        assert!(ok.is_ok_and(|s| s.success()), "cannot compile {}", src.display());
        out
    })
}

/// A sysbench run in the background.
pub struct Run {
    child: Child,
    out: std::thread::JoinHandle<String>,
    seconds: u32,
}

/// Starts `workload` against `addr` for `seconds`, ignoring (and reconnecting after) errors.
pub fn start(workload: &str, addr: &str, tables: u32, table_size: u32, threads: u32, seconds: u32) -> Run {
    let mut c = base(workload, addr, tables, table_size);
    c.args([&format!("--threads={threads}"), &format!("--time={seconds}"), "--mysql-ignore-errors=all", "--report-interval=1", "run"]);
    c.env("LD_PRELOAD", shim()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("start sysbench");
    let mut stdout = child.stdout.take().expect("stdout");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    Run { child, out, seconds }
}

impl Run {
    /// Whether sysbench is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the end and reads the totals; `text` is the whole report. A run that does not
    /// end within a minute of its time (a thread retrying a failing statement forever) is
    /// killed and reported as unsuccessful.
    pub fn finish(mut self) -> (Totals, String) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(self.seconds as u64 + 60);
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait for sysbench") {
                break Some(st);
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let text = self.out.join().unwrap_or_default();
        let num = |label: &str| -> u64 {
            text.lines()
                .find_map(|l| l.trim_start().strip_prefix(label))
                .and_then(|r| r.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        let totals = Totals {
            queries: num("queries:"),
            transactions: num("transactions:"),
            ignored_errors: num("ignored errors:"),
            reconnects: num("reconnects:"),
            success: status.is_some_and(|s| s.success()),
        };
        (totals, text)
    }
}

//! sysbench as background load for tests: preparing its tables on a server, running a workload
//! through sluice with lost connections ignored (and survived, see
//! scripts/sysbench-reconnect-shim.c), and reading its totals.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

/// Totals of a run, summed from its interval reports.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub queries: u64,
    pub transactions: u64,
    pub ignored_errors: u64,
    pub reconnects: u64,
    pub success: bool,
}

fn base(workload: &str, addr: &str, tables: u32, table_size: u32) -> Command {
    base_as(workload, addr, tables, table_size, ("app", "apppw"))
}

fn base_as(workload: &str, addr: &str, tables: u32, table_size: u32, (user, password): (&str, &str)) -> Command {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let mut c = Command::new("sysbench");
    c.args([
        workload,
        "--db-driver=mysql",
        &format!("--mysql-host={host}"),
        &format!("--mysql-port={port}"),
        &format!("--mysql-user={user}"),
        &format!("--mysql-password={password}"),
        "--mysql-db=sbtest",
        &format!("--tables={tables}"),
        &format!("--table-size={table_size}"),
    ]);
    c
}

/// Creates the `sbtest` database and its tables on a server (directly, as user app).
pub fn prepare(db: &crate::MariaDb, tables: u32, table_size: u32) {
    db.sql("CREATE DATABASE IF NOT EXISTS sbtest");
    prepare_at(&db.addr(), tables, table_size);
}

/// Creates sysbench's tables in the `sbtest` database of the server at `addr` (as user app).
pub fn prepare_at(addr: &str, tables: u32, table_size: u32) {
    let out = base("oltp_common", addr, tables, table_size).arg("prepare").output().expect("run sysbench (installed by scripts/setup.sh)");
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

/// A sysbench run in the background, which goes on until [`Run::stop`] (or its drop) ends it.
pub struct Run {
    child: Child,
    /// Everything it printed so far.
    out: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// At most this long, should the test process die without stopping its load.
const LIMIT_SECONDS: u32 = 900;

/// Starts `workload` against `addr`, ignoring (and reconnecting after) errors.
pub fn start(workload: &str, addr: &str, tables: u32, table_size: u32, threads: u32) -> Run {
    start_as(workload, addr, tables, table_size, threads, ("app", "apppw"))
}

/// [`start`] as another user (`app` has SUPER, which writes to a read-only server).
pub fn start_as(workload: &str, addr: &str, tables: u32, table_size: u32, threads: u32, login: (&str, &str)) -> Run {
    start_with(workload, addr, tables, table_size, threads, login, &[])
}

/// [`start_as`] with more of sysbench's options (`--db-ps-mode=disable`: text statements only).
pub fn start_with(workload: &str, addr: &str, tables: u32, table_size: u32, threads: u32, login: (&str, &str), extra: &[&str]) -> Run {
    let mut c = base_as(workload, addr, tables, table_size, login);
    c.args(extra);
    c.args([
        &format!("--threads={threads}"),
        &format!("--time={LIMIT_SECONDS}"),
        "--mysql-ignore-errors=all",
        // (Its debug level names each error it ignores.)
        "--verbosity=5",
        "--report-interval=1",
        "run",
    ]);
    c.env("LD_PRELOAD", shim()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("start sysbench");
    let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let out = Arc::new(Mutex::new(String::new()));
    // What it says of the errors it ignores goes to stderr: kept with the reports.
    let sink = out.clone();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(|l| l.ok()) {
            let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
            s.push_str(&line);
            s.push('\n');
        }
    });
    let sink = out.clone();
    let reader = std::thread::spawn(move || {
        for line in stdout.lines().map_while(|l| l.ok()) {
            let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
            s.push_str(&line);
            s.push('\n');
        }
    });
    Run { child, out, reader: Some(reader) }
}

impl Run {
    /// Whether sysbench is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The totals of its one-second reports so far.
    pub fn progress(&self) -> Totals {
        interval_totals(&self.out.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The error codes it ignored so far, one per error, in order.
    pub fn errors(&self) -> Vec<u16> {
        let out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out.lines().filter_map(|l| l.split_once("Ignoring error ")?.1.split_whitespace().next()?.parse().ok()).collect()
    }

    /// Ends the run and reads its totals; `text` is everything it printed. sysbench has no
    /// clean way to stop early (it ignores SIGINT; killed, it prints no final report), so the
    /// totals are summed from its one-second reports, and `success` says whether it was still
    /// running when stopped: it survived everything until then.
    pub fn stop(mut self) -> (Totals, String) {
        let success = self.running();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let text = std::mem::take(&mut *self.out.lock().unwrap_or_else(|e| e.into_inner()));
        let mut totals = interval_totals(&text);
        totals.success = success;
        (totals, text)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sums sysbench's interval reports (`[ 3s ] thds: 4 tps: 310.00 qps: 6200.00 (...) lat (ms,95%):
/// 5.00 err/s: 1.00 reconn/s: 0.00`), each rate times its interval.
fn interval_totals(text: &str) -> Totals {
    let (mut q, mut t, mut e, mut r, mut last) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for line in text.lines() {
        let Some(at) =
            line.trim_start().strip_prefix('[').and_then(|l| l.split_once("s ]")).and_then(|(n, _)| n.trim().parse::<f64>().ok())
        else {
            continue;
        };
        let rate = |label: &str| -> f64 {
            line.split_once(label).and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
        };
        let span = at - last;
        last = at;
        q += rate(" qps: ") * span;
        t += rate(" tps: ") * span;
        e += rate(" err/s: ") * span;
        r += rate(" reconn/s: ") * span;
    }
    Totals {
        queries: q.round() as u64,
        transactions: t.round() as u64,
        ignored_errors: e.round() as u64,
        reconnects: r.round() as u64,
        success: false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn totals_are_summed_from_the_interval_reports() {
        let text = "Threads started!\n\n\
            [ 1s ] thds: 4 tps: 100.00 qps: 2000.50 (r/w/o: 1400.00/400.00/200.50) lat (ms,95%): 5.00 err/s: 1.00 reconn/s: 0.00\n\
            [ 3s ] thds: 4 tps: 50.00 qps: 1000.00 (r/w/o: 700.00/200.00/100.00) lat (ms,95%): 9.00 err/s: 0.50 reconn/s: 2.00\n";
        let t = super::interval_totals(text);
        assert_eq!((t.queries, t.transactions, t.ignored_errors, t.reconnects), (4001, 200, 2, 4));
    }
}

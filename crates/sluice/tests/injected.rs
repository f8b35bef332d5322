//! Faults injected between sluice and a real MariaDB by the test harness's fault shim: delay,
//! stall, drop, reset, truncate and corrupt, in either direction, during the login, in the
//! middle of a result set and in the middle of LOAD DATA LOCAL. For each one the affected client
//! gets an error or a clean close (a hang would trip the test's bound), a session on the same
//! backend carries on, and nothing leaks: sessions, backend connections and file descriptors
//! return to what they were before the fault.

mod common;

use std::time::Duration;

use common::*;
use mysql_async::prelude::*;
use sluice_testkit::fault::{Action, Dir, Fault, FaultProxy, Trigger};

/// Long enough that only a hang reaches it; not a performance bound.
const HANG: Duration = Duration::from_secs(60);

/// A sluice whose one backend is the shared MariaDB reached through a fault shim. Pooling is
/// off: each fault is armed for the next new backend connection, and a login that reused a
/// pooled one would never meet it (tests/pool.rs covers pooled connections that fail).
struct Rig {
    shim: FaultProxy,
    s: SluiceProc,
    /// A session that must not notice other sessions' faults.
    other: mysql_async::Conn,
    /// The descriptors sluice held before the faults.
    fds: Vec<String>,
}

async fn rig() -> Rig {
    let db = shared_db();
    db.sql("CREATE DATABASE IF NOT EXISTS inj; CREATE TABLE IF NOT EXISTS inj.t (a INT, b VARCHAR(100))");
    let shim = FaultProxy::start(&db.addr());
    let cfg = TestConfig::new()
        .table("health", "interval = \"1h\"\n")
        .proxy("response_timeout = \"2s\"\nhandshake_timeout = \"3s\"\nconnect_timeout = \"2s\"\npool_idle_max = 0\n")
        .backend(&shim.addr())
        .text();
    let s = start_sluice_config(&cfg);
    let other = app(&s).await;
    let fds = fd_targets(&s);
    Rig { shim, s, other, fds }
}

impl Rig {
    /// After a fault: the other session still works, and sluice holds no more sessions,
    /// backend connections or descriptors than before. (The shim's own count is not used: a
    /// black hole keeps its half of a connection that sluice closed long ago.)
    async fn assert_clean(&mut self) {
        let one: Option<i32> = self.other.query_first("SELECT 1").await.expect("the other session is unaffected");
        assert_eq!(one, Some(1));
        wait_for("only the other session is left", || json(&admin_get(&self.s, "/sessions", None).1).as_array().unwrap().len() == 1);
        if !try_wait_for(|| fd_count(&self.s) == self.fds.len()) {
            let (_, sessions) = admin_get(&self.s, "/sessions", None);
            panic!(
                "descriptors are not back to where they were: before {:?}, now {:?}\nsessions: {sessions}\nlog:\n{}",
                self.fds,
                fd_targets(&self.s),
                self.s.log_text()
            );
        }
        let (_, m) = admin_get(&self.s, "/metrics", None);
        assert!(m.lines().any(|l| l.starts_with("sluice_backend_sessions{") && l.ends_with(" 1")), "{m}");
    }

    async fn client(&self) -> mysql_async::Conn {
        app(&self.s).await
    }
}

/// Whether the log shows `text` now.
fn s_log_has(r: &Rig, text: &str) -> bool {
    r.s.log_text().contains(text)
}

/// Runs `f` with the hang bound.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG, f).await.unwrap_or_else(|_| panic!("{what}: no answer (hang)"))
}

const BIG: &str = "SELECT /*big*/ REPEAT('x', 1000) FROM inj.seq_1_to_2000";

/// A fault in the middle of a 2 MB result set; returns what the client saw.
async fn mid_result(r: &Rig, action: Action) -> Result<usize, mysql_async::Error> {
    r.shim.arm(Fault::new(Trigger::Pattern(Dir::ToServer, b"/*big*/".to_vec()), Dir::ToClient, 300_000, action));
    let mut c = r.client().await;
    bounded("query during the fault", c.query::<Vec<u8>, _>(BIG)).await.map(|rows| rows.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_in_the_middle_of_a_result_set() {
    let mut r = rig().await;
    for action in [Action::Reset, Action::Truncate, Action::Stall, Action::Drop, Action::Corrupt(64)] {
        let fired = r.shim.fired();
        let got = mid_result(&r, action.clone()).await;
        assert!(r.shim.wait_fired(fired + 1, HANG), "{action:?} fired");
        match got {
            // Corrupting row bytes (not headers) cannot be seen by a proxy; the row count is
            // still right, so no data was lost.
            Ok(n) => assert!(matches!(action, Action::Corrupt(_)) && n == 2000, "{action:?}: the client got {n} rows and no error"),
            Err(e) => {
                let msg = e.to_string();
                eprintln!("{action:?}: {msg}");
            }
        }
        r.assert_clean().await;
    }
    // Headers corrupted: the response cannot be followed, and the session ends with an error.
    r.shim.arm(Fault::new(Trigger::Pattern(Dir::ToServer, b"/*big*/".to_vec()), Dir::ToClient, 0, Action::Corrupt(4)));
    let mut c = r.client().await;
    bounded("corrupt header", c.query::<Vec<u8>, _>(BIG)).await.expect_err("a corrupt header fails the query");
    r.assert_clean().await;
    // A slow link only slows the answer.
    r.shim.arm(Fault::new(Trigger::Pattern(Dir::ToServer, b"/*big*/".to_vec()), Dir::ToClient, 0, Action::Delay(Duration::from_millis(5))));
    let mut c = r.client().await;
    let rows = bounded("delayed", c.query::<String, _>(BIG)).await.expect("a delayed result arrives");
    assert_eq!(rows.len(), 2000);
    assert!(rows.iter().all(|x| x.len() == 1000));
    drop(c);
    r.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_backend_gets_an_error_within_response_timeout() {
    let mut r = rig().await;
    let got = mid_result(&r, Action::Stall).await;
    got.expect_err("a stalled response fails");
    // The client gets error 2013 when the stall falls between packets, else the connection is
    // closed; either way because the response timed out.
    wait_for("the response timeout is logged", || s_log_has(&r, "reading response: no progress for 2s"));
    r.assert_clean().await;
    // A request the backend stops reading (its receive window full) fails the same way.
    r.shim.arm(Fault::new(Trigger::Pattern(Dir::ToServer, b"/*long*/".to_vec()), Dir::ToServer, 0, Action::Stall));
    let mut c = r.client().await;
    let long = format!("SELECT /*long*/ LENGTH('{}')", "y".repeat(8 << 20));
    bounded("stalled request", c.query_drop(long)).await.expect_err("a request the backend does not read fails");
    r.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_during_the_login() {
    let mut r = rig().await;
    // Cut, reset or corrupted greeting; reset or stalled authentication exchange.
    let faults = [
        (Trigger::Start, Dir::ToClient, 20, Action::Truncate),
        (Trigger::Start, Dir::ToClient, 10, Action::Reset),
        (Trigger::Start, Dir::ToClient, 0, Action::Corrupt(8)),
        (Trigger::Pattern(Dir::ToServer, b"sluice_passthrough".to_vec()), Dir::ToServer, 0, Action::Reset),
        (Trigger::Pattern(Dir::ToServer, b"sluice_passthrough".to_vec()), Dir::ToClient, 0, Action::Stall),
        (Trigger::Pattern(Dir::ToServer, b"sluice_passthrough".to_vec()), Dir::ToClient, 0, Action::Drop),
    ];
    for (trigger, dir, after, action) in faults {
        let what = format!("{trigger:?} {dir:?} +{after} {action:?}");
        eprintln!("login fault: {what}");
        r.shim.arm(Fault::new(trigger, dir, after, action));
        let c = bounded(&what, mysql_async::Conn::new(mysql_async::Opts::from(opts(&r.s.listen, "app", "apppw")))).await;
        assert!(c.is_err(), "{what}: the login must fail");
        assert!(r.shim.wait_fired(1, HANG), "{what}: the fault fired");
        r.assert_clean().await;
    }
    // Logins work again once the faults are spent.
    let mut c = r.client().await;
    c.query_drop("SELECT 1").await.unwrap();
    drop(c);
    r.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_in_the_middle_of_load_data() {
    let mut r = rig().await;
    let file = sluice_testkit::mariadb::work_root().join(format!("inj-{}.csv", std::process::id()));
    let rows: String = (0..100_000).map(|i| format!("{i},row number {i}\n")).collect();
    std::fs::write(&file, rows).unwrap();
    let load = format!("LOAD DATA LOCAL INFILE '{}' INTO TABLE inj.t FIELDS TERMINATED BY ','", file.display());
    for action in [Action::Reset, Action::Truncate, Action::Stall] {
        r.shim.arm(Fault::new(Trigger::Pattern(Dir::ToServer, b"LOAD DATA".to_vec()), Dir::ToServer, 200_000, action.clone()));
        let port = r.s.port();
        let load = load.clone();
        let out = bounded("load data", tokio::task::spawn_blocking(move || cli(port, "app", "apppw", &["--local-infile=1"], &load)))
            .await
            .unwrap();
        assert!(out.is_err(), "{action:?}: LOAD DATA must fail, got {out:?}");
        r.assert_clean().await;
    }
    // Without a fault the same load works.
    let port = r.s.port();
    let out = tokio::task::spawn_blocking(move || cli(port, "app", "apppw", &["--local-infile=1"], &load)).await.unwrap();
    out.expect("LOAD DATA without a fault");
    r.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_host_that_resets_everything() {
    let mut r = rig().await;
    let mut busy = r.client().await;
    let mut idle = r.client().await;
    idle.query_drop("SELECT 1").await.unwrap();
    let q = tokio::spawn(async move { busy.query_drop("SELECT SLEEP(20)").await });
    wait_for("the query is running", || admin_get(&r.s, "/sessions", None).1.contains("\"busy\":true"));
    r.shim.reset_all();
    bounded("busy session", q).await.unwrap().expect_err("the running query fails");
    wait_for("every session is gone", || json(&admin_get(&r.s, "/sessions", None).1).as_array().unwrap().is_empty());
    idle.query_drop("SELECT 1").await.expect_err("the idle passthrough session was closed");
    // While the host refuses connections, logins fail with sluice's error naming the backend.
    r.shim.set_refuse(true);
    let e = mysql_async::Conn::new(mysql_async::Opts::from(opts(&r.s.listen, "app", "apppw"))).await.expect_err("no backend");
    assert!(e.to_string().contains("1105") || e.to_string().contains("no backend"), "{e}");
    r.shim.set_refuse(false);
    r.other = r.client().await;
    r.fds = fd_targets(&r.s);
    r.assert_clean().await;
}

//! Backends that are down or die, health fall and rise, graceful shutdown, limits and timeouts.

mod common;

use common::*;
use mysql_async::prelude::*;

/// A loopback address nothing listens on.
fn dead_addr() -> String {
    format!("127.0.0.1:{}", sluice_testkit::mariadb::free_port())
}

fn config(backends: &[String], proxy: &str) -> String {
    let c = TestConfig::new().table("health", "interval = \"100ms\"\ntimeout = \"500ms\"\nrise = 2\nfall = 2\n").proxy(proxy);
    backends.iter().fold(c, |c, b| c.backend(b)).text()
}

fn backend_up(s: &SluiceProc, addr: &str) -> Option<bool> {
    let (_, body) = admin_get(s, "/backends", None);
    json(&body).as_array()?.iter().find(|b| b["address"] == addr).and_then(|b| b["up"].as_bool())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_down_at_start_is_skipped_and_marked_down() {
    let db = shared_db();
    let dead = dead_addr();
    let s = start_sluice_config(&config(&[dead.clone(), db.addr()], "balance = \"round-robin\"\n"));
    // Every login succeeds: the unreachable backend is tried, fails before anything was sent,
    // and the next one is used.
    for _ in 0..6 {
        let mut c = app(&s).await;
        let one: Option<i32> = c.query_first("SELECT 1").await.unwrap();
        assert_eq!(one, Some(1));
        c.disconnect().await.unwrap();
    }
    wait_for("dead backend marked down", || backend_up(&s, &dead) == Some(false));
    let (_, body) = admin_get(&s, "/backends", None);
    let v = json(&body);
    let d = v.as_array().unwrap().iter().find(|b| b["address"] == dead.as_str()).unwrap();
    assert!(d["reason"].as_str().unwrap().contains("refused"), "{d}");
    assert_eq!(backend_up(&s, &db.addr()), Some(true));
}

#[test]
fn no_usable_backend_gives_an_error_naming_each_backend() {
    let dead1 = dead_addr();
    let dead2 = dead_addr();
    let s = start_sluice_config(&config(&[dead1.clone(), dead2.clone()], "connect_timeout = \"1s\"\n"));
    let e = cli(s.port(), "app", "apppw", &[], "SELECT 1").expect_err("no backend");
    assert!(e.contains("1105") && e.contains("no backend available"), "{e}");
    assert!(e.contains(&dead1) && e.contains(&dead2), "the error names every backend: {e}");
    assert!(e.contains("refused"), "and says why: {e}");
    let (code, body) = admin_get(&s, "/health", None);
    wait_for("health reports unavailable", || admin_get(&s, "/health", None).0 == 503);
    let _ = (code, body);
    let (_, metrics) = admin_get(&s, "/metrics", None);
    assert!(metrics.contains("sluice_rejected_connections_total{reason=\"no_backend\"} 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_killed_mid_session_fails_only_its_sessions() {
    let mut a = MariaDb::start();
    let b = MariaDb::start();
    let s = start_sluice_config(&config(&[a.addr(), b.addr()], "balance = \"round-robin\"\n"));
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(app(&s).await);
    }
    // Which backend each session is on, from the admin API.
    let (_, body) = admin_get(&s, "/sessions", None);
    let sessions = json(&body);
    let on_a: Vec<u32> = sessions
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["backend"] == a.addr().as_str())
        .map(|x| x["id"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(on_a.len(), 2, "round-robin put two of four sessions on each backend");
    let (mut victims, mut survivors): (Vec<_>, Vec<_>) = conns.into_iter().partition(|c| on_a.contains(&c.id()));
    // One victim is in the middle of a query when its backend dies.
    let mut busy = victims.pop().unwrap();
    let query = tokio::spawn(async move { busy.query_drop("SELECT SLEEP(30)").await });
    wait_for("query running", || admin_get(&s, "/sessions", None).1.contains("\"busy\":true"));
    a.kill();
    let r = query.await.unwrap();
    let e = r.expect_err("the query on the killed backend fails");
    assert!(e.to_string().contains("2013") || e.to_string().to_lowercase().contains("connection"), "{e}");
    // The idle victim's connection is closed, so its next statement fails as on a dead server
    // (drivers then reconnect), and the session is gone from sluice.
    let mut idle = victims.pop().unwrap();
    let idle_id = idle.id();
    wait_for("idle victim closed", || !admin_get(&s, "/sessions", None).1.contains(&format!("\"id\":{idle_id},")));
    idle.query_drop("SELECT 1").await.expect_err("idle session on the dead backend fails");
    // Sessions on the other backend are unaffected, and new sessions go to the survivor.
    for c in survivors.iter_mut() {
        let one: Option<i32> = c.query_first("SELECT 1").await.unwrap();
        assert_eq!(one, Some(1));
    }
    for _ in 0..4 {
        let mut c = app(&s).await;
        let port: Option<u16> = c.query_first("SELECT @@port").await.unwrap();
        assert_eq!(port, Some(b.port));
    }
    let (_, metrics) = admin_get(&s, "/metrics", None);
    assert!(metrics.contains("sluice_errors_total{side=\"backend\"}"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_falls_and_rises() {
    let mut db = MariaDb::start();
    let s = start_sluice_config(&config(&[db.addr()], ""));
    wait_for("backend up", || backend_up(&s, &db.addr()) == Some(true));
    db.stop();
    wait_for("backend down after fall failures", || backend_up(&s, &db.addr()) == Some(false));
    let (code, body) = admin_get(&s, "/health", None);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("no backend is up"), "{body}");
    let e = cli(s.port(), "app", "apppw", &[], "SELECT 1").expect_err("no backend while it is down");
    assert!(e.contains("down"), "{e}");
    db.restart();
    wait_for("backend up after rise successes", || backend_up(&s, &db.addr()) == Some(true));
    assert_eq!(cli(s.port(), "app", "apppw", &[], "SELECT 1").unwrap(), "1");
    assert!(s.log_shows("backend is down") && s.log_shows("backend is up again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_an_open_transaction_finish() {
    let db = shared_db();
    let mut s = start_sluice_config(&config(&[db.addr()], "shutdown_timeout = \"60s\"\n"));
    let mut tx = app(&s).await;
    fresh_db(&mut tx, "fault_drain").await;
    tx.query_drop("CREATE TABLE t (id INT)").await.unwrap();
    let mut idle = app(&s).await;
    tx.query_drop("BEGIN").await.unwrap();
    tx.query_drop("INSERT INTO t VALUES (1)").await.unwrap();
    s.signal("TERM");
    wait_for("health says draining", || admin_get(&s, "/health", None).1.contains("draining"));
    // The idle session is closed; new connections are refused.
    wait_for("idle session closed", || !admin_get(&s, "/sessions", None).1.contains(&format!("\"id\":{},", idle.id())));
    assert!(idle.query_drop("SELECT 1").await.is_err());
    assert!(cli(s.port(), "app", "apppw", &[], "SELECT 1").is_err());
    // The transaction finishes, then its session is closed and sluice exits.
    tx.query_drop("INSERT INTO t VALUES (2)").await.unwrap();
    tx.query_drop("COMMIT").await.unwrap();
    assert_eq!(s.wait_exit(std::time::Duration::from_secs(30)), Some(0), "sluice exits once drained");
    let n = db.sql("SELECT COUNT(*) FROM fault_drain.t");
    assert_eq!(n.trim(), "2", "the committed transaction is complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_gives_error_1040() {
    let db = shared_db();
    let s = start_sluice_config(&config(&[db.addr()], "max_connections = 2\n"));
    let a = app(&s).await;
    let b = app(&s).await;
    let e = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "app", "apppw"))).await.expect_err("refused");
    assert!(e.to_string().contains("1040"), "{e}");
    drop((a, b));
    wait_for("slots free", || admin_get(&s, "/sessions", None).1 == "[]");
    let mut c = app(&s).await;
    c.ping().await.unwrap();
    let (_, metrics) = admin_get(&s, "/metrics", None);
    assert!(metrics.contains("sluice_rejected_connections_total{reason=\"max_connections\"} 1"), "{metrics}");
}

#[test]
fn a_client_that_stalls_during_login_loses_its_slot() {
    let db = shared_db();
    let s = start_sluice_config(&config(&[db.addr()], "handshake_timeout = \"300ms\"\nmax_connections = 3\n"));
    let mut stalled: Vec<Raw> = (0..3).map(|_| Raw::connect(&s.listen)).collect();
    for r in stalled.iter_mut() {
        r.read_packet().expect("greeting");
    }
    // Each stalled client is disconnected, which frees the slots for real clients.
    for r in stalled.iter_mut() {
        assert!(r.is_closed(), "a stalled login is closed by sluice");
    }
    assert_eq!(cli(s.port(), "app", "apppw", &[], "SELECT 1").unwrap(), "1");
    let (_, metrics) = admin_get(&s, "/metrics", None);
    assert!(metrics.contains("sluice_rejected_connections_total{reason=\"handshake_timeout\"} 3"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_closed_after_idle_timeout() {
    let db = shared_db();
    let s = start_sluice_config(&config(&[db.addr()], "idle_timeout = \"300ms\"\n"));
    let mut c = app(&s).await;
    c.ping().await.unwrap();
    wait_for("idle session closed", || admin_get(&s, "/sessions", None).1 == "[]");
    assert!(c.query_drop("SELECT 1").await.is_err());
}

#[test]
fn a_command_larger_than_max_packet_size_is_refused() {
    let db = shared_db();
    let s = start_sluice_config(&config(&[db.addr()], "max_packet_size = 1048576\n"));
    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    let ok = r.query(&format!("SELECT LENGTH('{}')", "x".repeat(1000)));
    assert!(err_code(&ok[0]).is_none());
    let big = r.query(&format!("SELECT LENGTH('{}')", "x".repeat(2 << 20)));
    assert_eq!(err_code(&big[0]), Some(1153));
    assert!(r.is_closed());
    assert_eq!(cli(s.port(), "app", "apppw", &[], "SELECT 1").unwrap(), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_refuses_speaks_for_itself() {
    let db = MariaDb::start();
    db.sql("SET GLOBAL max_connections = 10"); // MariaDB's minimum
    let s = start_sluice_config(&config(&[db.addr()], ""));
    let mut held = Vec::new();
    // A user without admin privileges (those get an extra slot) fills every slot.
    loop {
        match mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "other", "otherpw"))).await {
            Ok(c) => held.push(c),
            Err(e) => {
                assert!(e.to_string().contains("1040") && e.to_string().contains("Too many connections"), "{e}");
                break;
            }
        }
        assert!(held.len() < 30, "the backend limit was never reached");
    }
    let e = cli(s.port(), "nopw", "", &[], "SELECT 1").expect_err("refused");
    assert!(e.contains("1040"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_closing_an_idle_session_closes_the_client() {
    let db = shared_db();
    let s = start_sluice_config(&config(&[db.addr()], ""));
    let mut c = app(&s).await;
    c.query_drop("SET SESSION wait_timeout = 1").await.unwrap();
    let id = c.id();
    wait_for("sluice closed the session", || !admin_get(&s, "/sessions", None).1.contains(&format!("\"id\":{id},")));
    assert!(c.query_drop("SELECT 1").await.is_err());
    // A fresh connection works.
    let mut d = app(&s).await;
    d.ping().await.unwrap();
}

#[test]
fn check_config_refuses_durations_that_would_overflow() {
    let path = sluice_testkit::mariadb::work_root().join(format!("overflow-{}.toml", std::process::id()));
    for (key, value) in
        [("idle_timeout", "\"1e20s\""), ("shutdown_timeout", "18446744073709551615"), ("handshake_timeout", "\"9999999999h\"")]
    {
        std::fs::write(&path, format!("[[backends]]\naddress = \"127.0.0.1:3306\"\n[proxy]\n{key} = {value}\n")).expect("write config");
        let out = std::process::Command::new(bin()).arg("check-config").arg(&path).output().expect("run check-config");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{key}: accepted");
        assert!(err.contains(&format!(":4: proxy.{key}: duration")) && err.contains("too long"), "{key}: {err}");
        assert!(!err.contains("panicked"), "{key}: {err}");
    }
}

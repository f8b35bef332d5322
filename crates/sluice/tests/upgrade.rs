//! Zero-downtime upgrade: the new binary gets the listening sockets, the old process stops
//! accepting and hands its sessions over with their connections and state (those it cannot,
//! TLS ones, it serves until they end). Under sysbench with a connect storm beside it: no
//! connection refused, no error, no reconnect, and the old process gone while sysbench runs.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use mysql_async::prelude::*;
use sluice_testkit::sysbench;

fn health(s: &SluiceProc) -> serde_json::Value {
    serde_json::from_str(&admin_get(s, "/health", None).1).unwrap()
}

fn pid(s: &SluiceProc) -> u64 {
    health(s)["pid"].as_u64().unwrap()
}

/// Ends a process this test started indirectly (the new sluice), however the test ends.
struct Reaper(u64);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").arg(self.0.to_string()).status();
    }
}

/// Logs in and out over and over from `threads` threads until stopped: (done, failed).
struct Storm {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Storm {
    fn start(addr: &str, threads: usize) -> Storm {
        let (stop, done, failed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let threads = (0..threads)
            .map(|_| {
                let (addr, stop, done, failed) = (addr.to_string(), stop.clone(), done.clone(), failed.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let ok = std::panic::catch_unwind(|| {
                            let mut r = Raw::login(&addr, "app", "apppw", None);
                            let rows = r.query("SELECT 1");
                            assert!(err_code(&rows[0]).is_none(), "SELECT 1 failed");
                            let _ = r.write_packet(0, &[sluice_proto::consts::com::QUIT]);
                        });
                        if ok.is_ok() { &done } else { &failed }.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Storm { stop, done, failed, threads }
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        (self.done.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

#[test]
fn an_upgrade_under_sysbench_and_a_connect_storm_refuses_nothing() {
    let db = MariaDb::start();
    sysbench::prepare(&db, 4, 10000);
    let path = config_path("upgrade");
    std::fs::write(&path, TestConfig::new().dbs(&[&db]).app_users().text()).unwrap();
    let mut s = start_sluice_file(&path);
    let old = pid(&s);
    let load = sysbench::start("oltp_read_write", &s.listen, 4, 10000, 16);
    wait_for("sysbench runs", || load.progress().transactions > 50);
    let storm = Storm::start(&s.listen, 4);
    wait_for("the storm runs", || storm.done() > 50);

    let t0 = std::time::Instant::now();
    let (code, body) = admin_post(&s, "/upgrade");
    let took = t0.elapsed();
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let new = answer["new_pid"].as_u64().unwrap();
    let _reaper = Reaper(new);
    assert_ne!(new, old);
    wait_for("the admin API is the new process's", || pid(&s) == new);
    // Every sysbench session goes over at its next wait for a command, its transaction open or
    // not: the old process has none left and ends while sysbench runs on.
    assert_eq!(s.wait_exit(std::time::Duration::from_secs(60)), Some(0), "the old process exits once it handed its sessions over");
    let gone = t0.elapsed();
    assert!(s.log_shows("the last session of the old process ended"));
    let (before, t) = (storm.done(), load.progress().transactions);
    wait_for("new connections go to the new process", || storm.done() > before + 100);
    wait_for("sysbench goes on", || load.progress().transactions > t + 100);
    let adopted = metric(&s, "sluice_sessions_adopted_total");
    assert!(adopted >= 16, "the new process took over the 16 sysbench sessions: {adopted}");
    let (connections, failed) = storm.stop();
    let (totals, text) = load.stop();
    let tail: String = text.lines().rev().take(5).collect::<Vec<_>>().join("\n");
    let deadlocks: u64 =
        db.sql("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").split_whitespace().last().and_then(|v| v.parse().ok()).unwrap();
    eprintln!(
        "upgrade under load: hand-over answered in {took:?}, old process gone after {gone:?} with {adopted} sessions handed over; storm {connections} logins, {failed} failed; sysbench {} transactions, {} errors ({deadlocks} deadlocks on the server), {} reconnects",
        totals.transactions, totals.ignored_errors, totals.reconnects
    );
    assert_eq!(failed, 0, "no login refused or failed");
    assert!(totals.success, "sysbench ran throughout: {tail}");
    assert!(totals.ignored_errors <= deadlocks, "sysbench saw {} errors: {tail}", totals.ignored_errors);
    assert_eq!(totals.reconnects, 0, "{tail}");
}

fn session_ids(s: &SluiceProc) -> Vec<u64> {
    json(&admin_get(s, "/sessions", None).1).as_array().unwrap().iter().map(|x| x["id"].as_u64().unwrap()).collect()
}

/// A session goes over with everything it had: its connection id, its backend connection
/// (the same server thread: user variables, temporary tables and an open transaction are still
/// there), its prepared statements, its compression. A TLS session stays in the old process,
/// which ends when it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_go_over_with_their_connections_and_state() {
    let db = shared_db();
    let path = config_path("upgrade-handoff");
    std::fs::write(&path, TestConfig::new().dbs(&[db]).app_users().text()).unwrap();
    let mut s = start_sluice_file(&path);
    let mut c = app(&s).await;
    fresh_db(&mut c, "upgrade_handoff").await;
    c.query_drop("CREATE TABLE t (a INT PRIMARY KEY)").await.unwrap();
    c.query_drop("SET @v = 42").await.unwrap();
    c.query_drop("CREATE TEMPORARY TABLE tmp (b INT)").await.unwrap();
    c.query_drop("INSERT INTO tmp VALUES (7)").await.unwrap();
    let stmt = c.prep("SELECT ? + 1").await.unwrap();
    assert_eq!(c.exec_first::<i64, _, _>(&stmt, (1,)).await.unwrap(), Some(2));
    c.query_drop("START TRANSACTION").await.unwrap();
    c.query_drop("INSERT INTO t VALUES (1)").await.unwrap();
    let thread: Option<u64> = c.query_first("SELECT CONNECTION_ID()").await.unwrap();
    let mut z =
        mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "app", "apppw").compression(mysql_async::Compression::fast())))
            .await
            .unwrap();
    assert_eq!(z.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));
    let mut tls = mysql_async::Conn::new(mysql_async::Opts::from(tls_opts(&s.listen, "app", "apppw"))).await.unwrap();
    let (ids, tls_id) = ([c.id() as u64, z.id() as u64], tls.id() as u64);
    let listed = json(&admin_get(&s, "/sessions", None).1);
    let tls_info = listed.as_array().unwrap().iter().find(|x| x["id"] == tls_id).unwrap().clone();
    assert_eq!(tls_info["tls"], true, "{tls_info}");

    let (code, body) = admin_post(&s, "/upgrade");
    assert_eq!(code, 200, "{body}");
    let new = json(&body)["new_pid"].as_u64().unwrap();
    let _reaper = Reaper(new);
    wait_for("the admin API is the new process's", || pid(&s) == new);
    wait_for("the plain sessions are the new process's", || {
        let here = session_ids(&s);
        ids.iter().all(|id| here.contains(id))
    });
    assert!(!session_ids(&s).contains(&tls_id), "the TLS session stays in the old process");
    assert_eq!(metric(&s, "sluice_sessions_adopted_total"), 2);

    assert_eq!(c.query_first::<i64, _>("SELECT @v").await.unwrap(), Some(42));
    assert_eq!(c.query_first::<u64, _>("SELECT CONNECTION_ID()").await.unwrap(), thread, "the same backend connection");
    assert_eq!(c.query_first::<i64, _>("SELECT b FROM tmp").await.unwrap(), Some(7));
    assert_eq!(c.exec_first::<i64, _, _>(&stmt, (5,)).await.unwrap(), Some(6));
    assert_eq!(c.query_first::<i64, _>("SELECT COUNT(*) FROM t").await.unwrap(), Some(1), "the transaction goes on");
    c.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(c.query_first::<i64, _>("SELECT COUNT(*) FROM t").await.unwrap(), Some(0), "and rolls back");
    assert_eq!(z.query_first::<u32, _>("SELECT 2").await.unwrap(), Some(2));
    let row: Option<(String, u64)> =
        c.query_first(format!("SELECT user, id FROM information_schema.processlist WHERE id = {}", thread.unwrap())).await.unwrap();
    assert_eq!(row.map(|r| r.0), Some("app".to_string()));

    // The TLS session is served by the old process until it ends; then the old process ends.
    assert_eq!(tls.query_first::<u32, _>("SELECT 3").await.unwrap(), Some(3));
    assert!(s.running());
    tls.disconnect().await.unwrap();
    assert_eq!(s.wait_exit(std::time::Duration::from_secs(60)), Some(0), "the old process exits once its last session ended");
    assert_eq!(c.query_first::<u32, _>("SELECT 4").await.unwrap(), Some(4));
    for c in [c, z] {
        c.disconnect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upgrade_changes_nothing_and_a_second_one_succeeds() {
    let db = shared_db();
    let path = config_path("upgrade-fail");
    let cfg = TestConfig::new().dbs(&[db]).app_users().text();
    std::fs::write(&path, &cfg).unwrap();
    let s = start_sluice_file(&path);
    let old = pid(&s);
    let mut c = app(&s).await;

    // A new process that cannot start (its configuration is bad) leaves the old one as it was.
    std::fs::write(&path, cfg.clone() + "[proxy]\nmax_connections = \"many\"\n").unwrap();
    let (code, body) = admin_post(&s, "/upgrade");
    assert_eq!(code, 500, "{body}");
    assert_eq!(pid(&s), old);
    assert_eq!(c.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));
    let mut c2 = app(&s).await;
    assert_eq!(c2.query_first::<u32, _>("SELECT 2").await.unwrap(), Some(2));

    // With the file mended, `sluice ctl upgrade` does it; the open sessions go on (handed over).
    std::fs::write(&path, &cfg).unwrap();
    let out =
        std::process::Command::new(bin()).args(["ctl", "--admin", s.admin.as_deref().unwrap(), "--json", "upgrade"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let _reaper = Reaper(answer["new_pid"].as_u64().unwrap());
    assert_eq!(pid(&s), answer["new_pid"].as_u64().unwrap());
    assert_eq!(c.query_first::<u32, _>("SELECT 3").await.unwrap(), Some(3));
    let mut c3 = app(&s).await;
    assert_eq!(c3.query_first::<u32, _>("SELECT 4").await.unwrap(), Some(4));
    for c in [c, c2, c3] {
        c.disconnect().await.unwrap();
    }
}

/// Multiplexed sessions hold no backend connection between statements and wait parked: they go
/// over with their state alone (user variables, prepared statements), which the new process
/// brings to whichever connection they take next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_multiplexed_sessions_go_over_too() {
    let db = shared_db();
    let path = config_path("upgrade-handoff-mux");
    let cfg = TestConfig::new().dbs(&[db]).app_users().proxy("multiplex = true\npark_every_command = true\n").text();
    std::fs::write(&path, cfg).unwrap();
    let mut s = start_sluice_file(&path);
    let mut c = app(&s).await;
    c.query_drop("SET @w = 'kept'").await.unwrap();
    let stmt = c.prep("SELECT CONCAT(?, @w)").await.unwrap();
    assert_eq!(c.exec_first::<String, _, _>(&stmt, ("a",)).await.unwrap().as_deref(), Some("akept"));
    wait_for("the session parks", || metric(&s, "sluice_parked_sessions") == 1);

    let (code, body) = admin_post(&s, "/upgrade");
    assert_eq!(code, 200, "{body}");
    let _reaper = Reaper(json(&body)["new_pid"].as_u64().unwrap());
    assert_eq!(s.wait_exit(std::time::Duration::from_secs(60)), Some(0), "the old process hands its one session over and ends");
    assert_eq!(session_ids(&s), [c.id() as u64]);
    assert_eq!(c.exec_first::<String, _, _>(&stmt, ("b",)).await.unwrap().as_deref(), Some("bkept"));
    assert_eq!(c.query_first::<String, _>("SELECT @w").await.unwrap().as_deref(), Some("kept"));
    c.disconnect().await.unwrap();
}

/// With `upgrade_drain_after`, a session that cannot go over (TLS) finishes its transaction in
/// the old process and is then closed there, and the old process ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_left_behind_finish_their_transaction_then_close() {
    let db = shared_db();
    let path = config_path("upgrade-drain-after");
    std::fs::write(&path, TestConfig::new().dbs(&[db]).app_users().proxy("upgrade_drain_after = \"300ms\"\n").text()).unwrap();
    let mut s = start_sluice_file(&path);
    let mut c = app(&s).await;
    fresh_db(&mut c, "upgrade_drain_after").await;
    c.query_drop("CREATE TABLE t (a INT PRIMARY KEY)").await.unwrap();
    let mut tls = mysql_async::Conn::new(mysql_async::Opts::from(tls_opts(&s.listen, "app", "apppw").db_name(Some("upgrade_drain_after"))))
        .await
        .unwrap();
    tls.query_drop("START TRANSACTION").await.unwrap();
    tls.query_drop("INSERT INTO t VALUES (1)").await.unwrap();

    let (code, body) = admin_post(&s, "/upgrade");
    assert_eq!(code, 200, "{body}");
    let _reaper = Reaper(json(&body)["new_pid"].as_u64().unwrap());
    wait_for("the old process drains what it kept", || s.log_text().contains("upgrade_drain_after passed"));
    // Inside its transaction the session goes on; at its end it is closed.
    tls.query_drop("INSERT INTO t VALUES (2)").await.unwrap();
    tls.query_drop("COMMIT").await.unwrap();
    assert_eq!(s.wait_exit(std::time::Duration::from_secs(60)), Some(0), "the old process ends with its last session");
    assert!(tls.query_drop("SELECT 1").await.is_err(), "the session was closed after its transaction");
    assert_eq!(c.query_first::<i64, _>("SELECT COUNT(*) FROM t").await.unwrap(), Some(2), "what it committed is there");
    c.disconnect().await.unwrap();
}

/// A capture running when the process upgrades ends there, whole, saying so (`ended_by`); the
/// new process starts idle. A capture running at a shutdown ends whole too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_capture_ends_whole_at_an_upgrade_and_at_a_shutdown() {
    let db = shared_db();
    let path = config_path("upgrade-capture");
    std::fs::write(&path, TestConfig::new().dbs(&[db]).app_users().text()).unwrap();
    let s = start_sluice_file(&path);
    let mut c = app(&s).await;
    let (code, text) = admin_post_json(&s, "/capture/start", &serde_json::json!({ "name": "across" }));
    assert_eq!(code, 201, "{text}");
    c.query_drop("SELECT 'before the upgrade'").await.unwrap();
    let (code, body) = admin_post(&s, "/upgrade");
    assert_eq!(code, 200, "{body}");
    let _reaper = Reaper(json(&body)["new_pid"].as_u64().unwrap());
    let meta = json(&std::fs::read_to_string(s.dir.join("captures/across/meta.json")).unwrap());
    assert_eq!((meta["state"].as_str(), meta["ended_by"].as_str()), (Some("done"), Some("upgrade")), "{meta:#}");
    assert!(meta["ended_at_ms"].as_u64().is_some(), "{meta:#}");
    assert_eq!(json(&admin_get(&s, "/capture", None).1)["state"], "idle", "the new process runs no capture");
    assert_eq!(c.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));

    let (code, text) = admin_post_json(&s, "/capture/start", &serde_json::json!({ "name": "to-the-end" }));
    assert_eq!(code, 201, "{text}");
    c.query_drop("SELECT 'before the shutdown'").await.unwrap();
    c.disconnect().await.unwrap();
    std::process::Command::new("kill").args(["-TERM", &json(&body)["new_pid"].to_string()]).status().unwrap();
    let meta_path = s.dir.join("captures/to-the-end/meta.json");
    wait_for("the capture's end is written", || {
        std::fs::read_to_string(&meta_path).is_ok_and(|t| t.contains("\"ended_by\": \"shutdown\""))
    });
    let meta = json(&std::fs::read_to_string(&meta_path).unwrap());
    assert_eq!(meta["state"], "done", "{meta:#}");
}

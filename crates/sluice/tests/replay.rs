//! Capture through sluice in front of one real server, replay against others made as the first
//! was when the capture started: the report finds no difference against a faithful copy, and
//! against a copy with one change it names exactly the statements that change affects.

mod common;

use std::collections::BTreeSet;

use common::*;
use mysql_async::prelude::*;

const SETUP: &str = "CREATE DATABASE rp; CREATE TABLE rp.t (id INT PRIMARY KEY, v VARCHAR(20), k INT, KEY k (k)); \
    INSERT INTO rp.t SELECT seq, CONCAT('v', seq), seq % 5 FROM rp.seq_1_to_50";

/// A server with the data as it was when the capture started, then `change`.
fn target(change: &str) -> MariaDb {
    let db = MariaDb::start();
    db.sql(SETUP);
    if !change.is_empty() {
        db.sql(change);
    }
    db
}

/// Replays `dir` against `db`; the report's JSON.
fn replay(dir: &std::path::Path, db: &MariaDb, name: &str) -> serde_json::Value {
    let report = dir.with_extension(format!("report-{name}"));
    let out = std::process::Command::new(bin())
        .args(["replay", "--input"])
        .arg(dir)
        .args(["--target", &db.addr(), "--user", "app", "--password", "apppw", "--speed", "1", "--report"])
        .arg(&report)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.contains("## Statements whose results differ") && md.contains("(latency.png)"), "{md}");
    for png in ["latency.png", "totals.png"] {
        assert!(std::fs::read(report.join(png)).unwrap().starts_with(b"\x89PNG\r\n"), "{png} is a PNG image");
    }
    json(&std::fs::read_to_string(report.join("report.json")).unwrap())
}

fn digest(sql: &str) -> String {
    let mut out = Vec::new();
    sluice_proto::digest::normalize(sql.as_bytes(), &mut out, 300);
    String::from_utf8(out).unwrap()
}

fn differing(r: &serde_json::Value) -> BTreeSet<String> {
    r["differences"].as_array().unwrap().iter().map(|g| g["digest"].as_str().unwrap().to_string()).collect()
}

/// The workload of the change test, captured through `s`: a session opened before the capture
/// (a schema, a prepared statement, and in users mode a user variable, which only users mode
/// follows), one during it.
async fn capture_workload(s: &SluiceProc, users: bool) -> std::path::PathBuf {
    let mut before = connect(&s.listen, "app", "apppw").await;
    before.query_drop("USE rp").await.unwrap();
    let by_id = before.prep("SELECT v FROM t WHERE id = ?").await.unwrap();
    let _: Option<String> = before.exec_first(&by_id, (1,)).await.unwrap();
    if users {
        before.query_drop("SET @mark = 'kept'").await.unwrap();
    }

    let name = format!("replay-{}", sluice_testkit::unique_id());
    let (code, text) = admin_post_json(s, "/capture/start", &serde_json::json!({ "name": name }));
    assert_eq!(code, 201, "{text}");
    let dir = std::path::PathBuf::from(json(&text)["dir"].as_str().unwrap());

    let _: Option<String> = before.exec_first(&by_id, (5,)).await.unwrap();
    before.query_drop("SELECT id, v FROM t ORDER BY id").await.unwrap();
    before.query_drop("SELECT id, v FROM t WHERE id > 40").await.unwrap();
    before.query_drop("UPDATE t SET v = 'seven' WHERE id = 7").await.unwrap();
    before.query_drop("SELECT v FROM t FORCE INDEX (k) WHERE k = 3").await.unwrap();
    before.query_drop("SELECT k, COUNT(*) FROM t GROUP BY k ORDER BY k").await.unwrap();
    before.query_drop("SELECT k, v FROM t WHERE id < 3 GROUP BY k ORDER BY k").await.unwrap();
    if users {
        before.query_drop("SELECT @mark").await.unwrap();
    }
    // (Replay keeps the captured times: sessions apart by this much keep their order.)
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut during = connect(&s.listen, "app", "apppw").await;
    during.query_drop("INSERT INTO rp.t VALUES (1000, 'new', 1)").await.unwrap();
    during.query_drop("SELECT COUNT(*) FROM rp.t").await.unwrap();
    during.query_drop("SELECT * FROM rp.nope").await.expect_err("no such table");
    during.disconnect().await.unwrap();
    before.disconnect().await.unwrap();
    wait_for("the sessions ended", || json(&admin_get(s, "/sessions", None).1).as_array().unwrap().is_empty());
    let (code, text) = admin_post(s, "/capture/stop");
    assert_eq!(code, 200, "{text}");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_finds_no_difference_on_a_faithful_copy_and_names_what_each_change_affects() {
    // In passthrough, and in users mode with multiplexing (statement ids mapped, user
    // variables carried).
    for users in [false, true] {
        let source = MariaDb::start();
        source.sql(SETUP);
        let s = if users {
            TestConfig::new().proxy("multiplex = true\n").dbs(&[&source]).app_users().start()
        } else {
            start_sluice(&[&source], &[])
        };
        let dir = capture_workload(&s, users).await;
        check_replays(&dir, users);
    }
}

/// Replays `dir` against a faithful copy and against copies with one change each.
fn check_replays(dir: &std::path::Path, users: bool) {
    let mode = if users { "users mode" } else { "passthrough" };
    let dir = dir.to_path_buf();
    // A faithful copy: every command replayed gives what it gave.
    let r = replay(&dir, &target(""), "same");
    assert_eq!(r["differing"], 0, "{mode}: {r:#}");
    assert!(r["replayed"].as_u64().unwrap() >= 10, "{mode}: {r:#}");
    assert_eq!(r["replay_errors"], 1, "{mode}: the missing table, as captured: {r:#}");
    assert!(r["skipped"].as_object().unwrap().is_empty(), "{mode}: {r:#}");

    // One change each: the report names exactly the statements it affects.
    for (change, affected) in [
        ("UPDATE rp.t SET v = 'changed' WHERE id = 5", &["SELECT v FROM t WHERE id = ?", "SELECT id, v FROM t ORDER BY id"][..]),
        ("ALTER TABLE rp.t DROP INDEX k", &["SELECT v FROM t FORCE INDEX (k) WHERE k = 3"][..]),
        ("SET GLOBAL sql_mode = 'ONLY_FULL_GROUP_BY'", &["SELECT k, v FROM t WHERE id < 3 GROUP BY k ORDER BY k"][..]),
    ] {
        let r = replay(&dir, &target(change), "changed");
        let want: BTreeSet<String> = affected.iter().map(|s| digest(s)).collect();
        assert_eq!(differing(&r), want, "{mode}, after {change}: {r:#}");
    }
}

/// Copies database `name` of `from` into `to` (a dump and a load, as root over the sockets).
fn copy_database(from: &MariaDb, to: &MariaDb, name: &str) {
    let dump = std::process::Command::new("mariadb-dump")
        .arg(format!("--socket={}", from.socket.display()))
        .args(["-uroot", "--single-transaction", "--databases", name])
        .output()
        .expect("run mariadb-dump");
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    let mut load = std::process::Command::new("mariadb")
        .arg(format!("--socket={}", to.socket.display()))
        .arg("-uroot")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run mariadb");
    std::io::Write::write_all(load.stdin.as_mut().unwrap(), &dump.stdout).unwrap();
    drop(load.stdin.take());
    assert!(load.wait().unwrap().success(), "loading the copy");
}

/// sysbench oltp_read_write, 16 threads, through sluice; a capture started at a consistent
/// point (sessions held at its gate while the data is copied), 30 seconds long, replayed against
/// the copy. Every command is replayed, in every session, and no result differs. (A read whose
/// snapshot was taken while another session's commit was under way in the capture may see the
/// commit or not: the capture cannot say which the server chose. Those are counted apart, and
/// are few. A replay that let conflicting transactions take their locks in another order, or
/// lost the data's state, a session's state or the order of commands, would differ in many
/// more, outside them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_seconds_of_sysbench_captured_from_a_consistent_start_replay_whole_on_a_copy() {
    use sluice_testkit::sysbench;
    let source = MariaDb::start();
    sysbench::prepare(&source, 2, 10_000);
    let s = start_sluice(&[&source], &[]);
    let load = sysbench::start("oltp_read_write", &s.listen, 2, 10_000, 16);
    wait_for("sysbench runs", || load.progress().queries > 1000);

    let (code, text) =
        admin_post_json(&s, "/capture/start", &serde_json::json!({ "name": "sysbench", "consistent": true, "duration": "30s" }));
    assert_eq!(code, 201, "{text}");
    let dir = std::path::PathBuf::from(json(&text)["dir"].as_str().unwrap());
    assert_eq!(json(&text)["state"], "gated", "{text}");
    let copy = MariaDb::start();
    copy_database(&source, &copy, "sbtest");
    let (code, text) = admin_post(&s, "/capture/open");
    assert_eq!(code, 200, "{text}");
    wait_for("the capture ended", || json(&admin_get(&s, "/capture", None).1)["state"] == "done");
    let (totals, _) = load.stop();
    let status = json(&admin_get(&s, "/capture", None).1);
    assert_eq!(status["dropped_records"], 0, "{status}");
    assert!(status["sessions"].as_u64().unwrap() >= 16, "{status}");

    let r = replay(&dir, &copy, "sysbench");
    let (same, order_dependent) = (r["same"].as_u64().unwrap(), r["order_dependent"].as_u64().unwrap());
    let compared = same + order_dependent + r["differing"].as_u64().unwrap();
    assert!(compared > 10_000, "{compared} commands compared ({totals:?}): {r:#}");
    assert!(r["skipped"].as_object().unwrap().is_empty(), "{r:#}");
    assert_eq!(r["sessions"].as_u64(), status["sessions"].as_u64(), "{r:#}");
    let differing = r["differing"].as_u64().unwrap();
    assert_eq!(differing, 0, "{differing} of {compared} results differ: {:#}", r["differences"]);
    assert!(order_dependent * 20 < compared, "{order_dependent} of {compared} differ by order: {:#}", r["order_differences"]);
    eprintln!(
        "{differing} of {compared} results differ, and {order_dependent} where the order decides; {} order waits cut short, {} \
         commands run again with their transaction",
        r["order_waits_cut"], r["retried"]
    );
}

//! Moving live sessions: on request (`POST /sessions/{id}/move`) and by draining a backend
//! (`POST /backends/{name}/drain`, `undrain`). The two backends are one MariaDB server reached
//! by two addresses (TCP and its Unix socket), so that the data is the same on both.

mod common;

use common::*;
use mysql_async::prelude::*;

/// Users mode in front of `db` as backends "tcp" and "sock", with `proxy` keys added.
fn two_addresses(db: &MariaDb, proxy: &str, users: bool) -> SluiceProc {
    let socket = db.socket.display().to_string();
    let c = TestConfig::new()
        .proxy(&format!("balance = \"round-robin\"\n{proxy}"))
        .backend_with(&db.addr(), "name = \"tcp\"\n")
        .backend_with(&socket, "name = \"sock\"\n");
    if users { c.app_users().start() } else { c.start() }
}

/// The backend sluice shows for session `id`.
fn backend_of(s: &SluiceProc, id: u32) -> String {
    let (_, body) = admin_get(s, "/sessions", None);
    let all = json(&body);
    let me = all.as_array().unwrap().iter().find(|x| x["id"] == id).unwrap_or_else(|| panic!("no session {id}: {body}"));
    me["backend"].as_str().unwrap_or_default().to_string()
}

/// The sessions sluice counts on backend `name`.
fn sessions_on(s: &SluiceProc, name: &str) -> u64 {
    let (_, body) = admin_get(s, "/backends", None);
    json(&body).as_array().unwrap().iter().find(|b| b["name"] == name).map(|b| b["sessions"].as_u64().unwrap()).unwrap()
}

async fn state_of(c: &mut mysql_async::Conn) -> (Option<String>, String, String) {
    c.query_first("SELECT DATABASE(), @@time_zone, @@sql_mode").await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moves_on_request_with_its_state_after_its_transaction() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE mv; CREATE TABLE mv.t (id INT PRIMARY KEY, v VARCHAR(10)); INSERT INTO mv.t VALUES (1, 'one')");
    let s = two_addresses(&db, "", true);
    let mut c = app(&s).await;
    let id = c.id();
    c.query_drop("USE mv").await.unwrap();
    c.query_drop("SET time_zone = '+05:00', sql_mode = 'ANSI_QUOTES'").await.unwrap();
    // User variables: read back from the old connection when the session moves.
    c.query_drop("SET @greeting = 'hello', @n = 42").await.unwrap();
    let stmt = c.prep("SELECT v FROM t WHERE id = ?").await.unwrap();
    let before = state_of(&mut c).await;
    let thread_before: u64 = c.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap();
    let from = backend_of(&s, id);
    let to = if from == "tcp" { "sock" } else { "tcp" };

    // Asked inside a transaction, the move waits for its end.
    c.query_drop("BEGIN").await.unwrap();
    c.query_drop("UPDATE t SET v = 'uno' WHERE id = 1").await.unwrap();
    let (code, body) = admin_post(&s, &format!("/sessions/{id}/move?to={to}"));
    assert_eq!(code, 202, "{body}");
    assert!(body.contains("transaction"), "the answer shows what holds the session: {body}");
    let v: Option<String> = c.exec_first(&stmt, (1,)).await.unwrap();
    assert_eq!(v.as_deref(), Some("uno"), "the transaction goes on where it began");
    assert_eq!(backend_of(&s, id), from);
    c.query_drop("COMMIT").await.unwrap();
    wait_for("the session moved", || backend_of(&s, id) == to);

    // Everything it had came along; the client's statement still works.
    assert_eq!(state_of(&mut c).await, before);
    let vars: Option<(String, i64)> = c.query_first("SELECT @greeting, @n").await.unwrap();
    assert_eq!(vars, Some(("hello".to_string(), 42)));
    let thread_after: u64 = c.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap();
    assert_ne!(thread_after, thread_before, "a new backend connection");
    let v: Option<String> = c.exec_first(&stmt, (1,)).await.unwrap();
    assert_eq!(v.as_deref(), Some("uno"));
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"request\",result=\"moved\"}"), 1);

    // Unknown targets are refused.
    assert_eq!(admin_post(&s, &format!("/sessions/{id}/move?to=nowhere")).0, 404);
    assert_eq!(admin_post(&s, "/sessions/999999/move").0, 404);
}

/// Drain and undrain with `sessions` sessions, multiplexed or not.
async fn drain_and_undrain(multiplex: bool) {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE dr");
    let s = two_addresses(&db, &format!("multiplex = {multiplex}\n"), true);
    let mut sessions = Vec::new();
    for i in 0..8 {
        let mut c = app(&s).await;
        c.query_drop("USE dr").await.unwrap();
        c.query_drop(format!("SET time_zone = '+0{i}:00'")).await.unwrap();
        sessions.push(c);
    }
    assert_eq!((sessions_on(&s, "tcp"), sessions_on(&s, "sock")), (4, 4));
    // One is inside a transaction when the drain begins.
    sessions[0].query_drop("BEGIN").await.unwrap();
    let on_tcp_in_trx = backend_of(&s, sessions[0].id()) == "tcp";
    let (code, body) = admin_post(&s, "/backends/tcp/drain");
    assert_eq!(code, 202, "{body}");
    if on_tcp_in_trx {
        // Every session but the one in its transaction leaves at once.
        wait_for("idle sessions leave the drained backend", || sessions_on(&s, "tcp") == 1);
        sessions[0].query_drop("COMMIT").await.unwrap();
    } else {
        sessions[0].query_drop("COMMIT").await.unwrap();
    }
    wait_for("every session left", || sessions_on(&s, "tcp") == 0);
    let (_, body) = admin_get(&s, "/backends", None);
    assert!(body.contains("\"draining\":true"), "{body}");
    // Each kept its state; new sessions go to the other backend only.
    for (i, c) in sessions.iter_mut().enumerate() {
        assert_eq!(state_of(c).await.1, format!("+0{i}:00"));
        assert_eq!(backend_of(&s, c.id()), "sock");
    }
    let fresh = app(&s).await;
    assert_eq!(backend_of(&s, fresh.id()), "sock");
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"drain\",result=\"moved\"}"), 4);

    // Undrained, the backend takes new sessions again.
    assert_eq!(admin_post(&s, "/backends/tcp/undrain").0, 200);
    let mut on_tcp = 0;
    for _ in 0..4 {
        let c = app(&s).await;
        on_tcp += usize::from(backend_of(&s, c.id()) == "tcp");
        sessions.push(c);
    }
    assert!(on_tcp >= 2, "new sessions reach the undrained backend ({on_tcp} of 4)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_every_session_at_its_next_safe_point() {
    drain_and_undrain(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_multiplexed_sessions_too() {
    drain_and_undrain(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_sessions_close_at_a_safe_point_after_drain_timeout() {
    let db = MariaDb::start();
    let s = two_addresses(&db, "drain_timeout = \"1s\"\n", false);
    let mut on_tcp = Vec::new();
    while on_tcp.len() < 2 {
        let c = connect(&s.listen, "app", "apppw").await;
        if backend_of(&s, c.id()) == "tcp" {
            on_tcp.push(c);
        }
    }
    let mut in_trx = on_tcp.pop().unwrap();
    let mut idle = on_tcp.pop().unwrap();
    in_trx.query_drop("BEGIN").await.unwrap();
    assert_eq!(admin_post(&s, "/backends/tcp/drain").0, 202);
    // Before drain_timeout nothing happens to them.
    let one: Option<i64> = idle.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    wait_for("the idle session is closed", || sessions_on(&s, "tcp") == 1);
    assert!(idle.query_drop("SELECT 1").await.is_err(), "the idle session was closed");
    // The one in a transaction finishes it; at its next safe point it is closed too.
    in_trx.query_drop("SELECT 1").await.unwrap();
    in_trx.query_drop("COMMIT").await.unwrap();
    wait_for("the last session is closed", || sessions_on(&s, "tcp") == 0);
}

/// POST /backends with a JSON body.
fn add_backend(s: &SluiceProc, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut t = std::net::TcpStream::connect(s.admin.as_ref().unwrap()).unwrap();
    write!(
        t,
        "POST /backends HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    t.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn admin_delete(s: &SluiceProc, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut t = std::net::TcpStream::connect(s.admin.as_ref().unwrap()).unwrap();
    write!(
        t,
        "DELETE {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    )
    .unwrap();
    let mut out = String::new();
    t.read_to_string(&mut out).unwrap();
    out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn backend_names(s: &SluiceProc) -> Vec<String> {
    let (_, body) = admin_get(s, "/backends", None);
    json(&body).as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_added_at_run_time_takes_its_share_and_leaves_when_removed() {
    let db = MariaDb::start();
    let s = TestConfig::new()
        .proxy("balance = \"round-robin\"\nrebalance_interval = \"1h\"\n")
        .backend_with(&db.addr(), "name = \"tcp\"\n")
        .app_users()
        .start();
    let mut sessions = Vec::new();
    for i in 0..8 {
        let mut c = app(&s).await;
        c.query_drop(format!("SET time_zone = '+0{i}:00'")).await.unwrap();
        sessions.push(c);
    }
    // One of them is pinned (a temporary table) and cannot move.
    sessions[0].query_drop("CREATE TEMPORARY TABLE test.pinned (x INT)").await.unwrap();
    let socket = db.socket.display().to_string();
    let (code, body) = add_backend(&s, &format!("{{\"address\": \"{socket}\", \"name\": \"sock\"}}"));
    assert_eq!(code, 201, "{body}");
    assert_eq!(add_backend(&s, &format!("{{\"address\": \"{socket}\", \"name\": \"sock\"}}")).0, 409, "names are unique");
    assert_eq!(add_backend(&s, "{\"address\": \"not an address\"}").0, 400);
    // The rebalancer moves four of the seven that can move; each at most once.
    wait_for("the new backend takes its share", || sessions_on(&s, "sock") == 4);
    for (i, c) in sessions.iter_mut().enumerate() {
        assert_eq!(state_of(c).await.1, format!("+0{i}:00"));
    }
    assert_eq!(backend_of(&s, sessions[0].id()), "tcp", "the pinned session stays");
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"rebalance\",result=\"moved\"}"), 4);
    let runs = metric(&s, "sluice_rebalance_runs_total");
    wait_for("two more passes of the rebalancer", || metric(&s, "sluice_rebalance_runs_total") >= runs + 2);
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"rebalance\",result=\"moved\"}"), 4, "balanced: no more moves");
    // Three times the weight: six of the eight (two more move, none of those that moved).
    assert_eq!(admin_post(&s, "/backends/sock/weight?value=3").0, 200);
    wait_for("the heavier backend takes its share", || sessions_on(&s, "sock") == 6);
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"rebalance\",result=\"moved\"}"), 6);
    // Removed, it is drained first: its sessions come back, then it is gone.
    assert_eq!(admin_delete(&s, "/backends/sock"), 202);
    wait_for("the removed backend is gone", || backend_names(&s) == ["tcp"]);
    for (i, c) in sessions.iter_mut().enumerate() {
        assert_eq!(state_of(c).await.1, format!("+0{i}:00"));
        assert_eq!(backend_of(&s, c.id()), "tcp");
    }
    assert_eq!(admin_delete(&s, "/backends/sock"), 404);
}

#[test]
fn drains_and_backend_changes_under_load_cost_sysbench_nothing() {
    use sluice_testkit::sysbench;
    let db = MariaDb::start();
    sysbench::prepare(&db, 8, 10000);
    let s = two_addresses(&db, "", true);
    let mut load = sysbench::start("oltp_read_write", &s.listen, 8, 10000, 16);
    wait_for("sysbench runs", || load.progress().transactions > 50);
    let moved = |s: &SluiceProc| metric_sum(s, "sluice_session_moves_total{");
    let progress = |load: &sysbench::Run| load.progress().transactions;
    let step = |what: &str, load: &mut sysbench::Run, cond: &dyn Fn() -> bool| {
        wait_for(what, cond);
        let t = progress(load);
        wait_for("sysbench goes on", || progress(load) > t + 20);
        assert!(load.running(), "sysbench still runs after: {what}");
    };
    let t0 = std::time::Instant::now();
    assert_eq!(admin_post(&s, "/backends/tcp/drain").0, 202);
    wait_for("tcp drained", || sessions_on(&s, "tcp") == 0);
    eprintln!("drain of 16 sysbench sessions took {:?} (polled every 25 ms)", t0.elapsed());
    step("tcp drained", &mut load, &|| sessions_on(&s, "tcp") == 0);
    assert_eq!(admin_post(&s, "/backends/tcp/undrain").0, 200);
    step("sessions spread again", &mut load, &|| sessions_on(&s, "tcp") == 8);
    assert_eq!(admin_post(&s, "/backends/sock/drain").0, 202);
    step("sock drained", &mut load, &|| sessions_on(&s, "sock") == 0);
    // A third address of the same server: a link to its socket.
    let link = db.socket.with_file_name("third.sock");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&db.socket, &link).unwrap();
    let (code, body) = add_backend(&s, &format!("{{\"address\": \"{}\", \"name\": \"third\"}}", link.display()));
    assert_eq!(code, 201, "{body}");
    // sock is still draining: tcp and third share the sixteen.
    step("third takes its share", &mut load, &|| sessions_on(&s, "third") == 8 && sessions_on(&s, "tcp") == 8);
    assert_eq!(admin_delete(&s, "/backends/third"), 202);
    step("third is gone", &mut load, &|| backend_names(&s).len() == 2 && sessions_on(&s, "tcp") == 16);
    let (totals, text) = load.stop();
    let tail: String = text.lines().rev().take(5).collect::<Vec<_>>().join("\n");
    assert!(totals.success, "sysbench ran throughout: {tail}");
    // The only errors allowed are the server's own deadlocks (oltp_read_write's transactions
    // meet now and then, directly as well).
    let deadlocks: u64 =
        db.sql("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").split_whitespace().last().and_then(|v| v.parse().ok()).unwrap();
    eprintln!("sysbench: {} transactions, {} errors, {deadlocks} deadlocks on the server", totals.transactions, totals.ignored_errors);
    assert!(totals.ignored_errors <= deadlocks, "sysbench saw {} errors, the server {deadlocks} deadlocks: {tail}", totals.ignored_errors);
    assert_eq!(totals.reconnects, 0, "sysbench never reconnected: {tail}");
    assert!(moved(&s) >= 40, "sessions moved {} times", moved(&s));
}

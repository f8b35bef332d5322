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

async fn state_of(c: &mut mysql_async::Conn) -> (String, String, String) {
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

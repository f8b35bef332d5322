//! Sluice in front of real TiDB servers (`sluice_testkit::TiDb`, a tidb-server with its embedded
//! store built by scripts/tidb.sh). Two addresses of one server (TCP and its Unix socket) stand
//! in for two TiDB servers sharing one store: every session sees the same data wherever it is.
//! What that cannot show: servers that differ (one being upgraded, one with its own caches or
//! its own failure), which the SIGTERM test covers with a second server where data does not
//! matter. The Go driver's suite in front of TiDB is in go_driver.rs.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_testkit::{TiDb, sysbench};

/// Sluice in front of `db`'s two addresses as backends "tcp" and "sock" (passthrough unless
/// `users`), with `backend` keys on each.
fn two_addresses(db: &TiDb, backend: &str, users: bool) -> SluiceProc {
    let socket = db.socket.display().to_string();
    let c = TestConfig::new()
        .proxy("balance = \"round-robin\"\n")
        .backend_with(&db.addr(), &format!("name = \"tcp\"\n{backend}"))
        .backend_with(&socket, &format!("name = \"sock\"\n{backend}"));
    if users { c.app_users().start() } else { c.start() }
}

fn sessions_on(s: &SluiceProc, name: &str) -> u64 {
    let (_, body) = admin_get(s, "/backends", None);
    json(&body).as_array().unwrap().iter().find(|b| b["name"] == name).map(|b| b["sessions"].as_u64().unwrap()).unwrap()
}

fn session(s: &SluiceProc, id: u32) -> serde_json::Value {
    let (_, body) = admin_get(s, "/sessions", None);
    json(&body).as_array().unwrap().iter().find(|x| x["id"] == id).cloned().unwrap_or_else(|| panic!("no session {id}: {body}"))
}

/// What a session's state looks like from inside: schema, a user variable, the collation, a
/// session variable, and a prepared statement's answer.
async fn state_of(c: &mut mysql_async::Conn, stmt: &mysql_async::Statement) -> (Option<String>, Option<i64>, String, String, i64) {
    let (db, v, coll, tz): (Option<String>, Option<i64>, String, String) =
        c.query_first("SELECT DATABASE(), @kept, @@collation_connection, @@time_zone").await.unwrap().unwrap();
    let p: i64 = c.exec_first(stmt, (41,)).await.unwrap().unwrap();
    (db, v, coll, tz, p)
}

/// A passthrough session (sluice never sees its password) moves on request to the other
/// address with everything it set: schema, user variable, collation, session variable and its
/// prepared statement (which keeps its id); its backend thread id changes. In a transaction it
/// waits for the transaction's end. Users mode moves the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_tidb_moves_on_request_with_its_state() {
    let db = TiDb::start();
    for users in [false, true] {
        let s = two_addresses(&db, "", users);
        let mut c = mysql_async::Conn::new(opts(&s.listen, "app", "apppw")).await.unwrap();
        c.query_drop("USE test").await.unwrap();
        c.query_drop("SET @kept = 7, NAMES utf8mb4 COLLATE utf8mb4_unicode_ci, time_zone = '+03:00'").await.unwrap();
        let stmt = c.prep("SELECT ? + 1").await.unwrap();
        let before = state_of(&mut c, &stmt).await;
        assert_eq!(before, (Some("test".into()), Some(7), "utf8mb4_unicode_ci".into(), "+03:00".into(), 42));
        let (from, thread) = (session(&s, c.id())["backend"].clone(), c.id());
        let to = if from == "tcp" { "sock" } else { "tcp" };
        c.query_drop("BEGIN").await.unwrap();
        let (code, body) = admin_post(&s, &format!("/sessions/{}/move?to={to}", c.id()));
        assert_eq!(code, 202, "{body}");
        c.query_drop("SELECT 1").await.unwrap();
        assert_eq!(session(&s, c.id())["backend"], from, "a session in a transaction stays until it ends");
        c.query_drop("COMMIT").await.unwrap();
        wait_for("the move", || session(&s, c.id())["backend"] == to);
        assert_eq!(state_of(&mut c, &stmt).await, before, "users mode: {users}");
        assert_eq!(c.id(), thread, "the client's connection id is sluice's own");
        assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"request\",result=\"moved\"}"), 1);
        c.disconnect().await.unwrap();
    }
}

/// Error codes TiDB itself gives oltp_read_write's transactions that meet (directly too):
/// deadlock, lock wait timeout, write conflicts.
const CONFLICTS: &[u16] = &[1205, 1213, 8002, 8022, 9007];

/// Draining one address under sysbench oltp_read_write moves every session to the other at its
/// next safe point, passthrough sessions and users-mode ones alike (both by their session
/// states): sysbench never reconnects, and its only errors are TiDB's own conflicts, as it gets
/// directly.
#[test]
fn draining_a_tidb_address_moves_its_sessions_under_load() {
    let db = TiDb::start();
    sysbench::prepare_at(&db.addr(), 4, 1000);
    for users in [false, true] {
        let s = two_addresses(&db, "", users);
        let load = sysbench::start("oltp_read_write", &s.listen, 4, 1000, 8);
        wait_for("sysbench runs", || load.progress().transactions > 100);
        wait_for("sessions on both addresses", || sessions_on(&s, "tcp") == 4 && sessions_on(&s, "sock") == 4);
        assert_eq!(admin_post(&s, "/backends/tcp/drain").0, 202);
        wait_for("tcp drained", || sessions_on(&s, "tcp") == 0);
        let t = load.progress().transactions;
        wait_for("sysbench goes on", || load.progress().transactions > t + 100);
        assert_eq!(sessions_on(&s, "sock"), 8, "every session is on the other address");
        let errors = load.errors();
        let (totals, text) = load.stop();
        let tail: String = text.lines().rev().take(5).collect::<Vec<_>>().join("\n");
        assert!(totals.success, "users mode {users}: sysbench ran throughout: {tail}");
        assert_eq!(totals.reconnects, 0, "users mode {users}: sysbench never reconnected: {tail}");
        assert!(
            errors.iter().all(|e| CONFLICTS.contains(e)),
            "users mode {users}: errors other than TiDB's own conflicts: {errors:?}\n{tail}"
        );
        let moved = metric(&s, "sluice_session_moves_total{reason=\"drain\",result=\"moved\"}");
        assert_eq!(moved, 4, "users mode {users}: the four sessions on tcp moved");
        eprintln!(
            "users mode {users}: sysbench through the drain: {} transactions, {} errors ({errors:?})",
            totals.transactions,
            errors.len()
        );
    }
}

/// Users mode with TiDB users of `caching_sha2_password` and `tidb_sm3_password`: the client
/// logs in to sluice with caching_sha2 over TLS, and over a plain connection with sluice's RSA
/// key; sluice logs in to TiDB, which always asks for full authentication (the clear password)
/// after the scramble, over TLS or its Unix socket, and refuses to send it over plain TCP.
#[test]
fn caching_sha2_and_sm3_users_of_tidb_in_users_mode() {
    let db = TiDb::start();
    let (cert, key) = self_signed_cert();
    let socket = db.socket.display().to_string();
    let config = |backend: &str, keys: &str| {
        TestConfig::new()
            .backend_with(backend, keys)
            .user("sha2", "password = \"sha2pw\"\n")
            .user("sm3", "password = \"sm3pw\"\n")
            .root(&format!("[tls]\ncert = \"{}\"\nkey = \"{}\"\n", cert.display(), key.display()))
            .proxy("auth_plugin = \"caching_sha2_password\"\n")
            .start()
    };
    for (s, how) in [(config(&db.addr(), "tls = \"on\"\ntls_skip_verify = true\n"), "TLS"), (config(&socket, ""), "its Unix socket")] {
        for (user, pw) in [("sha2", "sha2pw"), ("sm3", "sm3pw")] {
            for tls in ["--ssl", "--skip-ssl"] {
                let r = cli(s.port(), user, pw, &[tls, "--default-auth=caching_sha2_password"], "SELECT CURRENT_USER()");
                assert_eq!(r.unwrap_or_else(|e| panic!("{user}, {tls}, sluice to TiDB over {how}: {e}")), format!("{user}@%"));
                let e = cli(s.port(), user, "wrong", &[tls, "--default-auth=caching_sha2_password"], "SELECT 1").expect_err("refused");
                assert!(e.contains("1045"), "{user}, {tls}: {e}");
            }
        }
    }
    let plain = config(&db.addr(), "tls = \"off\"\n");
    for (user, pw) in [("sha2", "sha2pw"), ("sm3", "sm3pw")] {
        let e = cli(plain.port(), user, pw, &["--ssl", "--default-auth=caching_sha2_password"], "SELECT 1")
            .expect_err("no clear password over plain TCP");
        assert!(e.contains("tls"), "{user}: the refusal says what to configure: {e}");
    }
}

/// `KILL TIDB QUERY <id>` names sluice's id of the session, as `KILL` does: sluice translates it
/// to the id of that session's connection on its server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_tidb_names_sluices_session_ids() {
    let db = TiDb::start();
    let s = TestConfig::new().backend(&db.addr()).start();
    let mut a = mysql_async::Conn::new(opts(&s.listen, "app", "apppw")).await.unwrap();
    let mut b = mysql_async::Conn::new(opts(&s.listen, "app", "apppw")).await.unwrap();
    let id = a.id();
    let sleeping = tokio::spawn(async move { a.query_first::<i64, _>("SELECT SLEEP(60)").await });
    wait_running(&mut b, "SELECT SLEEP(60)").await;
    b.query_drop(format!("KILL TIDB QUERY {id}")).await.unwrap();
    let r = sleeping.await.unwrap();
    // (An interrupted SLEEP answers 1, or the server reports the interruption.)
    assert!(r.as_ref().map_or(true, |v| *v == Some(1)), "the sleep was interrupted: {r:?}");
}

/// SIGTERM to a TiDB server under load: with its status address configured, sluice sees it
/// shutting down during its graceful wait and moves every session to the other server before
/// the server closes them. The two servers share nothing but the shape of sysbench's table
/// (point selects, where the data does not matter): sysbench gets no error and never
/// reconnects, and the stopped server ends by itself.
#[test]
fn a_tidb_server_stopped_with_sigterm_under_load_costs_clients_nothing() {
    let graceful = sluice_testkit::tidb::Options { graceful_wait: std::time::Duration::from_secs(8), ..Default::default() };
    let (a, mut b) = (TiDb::start(), TiDb::start_with(&graceful));
    for db in [&a, &b] {
        sysbench::prepare_at(&db.addr(), 1, 1000);
    }
    let s = TestConfig::new()
        .table("health", "interval = \"300ms\"\n")
        .proxy("balance = \"round-robin\"\n")
        .backend_with(&a.addr(), &format!("name = \"a\"\nstatus = \"{}\"\n", a.status_addr()))
        .backend_with(&b.addr(), &format!("name = \"b\"\nstatus = \"{}\"\n", b.status_addr()))
        .start();
    let load = sysbench::start("oltp_point_select", &s.listen, 1, 1000, 8);
    wait_for("sysbench runs", || load.progress().queries > 1000);
    wait_for("sessions on both servers", || sessions_on(&s, "a") == 4 && sessions_on(&s, "b") == 4);
    b.terminate();
    wait_for("every session left b", || sessions_on(&s, "b") == 0);
    let (_, body) = admin_get(&s, "/backends", None);
    assert!(body.contains("\"closing\":true"), "b shows as closing: {body}");
    assert!(b.wait_exit(std::time::Duration::from_secs(60)), "tidb-server ended by itself after its graceful wait");
    let q = load.progress().queries;
    wait_for("sysbench goes on", || load.progress().queries > q + 1000);
    assert_eq!(sessions_on(&s, "a"), 8, "every session is on a");
    let errors = load.errors();
    let (totals, text) = load.stop();
    let tail: String = text.lines().rev().take(5).collect::<Vec<_>>().join("\n");
    assert!(totals.success && errors.is_empty(), "sysbench saw errors {errors:?}: {tail}");
    assert_eq!(totals.reconnects, 0, "sysbench never reconnected: {tail}");
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"drain\",result=\"moved\"}"), 4, "the four sessions on b moved");
}

/// The latency-aware policy reads what a TiDB server reports: its response time from the
/// health probes, its CPU and memory use from its status address's `/metrics`; `/backends`
/// shows them with the factor of the weight they give.
#[test]
fn least_latency_reads_a_tidb_servers_response_time_cpu_and_memory() {
    let db = TiDb::start();
    let s = TestConfig::new()
        .table("health", "interval = \"200ms\"\n")
        .proxy("balance = \"least-latency\"\n")
        .backend_with(&db.addr(), &format!("name = \"t\"\nstatus = \"{}\"\n", db.status_addr()))
        .start();
    let load = || {
        let (_, body) = admin_get(&s, "/backends", None);
        json(&body)[0]["load"].clone()
    };
    wait_for("the readings", || {
        let l = load();
        l["latency_ms"].as_f64().is_some_and(|v| v > 0.0) && l["cpu"].as_f64().is_some() && l["memory"].as_f64().is_some()
    });
    let l = load();
    assert!(l["factor"].as_f64().is_some_and(|f| f > 0.0 && f <= 1.0), "{l}");
    assert_eq!(cli(s.port(), "app", "apppw", &[], "SELECT 1").unwrap(), "1", "sessions go there");
}

/// Multiplexed sessions on TiDB, which reports no session state changes: sluice reads back
/// what a `SET` or `USE` named, so the session goes on multiplexing (no pin) and takes its
/// settings to whichever connection it runs on next, while no other session ever gets them. A
/// `SET` sluice cannot name the variables of keeps the session on its connection
/// (`hidden_state`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiplexed_sessions_on_tidb_keep_their_settings_to_themselves() {
    let db = TiDb::start();
    let s = TestConfig::new().proxy("multiplex = true\nmax_backend_connections = 8\n").backend(&db.addr()).app_users().start();
    let mut conns = Vec::new();
    // (The others in a schema of their own: a connection's schema cannot be taken back to none.)
    for i in 0..6 {
        let schema = (i > 0).then(|| "mysql".to_string());
        conns.push(mysql_async::Conn::new(opts(&s.listen, "app", "apppw").db_name(schema)).await.unwrap());
    }
    conns[0].query_drop("SET time_zone = '+03:00', SESSION sql_mode = 'ANSI_QUOTES'").await.unwrap();
    conns[0].query_drop("USE test").await.unwrap();
    // (Once the next statement is answered, the session has noted what the last one left.)
    conns[0].query_drop("DO 0").await.unwrap();
    let pins = session(&s, conns[0].id())["pins"].clone();
    assert_eq!(pins, serde_json::json!([]), "what the SET and the USE named was read back");
    // Every session runs a few statements in turn: connections change hands between them.
    for _ in 0..4 {
        for c in conns.iter_mut().skip(1) {
            let (tz, db, mode): (String, Option<String>, String) =
                c.query_first("SELECT @@time_zone, DATABASE(), @@sql_mode").await.unwrap().unwrap();
            assert_eq!(tz, "SYSTEM", "another session's setting leaked");
            assert_eq!(db.as_deref(), Some("mysql"), "another session's schema leaked");
            assert!(!mode.contains("ANSI_QUOTES"), "{mode}");
        }
        let (tz, db, mode): (String, Option<String>, String) =
            conns[0].query_first("SELECT @@time_zone, DATABASE(), @@sql_mode").await.unwrap().unwrap();
        assert_eq!((tz.as_str(), db.as_deref()), ("+03:00", Some("test")));
        assert_eq!(mode, "ANSI_QUOTES");
    }
    // A SET of a user variable and a session variable together: both go with the session.
    conns[2].query_drop("SET @v = 5, time_zone = '+02:00'").await.unwrap();
    for _ in 0..3 {
        let (tz, v): (String, Option<i64>) = conns[2].query_first("SELECT @@time_zone, @v").await.unwrap().unwrap();
        assert_eq!((tz.as_str(), v), ("+02:00", Some(5)));
        let (tz, v): (String, Option<i64>) = conns[3].query_first("SELECT @@time_zone, @v").await.unwrap().unwrap();
        assert_eq!((tz.as_str(), v), ("SYSTEM", None), "another session's settings leaked");
    }
    // (Under ANSI_QUOTES, "x" is a name.)
    conns[0].query_drop("CREATE TABLE IF NOT EXISTS \"quoted\" (id INT)").await.unwrap();
    conns[1].query_drop("SET @@session.`time_zone` = '+05:00'").await.unwrap();
    conns[1].query_drop("DO 0").await.unwrap();
    let pins = session(&s, conns[1].id())["pins"].clone();
    assert!(pins.as_array().is_some_and(|p| p.iter().any(|x| x == "hidden_state")), "{pins}");
    for c in conns {
        c.disconnect().await.unwrap();
    }
}

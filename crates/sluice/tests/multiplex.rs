//! Multiplexing: users-mode sessions share a few backend connections, each keeping its own
//! state; what pins a session to its connection holds it exactly as long as it must; the cap
//! on backend connections queues statements and says so when the wait runs out.

mod common;

use common::*;
use mysql_async::prelude::*;

/// A multiplexing sluice, one worker, in front of `db`, with `proxy` keys added.
fn mux(db: &MariaDb, proxy: &str) -> SluiceProc {
    TestConfig::new().proxy(&format!("workers = 1\nmultiplex = true\n{proxy}")).dbs(&[db]).app_users().start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_sessions_share_two_connections_and_keep_their_own_state() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE m1; CREATE DATABASE m2; CREATE TABLE m1.t (v VARCHAR(10)); CREATE TABLE m2.t (v VARCHAR(10)); INSERT INTO m1.t VALUES ('one'); INSERT INTO m2.t VALUES ('two')");
    let s = mux(&db, "max_backend_connections = 2\n");
    let mut sessions = Vec::new();
    for i in 0..12 {
        let mut c = app(&s).await;
        // Each session its own schema, time zone, SQL mode and prepared statement.
        c.query_drop(format!("USE m{}", i % 2 + 1)).await.unwrap();
        c.query_drop(format!("SET time_zone = '+{:02}:00', sql_mode = '{}'", i, if i % 3 == 0 { "ANSI_QUOTES" } else { "" }))
            .await
            .unwrap();
        let stmt = c.prep(format!("SELECT v, ? + {i} FROM t")).await.unwrap();
        sessions.push((c, stmt));
    }
    let mut threads = std::collections::HashSet::new();
    for round in 0..3 {
        for (i, (c, stmt)) in sessions.iter_mut().enumerate() {
            let (db_name, tz, mode, tid): (String, String, String, u64) =
                c.query_first("SELECT DATABASE(), @@time_zone, @@sql_mode, CONNECTION_ID()").await.unwrap().unwrap();
            assert_eq!(db_name, format!("m{}", i % 2 + 1), "session {i} round {round}");
            assert_eq!(tz, format!("+{i:02}:00"));
            assert_eq!(mode, if i % 3 == 0 { "ANSI_QUOTES" } else { "" });
            threads.insert(tid);
            let (v, n): (String, i64) = c.exec_first(&*stmt, (round,)).await.unwrap().unwrap();
            assert_eq!(v, if i % 2 == 0 { "one" } else { "two" });
            assert_eq!(n, round + i as i64);
        }
    }
    assert!(threads.len() <= 2, "12 sessions ran on {} backend connections: {threads:?}", threads.len());
    assert!(app_threads(&db) <= 2, "the server has {} connections of app", app_threads(&db));
    // Between statements no session holds a connection.
    let (_, body) = admin_get(&s, "/sessions", None);
    let all = json(&body);
    assert!(all.as_array().unwrap().iter().all(|x| x["backend_thread_id"].is_null()), "{body}");
    // Closed statements and sessions that end leave the shared connections usable.
    for (mut c, stmt) in sessions {
        c.close(stmt).await.unwrap();
        c.disconnect().await.unwrap();
    }
    let mut c = app(&s).await;
    let one: Option<i64> = c.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_hold_the_connection_while_they_must() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE p; CREATE TABLE p.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT); CREATE PROCEDURE p.quiet() BEGIN END; CREATE PROCEDURE p.setter() SET @y = 5");
    let s = mux(&db, "max_backend_connections = 2\n");
    let mut a = app(&s).await;
    let mut b = app(&s).await;
    a.query_drop("USE p").await.unwrap();
    b.query_drop("USE p").await.unwrap();

    // A transaction: its writes are visible to itself only, across other sessions' statements.
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO t (v) VALUES (1)").await.unwrap();
    let seen_by_b: Option<i64> = b.query_first("SELECT COUNT(*) FROM t").await.unwrap();
    assert_eq!(seen_by_b, Some(0));
    let seen_by_a: Option<i64> = a.query_first("SELECT COUNT(*) FROM t").await.unwrap();
    assert_eq!(seen_by_a, Some(1));
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(body.contains("\"transaction\""), "/sessions shows the transaction pin: {body}");
    a.query_drop("COMMIT").await.unwrap();

    // Warnings: SHOW WARNINGS after the statement that left them, whatever ran in between.
    a.query_drop("SELECT 1 + 'x'").await.unwrap();
    b.query_drop("SELECT 1").await.unwrap();
    let w: Vec<(String, u32, String)> = a.query("SHOW WARNINGS").await.unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].1, 1292);

    // FOUND_ROWS() after SQL_CALC_FOUND_ROWS.
    a.query_drop("INSERT INTO t (v) VALUES (2), (3), (4)").await.unwrap();
    let _: Vec<i64> = a.query("SELECT SQL_CALC_FOUND_ROWS v FROM t LIMIT 1").await.unwrap();
    b.query_drop("SELECT 1").await.unwrap();
    let found: Option<i64> = a.query_first("SELECT FOUND_ROWS()").await.unwrap();
    assert_eq!(found, Some(4));

    // ROW_COUNT(): once the session read it, every statement is followed on its connection.
    let _: Option<i64> = a.query_first("SELECT ROW_COUNT()").await.unwrap();
    a.query_drop("UPDATE t SET v = v + 1 WHERE v > 2").await.unwrap();
    b.query_drop("DO 1").await.unwrap();
    let rc: Option<i64> = a.query_first("SELECT ROW_COUNT()").await.unwrap();
    assert_eq!(rc, Some(2));

    // Temporary tables live on their connection: the session keeps it.
    b.query_drop("CREATE TEMPORARY TABLE tmp (x INT)").await.unwrap();
    b.query_drop("INSERT INTO tmp VALUES (7)").await.unwrap();
    a.query_drop("SELECT 1").await.unwrap();
    let x: Option<i64> = b.query_first("SELECT x FROM tmp").await.unwrap();
    assert_eq!(x, Some(7));
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(body.contains("\"temporary_table\""), "{body}");
    // A stored routine may leave state sluice cannot see (here a user variable): the server
    // reports a change of state the statement's text does not explain, and the session stays.
    a.query_drop("CALL quiet()").await.unwrap();
    a.query_drop("USE p").await.unwrap();
    a.query_drop("SET time_zone = '+01:00'").await.unwrap();
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(!body.contains("\"hidden_state\""), "a routine that changes nothing, USE and SET pin nothing: {body}");
    a.query_drop("CALL setter()").await.unwrap();
    b.query_drop("DO 1").await.unwrap();
    let y: Option<i64> = a.query_first("SELECT @y").await.unwrap();
    assert_eq!(y, Some(5));
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(body.contains("\"hidden_state\""), "{body}");
    assert!(metric(&s, "sluice_session_pins_total{reason=\"temporary_table\"}") >= 1);
    assert!(metric(&s, "sluice_session_pins_total{reason=\"transaction\"}") >= 1);
    assert!(metric(&s, "sluice_session_pins_total{reason=\"warnings\"}") >= 1);
}

/// Sets user variables of every type on `c` (the same statements on every connection).
async fn set_variables(c: &mut mysql_async::Conn) {
    c.query_drop(
        "SET @i = -5, @big = -9223372036854775808, @u = CAST(18446744073709551615 AS UNSIGNED), @d = 1.50, \
         @f = 0.1e0 + 0.2e0, @s = CONVERT('café' USING latin1) COLLATE latin1_german1_ci, @bin = X'00FF', \
         @nothing = NULL, @secret = 'hunter2'",
    )
    .await
    .unwrap();
    c.query_drop("SELECT @sel := 10").await.unwrap();
    c.query_drop("SELECT 11 INTO @into").await.unwrap();
    c.query_drop("EXECUTE IMMEDIATE 'SET @imm = ?' USING 12").await.unwrap();
    c.exec_drop("SET @bound = ?", (13,)).await.unwrap();
}

/// What a connection's user variables are, types included: a table made from them.
async fn variables_seen(c: &mut mysql_async::Conn, table: &str) -> (String, Vec<String>) {
    let cols = "@i AS i, @big AS big, @u AS u, @d AS d, @f AS f, @s AS s, @bin AS bin, @nothing AS nothing, @secret AS secret, \
                @sel AS sel, @into AS `into`, @imm AS imm, @bound AS bound";
    c.query_drop(format!("CREATE TABLE uv.{table} AS SELECT {cols}")).await.unwrap();
    let (_, ddl): (String, String) = c.query_first(format!("SHOW CREATE TABLE uv.{table}")).await.unwrap().unwrap();
    let row: mysql_async::Row = c
        .query_first(format!("SELECT i, big, u, d, f, HEX(s), HEX(bin), nothing, secret, sel, `into`, imm, bound FROM uv.{table}"))
        .await
        .unwrap()
        .unwrap();
    let values = (0..row.len()).map(|i| format!("{:?}", row.as_ref(i).unwrap())).collect();
    (ddl.replace(&format!("`{table}`"), "`t`"), values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_variables_follow_their_session_with_their_types() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE uv");
    let s = mux(&db, "max_backend_connections = 1\n");
    // What a direct connection sees.
    let mut direct = connect(&db.addr(), "app", "apppw").await;
    set_variables(&mut direct).await;
    let want = variables_seen(&mut direct, "direct").await;
    let mut a = app(&s).await;
    let mut b = app(&s).await;
    set_variables(&mut a).await;
    // (The variables the last statement named are read back at its safe point, which the
    // session reaches just after the client has the statement's answer.)
    let unpinned =
        || json(&admin_get(&s, "/sessions", None).1).as_array().unwrap().iter().all(|x| x["pins"].as_array().unwrap().is_empty());
    wait_for("no session pinned", unpinned);
    // b takes the one connection, which has a's variables: it must not see them.
    let theirs: Option<(Option<i64>, Option<String>)> = b.query_first("SELECT @i, @secret").await.unwrap();
    assert_eq!(theirs, Some((None, None)));
    b.query_drop("SET @i = 99").await.unwrap();
    // a gets the connection back, with its variables as they were, types and all.
    let tid_a: u64 = a.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap();
    let tid_b: u64 = b.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap();
    assert_eq!(tid_a, tid_b, "one backend connection for both");
    assert_eq!(variables_seen(&mut a, "through").await, want);
    let mine: Option<i64> = b.query_first("SELECT @i").await.unwrap();
    assert_eq!(mine, Some(99));
    // No pin; /sessions names the variables but never shows their values.
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(json(&body).as_array().unwrap().iter().all(|x| x["pins"].as_array().unwrap().is_empty()), "{body}");
    assert!(body.contains("\"secret\"") && !body.contains("hunter2"), "{body}");
    assert!(!s.log_text().contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_insert_id_follows_the_session() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE li; CREATE TABLE li.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)");
    let s = mux(&db, "max_backend_connections = 1\n");
    let mut a = app(&s).await;
    let mut b = app(&s).await;
    a.query_drop("INSERT INTO li.t (v) VALUES (1)").await.unwrap();
    // b's insert runs on the one shared connection, whose LAST_INSERT_ID() it changes.
    b.query_drop("INSERT INTO li.t (v) VALUES (2), (3)").await.unwrap();
    let mine: Option<u64> = a.query_first("SELECT LAST_INSERT_ID()").await.unwrap();
    assert_eq!(mine, Some(1));
    let theirs: Option<u64> = b.query_first("SELECT LAST_INSERT_ID()").await.unwrap();
    assert_eq!(theirs, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_statement_waits_then_gets_an_error_naming_the_backend() {
    let db = MariaDb::start();
    let s = mux(&db, "max_backend_connections = 1\nqueue_timeout = \"300ms\"\n");
    let mut a = app(&s).await;
    let mut b = app(&s).await;
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("SELECT 1").await.unwrap();
    let e = b.query_drop("SELECT 2").await.expect_err("no connection is free");
    let text = e.to_string();
    assert!(text.contains("1040") && text.contains("queue_timeout") && text.contains(&db.addr()), "{text}");
    assert_eq!(metric(&s, &format!("sluice_backend_queue_timeouts_total{{backend=\"{}\"}}", db.addr())), 1);
    // A waiter gets the connection as soon as the transaction ends.
    let waiter = tokio::spawn(async move {
        let r: Option<i64> = b.query_first("SELECT 3").await.unwrap();
        r
    });
    wait_for("the statement waits", || metric(&s, &format!("sluice_backend_queue_waiting{{backend=\"{}\"}}", db.addr())) == 1);
    a.query_drop("COMMIT").await.unwrap();
    assert_eq!(waiter.await.unwrap(), Some(3));
    assert_eq!(app_threads(&db), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_reaches_a_multiplexed_session_between_and_during_statements() {
    let db = MariaDb::start();
    let s = mux(&db, "max_backend_connections = 2\n");
    let mut killer = app(&s).await;
    let mut idle = app(&s).await;
    let idle_id = idle.id();
    // Between statements there is nothing to stop: KILL QUERY is an OK, KILL ends the session.
    killer.query_drop(format!("KILL QUERY {idle_id}")).await.unwrap();
    let one: Option<i64> = idle.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    killer.query_drop(format!("KILL {idle_id}")).await.unwrap();
    assert!(idle.query_drop("SELECT 1").await.is_err(), "a killed session is gone");
    // A running statement is stopped on the connection it runs on.
    let busy = app(&s).await;
    let busy_id = busy.id();
    let running = run_in_background(busy, "SELECT SLEEP(30)");
    wait_for("the sleep runs", || {
        db.sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP%'").contains('1')
    });
    killer.query_drop(format!("KILL QUERY {busy_id}")).await.unwrap();
    let (r, _) = running.await.unwrap();
    let _ = r;
    let still: Option<i64> = killer.query_first("SELECT 1").await.unwrap();
    assert_eq!(still, Some(1));
}

/// Whether the connection is closed now (EOF or a reset, after any bytes it still holds),
/// without waiting: as a pool sees a connection when it hands it out.
fn closed_now(c: &mut sluice_testkit::raw::Raw) -> bool {
    c.s.set_nonblocking(true).unwrap();
    let closed = c.is_closed();
    c.s.set_nonblocking(false).unwrap();
    closed
}

/// A KILL among other statements ends a multiplexed session between statements where the
/// KILL stands, as the server closes a killed connection at once: a pool that released the
/// connection and hands it out after the killer's query sees it gone (node-mysql2's
/// "should serve a new connection after the previous one is killed"), and so does one that
/// looks while the statements after the KILL still run. Not before the statements before it
/// have run, and not when one of them failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_among_statements_ends_its_target_where_it_stands() {
    use sluice_testkit::raw::Raw;
    let db = MariaDb::start();
    let s = mux(&db, "max_backend_connections = 2\n");
    let mut killer = app(&s).await;
    let idle_session = || {
        let r = Raw::login(&s.listen, "app", "apppw", Some("test"));
        let id = r.greeting.as_ref().unwrap().connection_id;
        (r, id)
    };
    // The pool's sequence: the KILL first, a short statement after it.
    let (mut pooled, id) = idle_session();
    let mut r = killer.query_iter(format!("kill {id}; select sleep(0.05)")).await.unwrap();
    let _: Vec<mysql_async::Row> = r.collect().await.unwrap();
    let _: Vec<mysql_async::Row> = r.collect().await.unwrap();
    drop(r);
    assert!(closed_now(&mut pooled), "the killed connection is gone when the KILL's query returns");
    // Seen while the statements after the KILL still run. (A result larger than the server's
    // network buffer makes it send what came before at once, rather than at the query's end.)
    let big = "SELECT REPEAT('x', 100000)";
    for before in ["", "SELECT 1; ", "SELECT REPEAT('y', 100000); "] {
        let (mut target, id) = idle_session();
        let mut r = killer.query_iter(format!("{before}KILL {id}; {big}; SELECT SLEEP(1)")).await.unwrap();
        if !before.is_empty() {
            let _: Vec<mysql_async::Row> = r.collect().await.unwrap();
        }
        let _: Vec<mysql_async::Row> = r.collect().await.unwrap();
        assert!(closed_now(&mut target), "{before}: the target is gone once its KILL is answered, while the statements after it run");
        let x: Vec<String> = r.collect().await.unwrap();
        assert_eq!(x[0].len(), 100_000);
        let _: Vec<mysql_async::Row> = r.collect().await.unwrap();
        drop(r);
    }
    // A statement before it fails: the KILL never runs, and its target stays.
    let (mut spared, id) = idle_session();
    let e = killer.query_drop(format!("SELECT * FROM mysql.no_such_table; KILL {id}; SELECT 1")).await.unwrap_err();
    assert!(e.to_string().contains("1146"), "{e}");
    assert_eq!(spared.row("SELECT 5"), vec![Some("5".to_string())], "a KILL that did not run kills nothing");
    let still: Option<i64> = killer.query_first("SELECT 1").await.unwrap();
    assert_eq!(still, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_prepared_statements_follow_their_session_and_no_other() {
    let db = MariaDb::start();
    let s = mux(&db, "max_backend_connections = 1\n");
    let mut a = app(&s).await;
    let mut b = app(&s).await;
    a.query_drop("PREPARE plus FROM 'SELECT ? + 1'").await.unwrap();
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(!body.contains("\"sql_prepare\""), "a PREPARE of a literal text pins nothing: {body}");
    // b takes the one connection, which a's statement is on: b must not see it.
    let e = b.query_drop("EXECUTE plus USING 1").await.expect_err("b prepared nothing");
    assert!(e.to_string().contains("1243"), "{e}");
    // a gets the connection back, its statement prepared there again.
    let r: Option<i64> = a.query_first("EXECUTE plus USING 41").await.unwrap();
    assert_eq!(r, Some(42));
    b.query_drop("PREPARE plus FROM 'SELECT ? * 2'").await.unwrap();
    let r: Option<i64> = a.query_first("EXECUTE plus USING 41").await.unwrap();
    assert_eq!(r, Some(42), "a's own statement, not b's of the same name");
    let r: Option<i64> = b.query_first("EXECUTE plus USING 41").await.unwrap();
    assert_eq!(r, Some(82));
    a.query_drop("DEALLOCATE PREPARE plus").await.unwrap();
    b.query_drop("DO 1").await.unwrap();
    assert!(a.query_drop("EXECUTE plus USING 1").await.is_err(), "deallocated");
    // A PREPARE from a variable cannot be repeated elsewhere: it pins.
    a.query_drop("SET @q = 'SELECT 7'").await.unwrap();
    a.query_drop("PREPARE seven FROM @q").await.unwrap();
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(body.contains("\"sql_prepare\""), "{body}");
}

/// The `/sessions` entry of session `id`.
fn session_info(s: &SluiceProc, id: u32) -> serde_json::Value {
    let (_, body) = admin_get(s, "/sessions", None);
    json(&body).as_array().unwrap().iter().find(|x| x["id"] == id).cloned().unwrap_or(serde_json::Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_park_and_come_back_with_their_state() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE p1; CREATE TABLE p1.t (v VARCHAR(10)); INSERT INTO p1.t VALUES ('kept')");
    let s = mux(&db, "max_backend_connections = 2\n");
    // One session with state of every kind a parked session carries, one in a transaction
    // (pinned: it keeps its connection and its task), one to be killed while parked.
    let mut a = app(&s).await;
    a.query_drop("USE p1").await.unwrap();
    a.query_drop("SET time_zone = '+03:00', @u = 'mine'").await.unwrap();
    let stmt = a.prep("SELECT v, ? FROM t").await.unwrap();
    let mut pinned = app(&s).await;
    pinned.query_drop("BEGIN").await.unwrap();
    let doomed = app(&s).await;
    for c in [&a, &doomed] {
        let id = c.id();
        wait_for("the idle session parks", || session_info(&s, id)["parked"] == true);
    }
    assert_eq!(session_info(&s, pinned.id())["parked"], false, "a session in a transaction holds its connection");
    let (_, metrics) = admin_get(&s, "/metrics", None);
    assert!(metrics.contains("sluice_parked_sessions 2"), "{metrics}");
    // The parked session's next statements find everything as they left it.
    let (schema, tz, u): (String, String, String) = a.query_first("SELECT DATABASE(), @@time_zone, @u").await.unwrap().unwrap();
    assert_eq!((schema.as_str(), tz.as_str(), u.as_str()), ("p1", "+03:00", "mine"));
    let (v, n): (String, i64) = a.exec_first(&stmt, (7,)).await.unwrap().unwrap();
    assert_eq!((v.as_str(), n), ("kept", 7));
    assert_eq!(session_info(&s, a.id())["parked"], false);
    // It parks again once idle, and a kill reaches a parked session.
    wait_for("the session parks again", || session_info(&s, a.id())["parked"] == true);
    a.query_drop(format!("KILL {}", doomed.id())).await.unwrap();
    wait_for("the killed session is gone", || session_info(&s, doomed.id()).is_null());
    pinned.query_drop("COMMIT").await.unwrap();
    wait_for("the session parks after its transaction", || session_info(&s, pinned.id())["parked"] == true);
    let one: Option<i64> = pinned.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sessions_park_too_and_come_back() {
    let db = MariaDb::start();
    let s = mux(&db, "");
    let mut a = mysql_async::Conn::new(mysql_async::Opts::from(tls_opts(&s.listen, "app", "apppw"))).await.unwrap();
    assert_eq!(session_info(&s, a.id())["tls"], true, "the client leg is encrypted");
    a.query_drop("SET @u = 'mine'").await.unwrap();
    let stmt = a.prep("SELECT ?, LENGTH(REPEAT('x', ?))").await.unwrap();
    // A response of many TLS records before the wait.
    let big: Option<String> = a.query_first("SELECT REPEAT('y', 300000)").await.unwrap();
    assert_eq!(big.map(|b| b.len()), Some(300_000));
    let id = a.id();
    wait_for("the idle TLS session parks", || session_info(&s, id)["parked"] == true);
    // A command of many records, then its state, after the park.
    let (u, n): (String, i64) = a.exec_first(&stmt, ("mine", 5_000_000)).await.unwrap().unwrap();
    assert_eq!((u.as_str(), n), ("mine", 5_000_000));
    let long = "z".repeat(200_000);
    let echoed: Option<i64> = a.query_first(format!("SELECT LENGTH('{long}')")).await.unwrap();
    assert_eq!(echoed, Some(200_000));
    let u: Option<String> = a.query_first("SELECT @u").await.unwrap();
    assert_eq!(u.as_deref(), Some("mine"));
    wait_for("the TLS session parks again", || session_info(&s, id)["parked"] == true);
    // The client's end reaches a parked TLS session.
    a.disconnect().await.unwrap();
    wait_for("the session ends with its client", || session_info(&s, id).is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_does_not_restart_the_idle_timeout() {
    let db = MariaDb::start();
    let s = mux(&db, "idle_timeout = \"5s\"\n");
    let mut c = app(&s).await;
    c.query_drop("DO 1").await.unwrap();
    let last_command = std::time::Instant::now();
    let id = c.id();
    wait_for("the idle session parks", || session_info(&s, id)["parked"] == true);
    wait_for("the idle session is closed", || session_info(&s, id).is_null());
    // A session parks after at least a second of idleness: a timeout restarted by the park
    // would close it at least 6 s after its last command.
    let idle = last_command.elapsed();
    assert!(idle >= std::time::Duration::from_secs(5) && idle < std::time::Duration::from_secs(6), "closed after {idle:?} idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_parked_sessions_come_back_and_leave_with_their_clients() {
    let db = MariaDb::start();
    let s = mux(&db, "");
    // More sessions than the parking lot takes ready sockets per turn.
    let n = 150;
    let mut clients: Vec<Raw> = (0..n).map(|_| Raw::login(&s.listen, "app", "apppw", None)).collect();
    wait_for("every idle session parks", || metric(&s, "sluice_parked_sessions") == n as u64);
    // Half the clients leave at once: their sessions end.
    clients.truncate(n / 2);
    wait_for("the sessions of the clients that left end", || metric(&s, "sluice_client_connections") == (n / 2) as u64);
    // The others speak and are answered.
    for c in clients.iter_mut() {
        let packets = c.query("SELECT 7");
        assert!(packets.iter().any(|p| p.as_slice() == b"\x017"), "{packets:?}");
    }
    assert!(metric(&s, "sluice_parked_sessions") < n as u64 / 2);
    drop(clients);
    wait_for("every session ends", || metric(&s, "sluice_client_connections") == 0);
}

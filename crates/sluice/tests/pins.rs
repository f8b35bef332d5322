//! One test per pin that `multiplex.rs` does not show already: a multiplexing sluice with a
//! single backend connection, so that while one session is pinned another session's statement
//! waits for the connection and, when its wait runs out, says so; once the pin ends the other
//! session gets through. (Transaction, warnings, FOUND_ROWS(), ROW_COUNT(), temporary tables,
//! hidden state and SQL PREPARE from a variable are in `multiplex.rs`.)

mod common;

use common::*;
use mysql_async::Conn;
use mysql_async::prelude::*;
use sluice_proto::consts::{com, status};

/// A multiplexing sluice, one worker and one backend connection, whose waiters give up after
/// 300 ms, in front of `db`.
fn one_connection(db: &MariaDb) -> SluiceProc {
    TestConfig::new()
        .proxy("workers = 1\nmultiplex = true\nmax_backend_connections = 1\nqueue_timeout = \"300ms\"\n")
        .dbs(&[db])
        .app_users()
        .start()
}

/// Whether a statement of `other` gets through: false when the one backend connection stays
/// held and the wait for it runs out (any other error fails the test).
async fn gets_through(other: &mut Conn) -> bool {
    match other.query_drop("DO 1").await {
        Ok(()) => true,
        Err(e) => {
            assert!(e.to_string().contains("queue_timeout"), "only the wait may fail: {e}");
            false
        }
    }
}

/// Every pin `/sessions` shows now, over all sessions.
fn pins(s: &SluiceProc) -> Vec<String> {
    let (_, body) = admin_get(s, "/sessions", None);
    let all = json(&body);
    let mut v: Vec<String> = all
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|x| x["pins"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()))
        .collect();
    v.sort();
    v
}

/// Asserts that `pin` holds the connection now: `/sessions` names it, the metric counted it
/// (both once the session has passed the safe point after its statement's answer) and `other`
/// cannot get a statement through.
async fn assert_held(s: &SluiceProc, pin: &str, other: &mut Conn) {
    let series = format!("sluice_session_pins_total{{reason=\"{pin}\"}}");
    let shown = try_wait_for(|| pins(s).iter().any(|p| p == pin) && metric(s, &series) >= 1);
    assert!(shown, "{pin} is shown and counted: {:?}, {}", pins(s), metric(s, &series));
    assert!(!gets_through(other).await, "{pin} holds the one connection");
}

/// Asserts that no pin is left and the connection was given back (once the session has
/// passed its safe point), and that `other` gets through.
async fn assert_released(s: &SluiceProc, other: &mut Conn) {
    let free = || {
        let all = json(&admin_get(s, "/sessions", None).1);
        all.as_array().unwrap().iter().all(|x| x["pins"].as_array().unwrap().is_empty() && x["backend_thread_id"].is_null())
    };
    assert!(try_wait_for(free), "no pin is left: {:?}", pins(s));
    assert!(gets_through(other).await, "the connection is free again");
}

/// A server set up with `sql`, a sluice with one backend connection in front of it, and two
/// sessions: `a`, which pins, and `b`, which waits while it does.
async fn two_sessions(sql: &str) -> (MariaDb, SluiceProc, Conn, Conn) {
    let db = MariaDb::start();
    if !sql.is_empty() {
        db.sql(sql);
    }
    let s = one_connection(&db);
    let (a, b) = (app(&s).await, app(&s).await);
    (db, s, a, b)
}

fn with_id(command: u8, id: u32) -> Vec<u8> {
    let mut p = vec![command];
    p.extend_from_slice(&id.to_le_bytes());
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_pins_until_its_last_row_is_fetched() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE c; CREATE TABLE c.t (id INT); INSERT INTO c.t VALUES (1), (2), (3), (4), (5)");
    let s = one_connection(&db);
    let mut a = Raw::login(&s.listen, "app", "apppw", Some("c"));
    let mut b = app(&s).await;
    let (id, _, _) = a.prepare("SELECT id FROM t ORDER BY id");
    let mut ex = with_id(com::STMT_EXECUTE, id);
    ex.push(1); // CURSOR_TYPE_READ_ONLY
    ex.extend_from_slice(&1u32.to_le_bytes());
    let meta = a.command(&ex);
    let st = sluice_proto::basic::terminator_status(meta.last().unwrap(), true).unwrap();
    assert_ne!(st & status::CURSOR_EXISTS, 0, "the cursor is open");
    assert_held(&s, "cursor", &mut b).await;
    // The rows come from the cursor on that connection, two at a time, to the last.
    let mut rows = 0;
    loop {
        let mut f = with_id(com::STMT_FETCH, id);
        f.extend_from_slice(&2u32.to_le_bytes());
        let got = a.command(&f);
        rows += got.len() - 1;
        let st = sluice_proto::basic::terminator_status(got.last().unwrap(), true).unwrap();
        if st & status::LAST_ROW_SENT != 0 {
            break;
        }
        assert!(!gets_through(&mut b).await, "the cursor still holds the connection after {rows} rows");
    }
    assert_eq!(rows, 5);
    assert_released(&s, &mut b).await;
    // A cursor left open ends with COM_STMT_RESET too.
    a.command(&ex);
    assert_held(&s, "cursor", &mut b).await;
    assert_eq!(a.command(&with_id(com::STMT_RESET, id))[0][0], 0);
    assert_released(&s, &mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_data_pins_until_its_statement_executes() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE l; CREATE TABLE l.t (id INT, b BLOB); INSERT INTO l.t VALUES (1, NULL)");
    let s = one_connection(&db);
    let mut a = Raw::login(&s.listen, "app", "apppw", Some("l"));
    let mut b = app(&s).await;
    let (id, _, _) = a.prepare("UPDATE t SET b = ? WHERE id = 1");
    for chunk in [&b"sent "[..], b"in pieces"] {
        let mut ld = with_id(com::STMT_SEND_LONG_DATA, id);
        ld.extend_from_slice(&0u16.to_le_bytes());
        ld.extend_from_slice(chunk);
        assert!(a.command(&ld).is_empty());
        // The pieces sent so far wait on that connection.
        assert_held(&s, "long_data", &mut b).await;
    }
    let mut ex = with_id(com::STMT_EXECUTE, id);
    ex.push(0); // no cursor
    ex.extend_from_slice(&1u32.to_le_bytes());
    ex.push(0); // null bitmap
    ex.push(1); // new params bound
    ex.extend_from_slice(&[0xfc, 0]); // MYSQL_TYPE_BLOB
    let res = a.command(&ex);
    assert_eq!(res[0][0], 0, "{}", String::from_utf8_lossy(&res[0]));
    assert!(db.sql("SELECT b FROM l.t").contains("sent in pieces"));
    assert_released(&s, &mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_pin_until_the_session_is_reset() {
    let (db, s, mut a, mut b) = two_sessions("CREATE DATABASE k; CREATE TABLE k.t (id INT)").await;
    // A named lock belongs to the connection that took it.
    let got: Option<i64> = a.query_first("SELECT GET_LOCK('pins', 10)").await.unwrap();
    assert_eq!(got, Some(1));
    assert_held(&s, "lock", &mut b).await;
    assert!(db.sql("SELECT IS_FREE_LOCK('pins')").trim().ends_with('0'), "the lock is held");
    let mine: Option<i64> = a.query_first("SELECT IS_USED_LOCK('pins') = CONNECTION_ID()").await.unwrap();
    assert_eq!(mine, Some(1));
    // A reset releases it, and the pin with it.
    a.reset().await.unwrap();
    assert!(db.sql("SELECT IS_FREE_LOCK('pins')").trim().ends_with('1'), "the reset released the lock");
    assert_released(&s, &mut b).await;
    // Table locks too: UNLOCK TABLES may not be all the session holds, so the pin lasts.
    a.query_drop("LOCK TABLES k.t READ").await.unwrap();
    assert_held(&s, "lock", &mut b).await;
    a.query_drop("UNLOCK TABLES").await.unwrap();
    assert!(!gets_through(&mut b).await);
    a.reset().await.unwrap();
    assert_released(&s, &mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_handler_pins_until_the_session_is_reset() {
    let (_db, s, mut a, mut b) =
        two_sessions("CREATE DATABASE h; CREATE TABLE h.t (id INT PRIMARY KEY); INSERT INTO h.t VALUES (1), (2), (3)").await;
    a.query_drop("USE h").await.unwrap();
    a.query_drop("HANDLER t OPEN").await.unwrap();
    let first: Option<i64> = a.query_first("HANDLER t READ `PRIMARY` FIRST").await.unwrap();
    assert_eq!(first, Some(1));
    assert_held(&s, "handler", &mut b).await;
    // The handler reads on from where it was.
    let next: Option<i64> = a.query_first("HANDLER t READ `PRIMARY` NEXT").await.unwrap();
    assert_eq!(next, Some(2));
    a.query_drop("HANDLER t CLOSE").await.unwrap();
    assert!(!gets_through(&mut b).await, "the pin lasts until the reset");
    a.reset().await.unwrap();
    assert_released(&s, &mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xa_pins_until_the_session_is_reset() {
    let (db, s, mut a, mut b) = two_sessions("CREATE DATABASE x; CREATE TABLE x.t (id INT)").await;
    a.query_drop("XA START 'pins'").await.unwrap();
    a.query_drop("INSERT INTO x.t VALUES (1)").await.unwrap();
    a.query_drop("XA END 'pins'").await.unwrap();
    assert_held(&s, "xa", &mut b).await;
    a.query_drop("XA PREPARE 'pins'").await.unwrap();
    assert!(!gets_through(&mut b).await, "a prepared XA transaction holds the connection");
    a.query_drop("XA COMMIT 'pins'").await.unwrap();
    assert!(db.sql("SELECT COUNT(*) FROM x.t").trim().ends_with('1'), "committed");
    assert!(!gets_through(&mut b).await, "the pin lasts until the reset");
    a.reset().await.unwrap();
    assert_released(&s, &mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_lock_on_all_tables_pins_until_the_session_is_reset() {
    let (_db, s, mut a, mut b) = two_sessions("CREATE DATABASE fl").await;
    a.query_drop("FLUSH TABLES WITH READ LOCK").await.unwrap();
    assert_held(&s, "lock", &mut b).await;
    a.query_drop("UNLOCK TABLES").await.unwrap();
    a.reset().await.unwrap();
    assert_released(&s, &mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_transaction_pins_until_the_next_statement() {
    let (db, s, mut a, mut b) =
        two_sessions("CREATE DATABASE st; CREATE TABLE st.t (id INT) ENGINE = InnoDB; INSERT INTO st.t VALUES (1)").await;
    a.query_drop("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE").await.unwrap();
    assert_held(&s, "set_transaction", &mut b).await;
    // The next transaction runs on that connection, at the level set for it.
    a.query_drop("START TRANSACTION").await.unwrap();
    let _: Vec<i64> = a.query("SELECT id FROM st.t").await.unwrap();
    let level = db.sql("SELECT trx_isolation_level FROM information_schema.INNODB_TRX");
    assert!(level.contains("SERIALIZABLE"), "{level}");
    a.query_drop("COMMIT").await.unwrap();
    assert_released(&s, &mut b).await;
    // Followed by a statement outside a transaction, it lasts just that long.
    a.query_drop("SET TRANSACTION READ ONLY").await.unwrap();
    assert_held(&s, "set_transaction", &mut b).await;
    a.query_drop("DO 1").await.unwrap();
    assert_released(&s, &mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_user_variables_than_are_read_back_pin_until_the_session_is_reset() {
    let (_db, s, mut a, mut b) = two_sessions("").await;
    // Up to 64 variables follow the session (`multiplex.rs`); one more and it stays put.
    let set = (1..=65).map(|i| format!("@v{i} = {i}")).collect::<Vec<_>>().join(", ");
    a.query_drop(format!("SET {set}")).await.unwrap();
    assert_held(&s, "user_variables", &mut b).await;
    let last: Option<i64> = a.query_first("SELECT @v65").await.unwrap();
    assert_eq!(last, Some(65));
    a.reset().await.unwrap();
    assert_released(&s, &mut b).await;
    let gone: Option<Option<i64>> = a.query_first("SELECT @v65").await.unwrap();
    assert_eq!(gone, Some(None), "the reset cleared them");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_sessions_keep_their_own_connection() {
    let db = MariaDb::start();
    // Multiplexing asked for, but no `[users]`: each session logs in to the server as its client.
    let s = TestConfig::new().proxy("workers = 1\nmultiplex = true\n").dbs(&[&db]).start();
    let before = app_threads(&db);
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let mut c = app(&s).await;
        let id: Option<u64> = c.query_first("SELECT CONNECTION_ID()").await.unwrap();
        sessions.push((c, id));
    }
    for (c, id) in &mut sessions {
        let again: Option<u64> = c.query_first("SELECT CONNECTION_ID()").await.unwrap();
        assert_eq!(again, *id, "a passthrough session stays on the connection its login made");
    }
    let after = app_threads(&db);
    assert_eq!(after - before, 3, "one connection per passthrough session, none shared");
    assert_eq!(pins(&s), vec!["passthrough_auth"; 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_run_from_a_literal_pins_whatever_ran_before_in_its_shape() {
    let (db, s, mut a, mut b) = two_sessions("").await;
    // Two statements of one shape (they differ in a literal's value alone): the first pins
    // nothing, the second takes a named lock.
    a.query_drop("EXECUTE IMMEDIATE 'DO 1'").await.unwrap();
    a.query_drop("EXECUTE IMMEDIATE 'DO 2'").await.unwrap();
    assert_released(&s, &mut b).await;
    a.query_drop("EXECUTE IMMEDIATE 'DO GET_LOCK(''lit'', 10)'").await.unwrap();
    assert_held(&s, "lock", &mut b).await;
    assert!(db.sql("SELECT IS_FREE_LOCK('lit')").trim().ends_with('0'), "the lock is held");
    a.reset().await.unwrap();
    assert_released(&s, &mut b).await;
}

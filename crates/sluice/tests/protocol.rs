//! Protocol corners that real applications hit: stored procedures whose cursors make MariaDB
//! set the cursor-exists flag on ordinary result sets, and KILL anywhere in a statement (each
//! statement of a multi-statement, prepared KILLs, every form MariaDB accepts).

mod common;

use common::*;
use mysql_async::prelude::*;
use mysql_async::{Conn, Row};

const CURSOR_PROC: &str = "CREATE PROCEDURE with_cursor()
BEGIN
  DECLARE done INT DEFAULT 0;
  DECLARE x INT;
  DECLARE total INT DEFAULT 0;
  DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = 1;
  OPEN c;
  r: LOOP
    FETCH c INTO x;
    IF done THEN LEAVE r; END IF;
    SET total = total + x;
  END LOOP;
  CLOSE c;
  SELECT total;
  SELECT id FROM t ORDER BY id;
END";

/// A cursor handler that signals: the procedure ends with the signalled error.
const SIGNAL_PROC: &str = "CREATE PROCEDURE with_signal()
BEGIN
  DECLARE x INT;
  DECLARE c CURSOR FOR SELECT id FROM t;
  DECLARE EXIT HANDLER FOR NOT FOUND
  BEGIN
    SELECT 'drained';
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'cursor drained';
  END;
  OPEN c;
  LOOP FETCH c INTO x; END LOOP;
END";

async fn cursor_procedures(c: &mut Conn) {
    c.query_drop("CREATE TABLE t (id INT PRIMARY KEY)").await.unwrap();
    c.query_drop("INSERT INTO t VALUES (1), (2), (3)").await.unwrap();
    c.query_drop(CURSOR_PROC).await.unwrap();
    c.query_drop(SIGNAL_PROC).await.unwrap();
}

async fn total_and_ids<P: mysql_async::prelude::Protocol>(mut r: mysql_async::QueryResult<'_, '_, P>) -> (Vec<i64>, Vec<i32>) {
    let total = r.collect().await.unwrap();
    let ids = r.collect().await.unwrap();
    r.drop_result().await.unwrap();
    (total, ids)
}

/// The error that ends a procedure's results.
async fn signalled<P: mysql_async::prelude::Protocol>(mut r: mysql_async::QueryResult<'_, '_, P>) -> String {
    let drained: Vec<String> = r.collect().await.expect("the handler's result set");
    assert_eq!(drained, vec!["drained".to_string()]);
    r.drop_result().await.expect_err("the handler signals").to_string()
}

#[tokio::test]
async fn procedures_with_cursors_return_their_results() {
    let s = shared_sluice();
    let mut direct = connect(&shared_db().addr(), "app", "apppw").await;
    fresh_db(&mut direct, "proto_cursor_proc").await;
    cursor_procedures(&mut direct).await;
    let r = direct.query_iter("CALL with_signal()").await.unwrap();
    assert!(signalled(r).await.contains("cursor drained"));
    let mut c = app(s).await;
    c.query_drop("USE proto_cursor_proc").await.unwrap();
    // Text protocol, then the binary protocol (COM_STMT_EXECUTE without a cursor).
    let r = c.query_iter("CALL with_cursor()").await.unwrap();
    assert_eq!(total_and_ids(r).await, (vec![6], vec![1, 2, 3]));
    let r = c.exec_iter("CALL with_cursor()", ()).await.unwrap();
    assert_eq!(total_and_ids(r).await, (vec![6], vec![1, 2, 3]));
    let r = c.query_iter("CALL with_signal()").await.unwrap();
    assert!(signalled(r).await.contains("cursor drained"));
    let r = c.exec_iter("CALL with_signal()", ()).await.unwrap();
    assert!(signalled(r).await.contains("cursor drained"));
    // The session goes on.
    let one: Option<i32> = c.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    // A client without CLIENT_DEPRECATE_EOF gets the EOF after the column definitions, where
    // MariaDB sets the cursor-exists flag.
    let caps = sluice_testkit::raw::CLIENT_CAPS & !sluice_proto::consts::cap::DEPRECATE_EOF;
    let mut raw = Raw::login_caps(&s.listen, "app", "apppw", Some("proto_cursor_proc"), caps);
    let r = raw.query("CALL with_cursor()");
    let eof_status: Vec<u16> = r.iter().filter(|p| p[0] == 0xfe && p.len() < 9).map(|p| u16::from_le_bytes([p[3], p[4]])).collect();
    assert!(eof_status.iter().any(|st| st & sluice_proto::consts::status::CURSOR_EXISTS != 0), "{eof_status:x?}");
    assert_eq!(r.last().map(|p| p[0]), Some(0), "the CALL's final OK arrives");
    assert_eq!(r.iter().filter(|p| p.as_slice() == b"\x011" || p.as_slice() == b"\x016").count(), 2, "rows 1 and 6");
    let one = raw.query("SELECT 1");
    assert!(one.iter().any(|p| p.as_slice() == b"\x011"), "the session goes on: {one:?}");
    // The same with the command-line client.
    let port = s.listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let out = cli(port, "app", "apppw", &["proto_cursor_proc"], "CALL with_cursor(); SELECT 'after'").expect("CALL through the CLI");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["6", "1", "2", "3", "after"]);
    // The session is not taken for one holding a cursor.
    let (_, body) = admin_get(s, "/sessions", None);
    let me = c.id();
    let v = json(&body);
    let mine = v.as_array().unwrap().iter().find(|x| x["id"] == me).expect("session listed").clone();
    assert!(!mine["pins"].to_string().contains("cursor"), "{mine}");
}

fn code_of(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
async fn kill_among_other_statements_is_translated() {
    let s = shared_sluice();
    let mut killer = app(s).await;
    // KILL QUERY inside a multi-statement interrupts the victim's query, by its sluice id.
    let victim = app(s).await;
    let victim_id = victim.id();
    let sleeper = run_in_background(victim, "SELECT SLEEP(61)");
    wait_running(&mut killer, "SELECT SLEEP(61)").await;
    let mut r = killer.query_iter(format!("KILL QUERY {victim_id}; SELECT 7")).await.unwrap();
    let _: Vec<Row> = r.collect().await.unwrap();
    let seven: Vec<i32> = r.collect().await.unwrap();
    drop(r);
    assert_eq!(seven, vec![7]);
    let (r, mut victim) = sleeper.await.unwrap();
    assert_eq!(r.map_err(|e| code_of(&e)), Err(Some(1317)), "the victim's query was interrupted");
    let one: Option<i32> = victim.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1), "KILL QUERY leaves the session");

    // A pooled driver's health check: KILL a connection, then SELECT 1.
    let mut r = killer.query_iter(format!("/* check */ KILL {victim_id}; SELECT 1")).await.unwrap();
    let _: Vec<Row> = r.collect().await.unwrap();
    let one: Vec<i32> = r.collect().await.unwrap();
    drop(r);
    assert_eq!(one, vec![1]);
    assert!(victim.query_drop("SELECT 1").await.is_err(), "the victim's session ended");

    // An unknown id fails as on a server, before anything runs.
    let e = killer.query_drop("KILL 4000000; SELECT 1").await.unwrap_err();
    assert_eq!(code_of(&e), Some(1094), "{e}");
    let one: Option<i32> = killer.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
}

#[tokio::test]
async fn kill_forms_that_cannot_be_translated_are_refused() {
    let s = shared_sluice();
    let mut c = app(s).await;
    let other = app(s).await;
    let id = other.id();
    for sql in [
        "KILL USER app".to_string(),
        "SELECT 1; KILL HARD USER 'app'@'%'".into(),
        "SET @id = 1; KILL @id".into(),
        format!("KILL {id} + 0"),
        format!("PREPARE s FROM 'KILL {id}'"),
        format!("EXECUTE IMMEDIATE 'KILL QUERY {id}'"),
        format!("/*!50000 SELECT 1; KILL SOFT CONNECTION ({id}) */"),
    ] {
        let e = c.query_drop(&sql).await.expect_err(&sql);
        assert_eq!(code_of(&e), Some(1235), "{sql}: {e}");
        assert!(e.to_string().contains("sluice"), "{sql}: {e}");
    }
    for sql in ["KILL ?".to_string(), format!("KILL QUERY {id}")] {
        let e = c.prep(&sql).await.expect_err(&sql);
        assert_eq!(code_of(&e), Some(1235), "{sql}: {e}");
    }
    // Nothing of it reached the other session.
    let mut other = other;
    let one: Option<i32> = other.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    // KILL QUERY ID names a query id of the server: relayed as it is.
    let e = c.query_drop("SELECT 1; KILL QUERY ID 999999999").await.unwrap_err();
    assert_eq!(code_of(&e), Some(1957), "{e}");
    // A KILL inside a stored program's body is the program's: relayed as it is.
    fresh_db(&mut c, "proto_kill_body").await;
    c.query_drop("CREATE PROCEDURE k(i INT) BEGIN KILL QUERY i; END").await.unwrap();
}

/// A KILL among other statements reaches a session between statements on any backend (sluice
/// ends it, as a KILL alone would), and is refused for one running a statement on another
/// backend (the query's own backend cannot kill that thread).
#[tokio::test]
async fn kill_of_a_busy_session_on_another_backend_in_a_multi_statement_is_refused() {
    // The same server twice: two backends, sessions spread by least connections.
    let addr = shared_db().addr();
    let s = TestConfig::new().backend_with(&addr, "name = \"a\"\n").backend_with(&addr, "name = \"b\"\n").start();
    let mut a = app(&s).await;
    let b = app(&s).await;
    let (_, body) = admin_get(&s, "/sessions", None);
    let v = json(&body);
    let backend_of = |id: u32| v.as_array().unwrap().iter().find(|x| x["id"] == id).map(|x| x["backend"].clone());
    assert_ne!(backend_of(a.id()), backend_of(b.id()), "the two sessions are on different backends");
    let b_id = b.id();
    let running = run_in_background(b, "SELECT SLEEP(2.5)");
    wait_running(&mut a, "SELECT SLEEP(2.5)").await;
    let e = a.query_drop(format!("KILL {b_id}; SELECT 1")).await.unwrap_err();
    assert_eq!(code_of(&e), Some(1235), "{e}");
    assert!(e.to_string().contains("another backend"), "{e}");
    let (r, mut b) = running.await.unwrap();
    r.unwrap();
    let one: Option<i32> = b.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    // Between statements it is ended where the KILL stands.
    let mut r = a.query_iter(format!("KILL {b_id}; SELECT 1")).await.unwrap();
    let _: Vec<Row> = r.collect().await.unwrap();
    let _: Vec<Row> = r.collect().await.unwrap();
    drop(r);
    assert!(b.query_drop("SELECT 1").await.is_err(), "the session ended");
}

#[test]
fn multi_statements_follow_com_set_option() {
    use sluice_proto::consts::{cap, com};
    let s = shared_sluice();
    let caps = sluice_testkit::raw::CLIENT_CAPS & !cap::MULTI_STATEMENTS;
    let mut r = Raw::login_caps(&s.listen, "app", "apppw", None, caps);
    // Without multi-statements the server refuses the second statement before running any.
    let e = r.query("SELECT 1; KILL USER app");
    assert_eq!(err_code(&e[0]), Some(1064), "{:?}", String::from_utf8_lossy(&e[0]));
    // Turned on, every statement is looked at.
    assert_eq!(r.command(&[com::SET_OPTION, 0, 0])[0][0], 0xfe);
    let e = r.query("SELECT 1; KILL USER app");
    assert_eq!(err_code(&e[0]), Some(1235), "{:?}", String::from_utf8_lossy(&e[0]));
    assert_eq!(r.command(&[com::SET_OPTION, 1, 0])[0][0], 0xfe);
    let e = r.query("SELECT 1; KILL USER app");
    assert_eq!(err_code(&e[0]), Some(1064), "{:?}", String::from_utf8_lossy(&e[0]));
}

//! The SQL admin listener with real clients (the `mariadb` command-line client and
//! mysql_async): read-only SELECTs over backends, sessions, digests and the configuration, the
//! verbs as statements, errors that name what exists, and its own users.

mod common;

use common::*;
use mysql_async::prelude::*;

fn admin_cli(addr: &str, user: &str, pass: &str, sql: &str) -> Result<String, String> {
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    cli(port, user, pass, &[], sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_read_and_act_through_sql() {
    let db = shared_db();
    let path = config_path("sqladmin");
    let cfg = TestConfig::new()
        .admin("sql_listen = \"127.0.0.1:0\"\n[[admin.sql_users]]\nname = \"ops\"\npassword = \"opspw\"\n")
        .app_users()
        .backend_with(&db.addr(), "name = \"a\"\n")
        .backend_with(&db.addr(), "name = \"b\"\n")
        .table("digests", "enabled = true\n");
    std::fs::write(&path, cfg.text()).unwrap();
    let s = start_sluice_file(&path);
    let addr = sql_admin_addr(&s);
    let mut app = app(&s).await;
    let _: Option<u32> = app.query_first("SELECT 41 + 1").await.unwrap();

    // The mysql command-line client, as an operator uses it.
    let out = admin_cli(&addr, "ops", "opspw", "SELECT name, up, draining FROM backends").unwrap();
    assert_eq!(out.lines().collect::<Vec<_>>(), ["a\ttrue\tfalse", "b\ttrue\tfalse"], "{out}");
    let tables = admin_cli(&addr, "ops", "opspw", "SHOW TABLES").unwrap();
    assert!(tables.contains("sessions") && tables.contains("digests"), "{tables}");
    let e = admin_cli(&addr, "ops", "wrong", "SELECT 1").unwrap_err();
    assert!(e.contains("1045"), "{e}");
    let e = admin_cli(&addr, "app", "apppw", "SELECT 1").unwrap_err();
    assert!(e.contains("1045"), "the proxy's users are not the admin's: {e}");

    // mysql_async: rows with the session's fields, filters, limits.
    let mut ops = connect(&addr, "ops", "opspw").await;
    let rows: Vec<(String, String, String)> = ops.query("SELECT id, user, backend FROM sessions WHERE user = 'app'").await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (id, on) = (rows[0].0.clone(), rows[0].2.clone());
    let text: Vec<String> = ops.query("SELECT text FROM digests").await.unwrap();
    assert!(text.iter().any(|t| t == "select ? + ?"), "{text:?}");
    let max: Option<String> = ops.query_first("SELECT value FROM config WHERE key = 'proxy.max_connections'").await.unwrap();
    assert!(max.is_some_and(|m| m.parse::<u64>().is_ok()));
    let one: Vec<String> = ops.query("SELECT name FROM backends LIMIT 1").await.unwrap();
    assert_eq!(one, ["a"]);
    let shown: Vec<String> = ops.query("SELECT value FROM config WHERE key = 'admin.sql_users[0].password'").await.unwrap();
    assert_eq!(shown, ["********"], "secrets masked");

    // Errors name what exists.
    let err = |r: Result<Vec<String>, mysql_async::Error>| r.expect_err("an error").to_string();
    let e = err(ops.query("SELECT * FROM nope").await);
    assert!(e.contains("1146") && e.contains("backends, sessions, digests, config"), "{e}");
    let e = err(ops.query("SELECT nope FROM backends").await);
    assert!(e.contains("1054") && e.contains("name") && e.contains("weight"), "{e}");
    let e = err(ops.query("DELETE FROM backends").await);
    assert!(e.contains("1064") && e.contains("DRAIN BACKEND"), "{e}");
    let e = err(ops.query("DRAIN BACKEND 'zzz'").await);
    assert!(e.contains("backends are a, b"), "{e}");

    // The verbs: drain (the session moves), undrain, reload, kill.
    ops.query_drop(format!("DRAIN BACKEND '{on}'")).await.unwrap();
    let draining: Option<String> = ops.query_first(format!("SELECT draining FROM backends WHERE name = '{on}'")).await.unwrap();
    assert_eq!(draining.as_deref(), Some("true"));
    let _: Option<u32> = app.query_first("SELECT 2").await.unwrap();
    let now: Option<String> = ops.query_first(format!("SELECT backend FROM sessions WHERE id = {id}")).await.unwrap();
    assert_ne!(now.as_deref(), Some(on.as_str()), "the session moved off the drained backend");
    ops.query_drop(format!("UNDRAIN BACKEND '{on}'")).await.unwrap();
    ops.query_drop("RELOAD CONFIG").await.unwrap();
    assert_eq!(metric(&s, "sluice_config_reloads_total"), 1);
    ops.query_drop(format!("KILL SESSION {id}")).await.unwrap();
    wait_for("the session killed", || admin_get(&s, "/sessions", None).1.trim() == "[]");
    assert!(app.query_drop("SELECT 3").await.is_err());
    ops.disconnect().await.unwrap();
}

/// What clients of the admin listener got wrong answers for: `SELECT *` of an empty table (a
/// result with no column, which drivers refuse with 2027), `SET PASSWORD` (answered OK, and
/// nothing changed), a session id past 32 bits (said to be 0), and a statement past the
/// listener's limit (a bare reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_answers_are_right() {
    let db = shared_db();
    let s = TestConfig::new()
        .admin("sql_listen = \"127.0.0.1:0\"\n[[admin.sql_users]]\nname = \"ops\"\npassword = \"opspw\"\n")
        .app_users()
        .backend(&db.addr())
        .start();
    let addr = sql_admin_addr(&s);
    let mut ops = connect(&addr, "ops", "opspw").await;
    // No session: the columns a session has, and no row.
    let rows = ops.query_iter("SELECT * FROM sessions").await.unwrap();
    let columns = rows.columns().map(|c| c.len()).unwrap_or(0);
    assert!(columns > 5, "{columns} columns");
    drop(rows);
    let e = ops.query_drop("SET PASSWORD = PASSWORD('x')").await.unwrap_err();
    assert!(e.to_string().contains("1227"), "{e}");
    let e = ops.query_drop("KILL SESSION 4294967296").await.unwrap_err().to_string();
    assert!(e.contains("4294967296") && !e.contains("id: 0"), "{e}");
    // A statement of 2 MiB: an error, then the connection closes.
    let mut raw = Raw::login(&addr, "ops", "opspw", None);
    let mut big = vec![sluice_proto::consts::com::QUERY];
    big.extend(std::iter::repeat_n(b' ', 2 << 20));
    raw.write_packet(0, &big).unwrap();
    let (_, answer) = raw.read_packet().expect("an answer before the close");
    assert_eq!(err_code(&answer), Some(1153), "{}", String::from_utf8_lossy(&answer));
    assert!(raw.is_closed());
}

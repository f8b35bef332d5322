//! TLS by default: clients get TLS from sluice with no configuration (a self-signed certificate
//! generated at start), `tls = "off"` turns it off, and the backend leg follows the client's
//! ("auto"), always uses TLS ("on") or never ("off"), so that `REQUIRE SSL` users log in through
//! sluice and `Ssl_cipher` tells the truth about the whole path. Pooled connections, session
//! moves and KILL on another backend keep to the same rule.

mod common;

use common::*;
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};

/// `[[users]]` for users mode (with none, listeners relay logins: passthrough).
/// Both auth modes, by name: in users mode, app and the REQUIRE SSL user sec are configured.
const MODES: [(&str, bool); 2] = [("passthrough", false), ("users", true)];

/// Sluice with one worker in front of `dbs` (each backend with `backend` keys), `proxy` keys,
/// and in users mode (`users`) app and sec.
fn config(dbs: &[&MariaDb], backend: &str, proxy: &str, users: bool) -> TestConfig {
    let c = dbs.iter().fold(TestConfig::new(), |c, d| c.backend_with(&d.addr(), backend)).proxy(&format!("workers = 1\n{proxy}"));
    if users { c.user("app", "password = \"apppw\"\n").user("sec", "password = \"secpw\"\n") } else { c }
}

/// A server with TLS and a user that must use it.
fn tls_db_with_require_ssl_user() -> (MariaDb, std::path::PathBuf) {
    let (db, ca) = start_tls_db();
    db.sql("CREATE USER 'sec'@'%' IDENTIFIED BY 'secpw' REQUIRE SSL; GRANT ALL ON *.* TO 'sec'@'%'");
    (db, ca)
}

async fn connect_tls(addr: &str, user: &str, pass: &str) -> Result<Conn, mysql_async::Error> {
    Conn::new(Opts::from(tls_opts(addr, user, pass))).await
}

async fn connect_plain(addr: &str, user: &str, pass: &str) -> Result<Conn, mysql_async::Error> {
    Conn::new(Opts::from(opts(addr, user, pass))).await
}

/// The admin API's view of the session with sluice connection id `id`.
fn session(s: &SluiceProc, id: u32) -> serde_json::Value {
    let all = json(&admin_get(s, "/sessions", None).1);
    all.as_array().and_then(|a| a.iter().find(|x| x["id"] == id).cloned()).unwrap_or_else(|| panic!("no session {id} in {all}"))
}

#[tokio::test]
async fn clients_that_require_tls_get_it_with_no_configuration_and_not_with_tls_off() {
    let db = shared_db();
    // Quick-start flags only: no configuration file, no certificate.
    let s = start_sluice(&[db], &[]);
    let mut c = connect_tls(&s.listen, "app", "apppw").await.expect("a client that requires TLS logs in");
    let one: Option<i32> = c.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    let me = session(&s, c.id());
    assert_eq!((me["tls"].as_bool(), me["backend_tls"].as_bool()), (Some(true), Some(false)), "{me}");
    // The backend offers no TLS: the server says so, as it would to a direct client.
    assert_eq!(ssl_cipher(&mut c).await, "");
    c.disconnect().await.unwrap();
    // The command-line client asked to use TLS.
    assert_eq!(cli(s.port(), "app", "apppw", &["--ssl"], "SELECT 40+2").unwrap(), "42");
    let log = s.log_text();
    assert!(log.contains("self-signed certificate generated in memory") && log.contains("sha256="), "{log}");
    assert!(!log.contains("PRIVATE KEY"), "{log}");

    let off = TestConfig::new().root("tls = \"off\"\n").dbs(&[db]).start();
    let e = connect_tls(&off.listen, "app", "apppw").await.expect_err("no TLS with tls = \"off\"");
    assert!(e.to_string().to_lowercase().contains("ssl") || e.to_string().to_lowercase().contains("secure"), "{e}");
    let mut plain = connect_plain(&off.listen, "app", "apppw").await.expect("plain clients still log in");
    plain.ping().await.unwrap();
    assert!(off.log_text().contains("client TLS is off"));
}

#[tokio::test]
async fn require_ssl_users_log_in_through_sluice_and_ssl_cipher_tells_the_truth() {
    let (db, _) = tls_db_with_require_ssl_user();
    for (mode, users) in MODES {
        let s = config(&[&db], "", "", users).start();
        // A TLS client: the backend leg is TLS too ("auto").
        let mut c = connect_tls(&s.listen, "sec", "secpw").await.unwrap_or_else(|e| panic!("{mode}: REQUIRE SSL user over TLS: {e}"));
        assert!(!ssl_cipher(&mut c).await.is_empty(), "{mode}: the backend leg is encrypted");
        assert_eq!(session(&s, c.id())["backend_tls"], true, "{mode}");
        let backend = &json(&admin_get(&s, "/backends", None).1)[0];
        assert_eq!((backend["tls"].as_str(), backend["offers_tls"].as_bool()), (Some("auto"), Some(true)), "{backend}");
        // A plain client: a plain backend leg, and the REQUIRE SSL user is refused by the server.
        let mut p = connect_plain(&s.listen, "app", "apppw").await.unwrap();
        assert_eq!(ssl_cipher(&mut p).await, "", "{mode}: a plain client's backend leg is plain");
        let e = connect_plain(&s.listen, "sec", "secpw").await.expect_err("REQUIRE SSL without TLS");
        assert!(e.to_string().contains("1045"), "{mode}: {e}");
        c.disconnect().await.unwrap();
        p.disconnect().await.unwrap();
    }
}

#[tokio::test]
async fn backend_tls_off_and_on() {
    let (db, ca) = tls_db_with_require_ssl_user();
    for (_, users) in MODES {
        // "off": never, so the REQUIRE SSL user cannot log in even over a TLS client leg.
        let off = config(&[&db], "", "backend_tls = \"off\"\n", users).start();
        let e = connect_tls(&off.listen, "sec", "secpw").await.expect_err("REQUIRE SSL over a plain backend leg");
        assert!(e.to_string().contains("1045"), "{e}");
        let mut c = connect_tls(&off.listen, "app", "apppw").await.unwrap();
        assert_eq!(ssl_cipher(&mut c).await, "");
        // "on" (per backend, verified against its CA): a plain client's backend leg is TLS.
        let verified = format!("tls = \"on\"\ntls_ca = \"{}\"\n", ca.display());
        let on = config(&[&db], &verified, "", users).start();
        let mut p = connect_plain(&on.listen, "app", "apppw").await.unwrap();
        assert!(!ssl_cipher(&mut p).await.is_empty(), "backend_tls = \"on\" encrypts a plain client's backend leg");
        let mut sec = connect_plain(&on.listen, "sec", "secpw").await.expect("REQUIRE SSL user over a TLS backend leg");
        sec.ping().await.unwrap();
    }
    // "on" with a backend that offers no TLS: the login fails and says why, and health checks
    // take the backend down.
    let s = TestConfig::new()
        .backend_with(&shared_db().addr(), "tls_skip_verify = true\n")
        .proxy("backend_tls = \"on\"\n")
        .table("health", "interval = \"100ms\"\nfall = 1\n")
        .start();
    let e = connect_plain(&s.listen, "app", "apppw").await.expect_err("no TLS to be had");
    assert!(e.to_string().contains("does not offer TLS"), "{e}");
    wait_for("the backend is down", || admin_get(&s, "/backends", None).1.contains("\"up\":false"));
    assert!(admin_get(&s, "/backends", None).1.contains("does not offer TLS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_go_only_to_clients_with_the_same_tls() {
    let (db, _) = tls_db_with_require_ssl_user();
    let pooled = |s: &SluiceProc| metric_sum(s, "sluice_backend_pool_idle{");
    let reused = |s: &SluiceProc| metric_sum(s, "sluice_backend_pool_reused_total{");
    for (mode, users) in MODES {
        let s = config(&[&db], "", "", users).start();
        // A plain client leaves its (plain) backend connection in the pool.
        connect_plain(&s.listen, "app", "apppw").await.unwrap().disconnect().await.unwrap();
        wait_for("the plain connection is pooled", || pooled(&s) == 1);
        // A TLS client does not take it: it gets a TLS backend leg of its own.
        let mut t = connect_tls(&s.listen, "app", "apppw").await.unwrap();
        assert!(!ssl_cipher(&mut t).await.is_empty(), "{mode}: a TLS client got a plain pooled connection");
        assert_eq!(reused(&s), 0, "{mode}");
        t.disconnect().await.unwrap();
        wait_for("both connections are pooled", || pooled(&s) == 2);
        // Each kind goes to a client of its kind.
        let mut p = connect_plain(&s.listen, "app", "apppw").await.unwrap();
        assert_eq!(ssl_cipher(&mut p).await, "", "{mode}: a plain client got a TLS pooled connection");
        let mut t = connect_tls(&s.listen, "sec", "secpw").await.unwrap();
        assert!(!ssl_cipher(&mut t).await.is_empty(), "{mode}");
        assert_eq!(reused(&s), 2, "{mode}");
    }
}

async fn port_of(c: &mut Conn) -> u16 {
    c.query_first("SELECT @@port").await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_require_ssl_session_kills_and_moves_over_tls() {
    let (a, _) = tls_db_with_require_ssl_user();
    let (b, _) = tls_db_with_require_ssl_user();
    let s = config(&[&a, &b], "", "balance = \"round-robin\"\n", true).start();
    let mut first = connect_tls(&s.listen, "sec", "secpw").await.unwrap();
    let mut second = connect_tls(&s.listen, "sec", "secpw").await.unwrap();
    let port = port_of(&mut first).await;
    assert_ne!(port, port_of(&mut second).await, "round-robin spreads the two sessions");

    // KILL of a session on the other backend: sluice logs in there as the killer, over TLS (or
    // the server would refuse the REQUIRE SSL user).
    first.query_drop(format!("KILL {}", second.id())).await.expect("KILL of a session on another backend");
    wait_for("the killed session is gone", || json(&admin_get(&s, "/sessions", None).1).as_array().is_some_and(|l| l.len() == 1));
    second.query_drop("SELECT 1").await.expect_err("the killed session is closed");

    // The survivor's backend connection is killed behind sluice's back: the idle session logs
    // in again at its next statement, over TLS.
    let thread: Option<u32> = first.query_first("SELECT CONNECTION_ID()").await.unwrap();
    let db = if port == a.port { &a } else { &b };
    db.sql(&format!("KILL {}", thread.unwrap()));
    wait_for("sluice sees the lost connection", || s.log_text().contains("the session moves at its next command"));
    assert!(!ssl_cipher(&mut first).await.is_empty(), "the moved session's backend leg is encrypted");
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"failure\",result=\"moved\"}"), 1);
}

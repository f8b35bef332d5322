//! The backend connection pool: a session that ends cleanly leaves its backend connection to the
//! next login, which takes it with COM_CHANGE_USER and finds it reset; connections that hold
//! what a reset would end too late are closed instead; stale, idled-out and refused pooled
//! connections cost the client nothing.

mod common;

use common::*;
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};

/// One worker, so that every login can take what the previous session left.
fn config(db: &MariaDb, auth: &str, extra: &str) -> String {
    TestConfig::new().listener(&format!("{auth}\n")).proxy(&format!("workers = 1\n{extra}\n")).dbs(&[db]).app_users().text()
}

const PASSTHROUGH: &str = "auth = \"passthrough\"";
const USERS: &str = "auth = \"users\"";

fn pooled(s: &SluiceProc) -> u64 {
    metric_sum(s, "sluice_backend_pool_idle{")
}

fn reused(s: &SluiceProc) -> u64 {
    metric_sum(s, "sluice_backend_pool_reused_total{")
}

async fn id_of(c: &mut Conn) -> u32 {
    c.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap()
}

/// Whether the server still has a connection with this id.
fn alive(db: &MariaDb, id: u32) -> bool {
    db.sql(&format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id}")).trim() == "1"
}

/// Opens a session, lets `f` use it, closes it properly, and returns its backend connection id.
async fn session_then_quit(s: &SluiceProc, user: &str, pass: &str, sql: &[&str]) -> u32 {
    let mut c = connect(&s.listen, user, pass).await;
    let id = id_of(&mut c).await;
    for q in sql {
        c.query_drop(*q).await.unwrap();
    }
    c.disconnect().await.unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_login_takes_the_backend_connection_reset_to_its_own_user_and_schema() {
    let db = shared_db();
    for auth in [PASSTHROUGH, USERS] {
        let s = start_sluice_config(&config(db, auth, ""));
        let id = session_then_quit(&s, "app", "apppw", &["SET @x = 1", "SET SESSION sql_mode = 'ANSI'", "USE mysql"]).await;
        wait_for("the connection is pooled", || pooled(&s) == 1);
        assert!(alive(db, id), "a pooled connection stays open on the server");

        // Another user, with a schema: same server connection, nothing of the first session.
        let opts = opts(&s.listen, "other", "otherpw").db_name(Some("test"));
        let mut c = Conn::new(Opts::from(opts)).await.unwrap();
        assert_eq!(id_of(&mut c).await, id, "{auth}: the pooled connection is reused");
        let row: (Option<i64>, String, String, String) =
            c.query_first("SELECT @x, @@sql_mode, CURRENT_USER(), DATABASE()").await.unwrap().unwrap();
        assert_eq!(row.0, None, "{auth}: user variables are gone");
        assert!(!row.1.contains("ANSI"), "{auth}: sql_mode is the server's default again: {}", row.1);
        assert_eq!(row.2, "other@%", "{auth}");
        assert_eq!(row.3, "test", "{auth}");
        assert_eq!(reused(&s), 1);
        assert_eq!(pooled(&s), 0);
        // The session works as any other.
        let n: i64 = c.query_first("SELECT COUNT(*) FROM information_schema.SCHEMATA").await.unwrap().unwrap();
        assert!(n > 0);
        c.disconnect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_session_leaves_open_ends_when_it_ends_not_when_its_connection_is_reused() {
    let db = shared_db();
    db.sql("CREATE DATABASE IF NOT EXISTS pool; CREATE TABLE IF NOT EXISTS pool.t (id INT PRIMARY KEY)");
    let s = start_sluice_config(&config(db, PASSTHROUGH, ""));
    // A transaction with a row lock, a named lock, a temporary table made where no lexer looks.
    db.sql("CREATE PROCEDURE IF NOT EXISTS pool.hide() CREATE TEMPORARY TABLE pool.tmp (x INT)");
    let id = session_then_quit(
        &s,
        "app",
        "apppw",
        &["BEGIN", "INSERT INTO pool.t VALUES (1)", "DO GET_LOCK('pool_lock', 0)", "CALL pool.hide()"],
    )
    .await;
    wait_for("the connection is pooled", || pooled(&s) == 1);
    assert!(alive(db, id));
    // Nothing is held while it waits in the pool: the row is not there and not locked, the
    // named lock is free.
    assert_eq!(db.sql("SET SESSION innodb_lock_wait_timeout = 1; INSERT INTO pool.t VALUES (1); SELECT COUNT(*) FROM pool.t").trim(), "1");
    assert_eq!(db.sql("SELECT GET_LOCK('pool_lock', 0)").trim(), "1");
    // The next session on that connection has no temporary table.
    let mut c = app(&s).await;
    assert_eq!(id_of(&mut c).await, id);
    let e = c.query_drop("SELECT * FROM pool.tmp").await.expect_err("no temporary table");
    assert!(e.to_string().contains("1146"), "{e}");
    c.disconnect().await.unwrap();
    db.sql("DROP DATABASE pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_or_a_stale_pooled_connection_costs_the_next_client_nothing() {
    let db = shared_db();
    for auth in [PASSTHROUGH, USERS] {
        let s = start_sluice_config(&config(db, auth, ""));
        session_then_quit(&s, "app", "apppw", &[]).await;
        wait_for("pooled", || pooled(&s) == 1);
        // A wrong password gets the server's (or sluice's) refusal, as without a pool.
        let e = Conn::new(Opts::from(opts(&s.listen, "app", "wrong"))).await.expect_err("refused");
        assert!(e.to_string().contains("1045"), "{auth}: {e}");

        // Pooled connections the server closed meanwhile are skipped.
        let a = session_then_quit(&s, "app", "apppw", &[]).await;
        wait_for("pooled", || pooled(&s) >= 1);
        db.sql(&format!("KILL {a}"));
        wait_for("the server closed it", || !alive(db, a));
        let mut c = app(&s).await;
        assert_ne!(id_of(&mut c).await, a, "{auth}");
        c.query_drop("SELECT 1").await.unwrap();
        c.disconnect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_idle_out_with_a_quit_and_a_client_with_other_capabilities_gets_its_own() {
    // A server of its own: Aborted_clients counts for the whole server, and the other tests of
    // this binary end by killing a sluice that holds pooled connections.
    let own = MariaDb::start();
    let db = &own;
    let s = start_sluice_config(&config(db, PASSTHROUGH, "pool_idle_timeout = \"300ms\""));
    let aborted = || db.sql("SHOW GLOBAL STATUS LIKE 'Aborted_clients'");
    let before = aborted();
    let id = session_then_quit(&s, "app", "apppw", &[]).await;
    wait_for("pooled", || pooled(&s) == 1);
    // CLIENT_FOUND_ROWS changes what UPDATE reports: such a client never shares a connection
    // logged in without it.
    let mut other = Conn::new(Opts::from(opts(&s.listen, "app", "apppw").client_found_rows(true))).await.unwrap();
    assert_ne!(id_of(&mut other).await, id);
    other.disconnect().await.unwrap();
    wait_for("idled out", || pooled(&s) == 0);
    wait_for("closed on the server", || !alive(db, id));
    assert_eq!(aborted(), before, "closed with COM_QUIT");

    // pool_idle_max = 0: every login gets a new connection.
    let off = start_sluice_config(&config(db, PASSTHROUGH, "pool_idle_max = 0"));
    let first = session_then_quit(&off, "app", "apppw", &[]).await;
    let second = session_then_quit(&off, "app", "apppw", &[]).await;
    assert_ne!(first, second);
    assert_eq!(pooled(&off), 0);
}

/// A session that ran nothing but pings left nothing on its backend connection, which goes back
/// to the pool without COM_RESET_CONNECTION; one that ran anything else is reset first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_session_that_ran_something_is_reset_on_its_way_into_the_pool() {
    use sluice_proto::consts::com;
    use sluice_testkit::raw::{Raw, err_code};
    let db = shared_db();
    for auth in [PASSTHROUGH, USERS] {
        let s = start_sluice_config(&config(db, auth, ""));
        let resets = || metric_sum(&s, "sluice_backend_pool_resets_total{");
        let mut r = Raw::login(&s.listen, "app", "apppw", None);
        assert_eq!(r.command(&[com::PING]).len(), 1);
        r.write_packet(0, &[com::QUIT]).unwrap();
        wait_for("pooled", || pooled(&s) == 1);
        assert_eq!(resets(), 0, "{auth}: nothing to reset");

        // The next login takes that connection and uses it; now it has something to reset.
        let mut r = Raw::login(&s.listen, "app", "apppw", None);
        assert_eq!((reused(&s), pooled(&s)), (1, 0), "{auth}");
        let answer = r.query("SET @x = 1");
        assert_eq!(answer.len(), 1, "{auth}: {answer:?}");
        assert_eq!(err_code(&answer[0]), None, "{auth}");
        r.write_packet(0, &[com::QUIT]).unwrap();
        wait_for("pooled again", || pooled(&s) == 1);
        assert_eq!(resets(), 1, "{auth}");
    }
}

/// A full pool makes room: the connection idle longest is closed for the newcomer, so clients
/// that no pooled connection fits (other capabilities) still get theirs pooled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_closes_the_connection_idle_longest_to_keep_a_new_one() {
    use sluice_proto::consts::com;
    use sluice_testkit::raw::Raw;
    let db = shared_db();
    let s = start_sluice_config(&config(db, PASSTHROUGH, "pool_idle_max = 1"));
    let first = session_then_quit(&s, "app", "apppw", &[]).await;
    wait_for("pooled", || pooled(&s) == 1);
    // A client with other capabilities cannot take it, and its own connection takes its place.
    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    assert_eq!(reused(&s), 0, "this client does not fit the pooled connection");
    r.write_packet(0, &[com::QUIT]).expect("send COM_QUIT");
    wait_for("the connection idle longest is closed", || !alive(db, first));
    assert_eq!(pooled(&s), 1);
    // The next such client takes the newcomer.
    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    assert_eq!((reused(&s), pooled(&s)), (1, 0));
    r.write_packet(0, &[com::QUIT]).expect("send COM_QUIT");
}

/// A server at its connection limit while sluice keeps idle connections to it: the login that
/// the server refuses with 1040 Too many connections gets through, because sluice closes its
/// idle connections (with COM_QUIT) and tries again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_at_its_connection_limit_gets_the_pools_idle_connections_back() {
    // A server of its own: its connection limit is lowered.
    let own = MariaDb::start();
    let db = &own;
    db.sql("SET GLOBAL max_connections = 12");
    for auth in [PASSTHROUGH, USERS] {
        // Health checks that open no connection of their own while the server is full.
        let config = TestConfig::new()
            .listener(&format!("{auth}\n"))
            .proxy("workers = 1\n")
            .table("health", "interval = \"1h\"\n")
            .dbs(&[db])
            .app_users()
            .text();
        let s = start_sluice_config(&config);
        // Four sessions at once leave four connections in the pool.
        let mut sessions = Vec::new();
        for _ in 0..4 {
            sessions.push(app(&s).await);
        }
        for c in sessions {
            c.disconnect().await.unwrap();
        }
        wait_for("four connections pooled", || pooled(&s) == 4);

        // Others take every place the server has left.
        let mut held = Vec::new();
        let refused = loop {
            match Conn::new(Opts::from(opts(&db.addr(), "app", "apppw"))).await {
                Ok(c) => held.push(c),
                Err(e) => break e,
            }
            assert!(held.len() < 20, "the server took more connections than its limit");
        };
        assert!(refused.to_string().contains("1040"), "{auth}: {refused}");

        // A client no pooled connection fits needs a new one: it gets it.
        let mut c = Conn::new(Opts::from(opts(&s.listen, "app", "apppw").client_found_rows(true)))
            .await
            .unwrap_or_else(|e| panic!("{auth}: the login was refused: {e}"));
        c.query_drop("SELECT 1").await.unwrap();
        assert_eq!(metric_sum(&s, "sluice_backend_idle_released_total{"), 4, "{auth}");
        assert_eq!(pooled(&s), 0, "{auth}");
        c.disconnect().await.unwrap();
        drop(s);
        for c in held {
            c.disconnect().await.unwrap();
        }
    }
}

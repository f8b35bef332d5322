//! Users mode and multiplexing as transparent as a direct connection: what each session sees of
//! its own state (character sets from its login and its statements, session tracking, its
//! transactions and savepoints, its prepared statements on the server, KILL), compared with
//! what the same client sees directly, while many sessions share few backend connections.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_proto::basic::{self, StateChange};
use sluice_proto::consts::{cap, status};
use sluice_testkit::raw::{CLIENT_CAPS, Raw, err_code};

/// A multiplexing sluice (one worker, `max` backend connections) in front of `db`.
fn mux(db: &MariaDb, max: usize) -> SluiceProc {
    TestConfig::new()
        .proxy(&format!("workers = 1\nmultiplex = true\nmax_backend_connections = {max}\nqueue_timeout = \"20s\"\n"))
        .dbs(&[db])
        .app_users()
        .start()
}

/// How one session sets itself up: its login's collation (id) and the statements it runs once.
struct Profile {
    collation: u8,
    setup: &'static [&'static str],
    /// Its character set holds four-byte characters.
    four_bytes: bool,
}

const PROFILES: [Profile; 10] = [
    Profile { collation: 8, setup: &[], four_bytes: false },
    Profile { collation: 33, setup: &[], four_bytes: false },
    Profile { collation: 45, setup: &["SET time_zone = '+03:00'"], four_bytes: true },
    Profile { collation: 45, setup: &["SET NAMES latin1"], four_bytes: false },
    Profile { collation: 224, setup: &["SET character_set_results = NULL", "SET sql_mode = 'ANSI_QUOTES'"], four_bytes: true },
    Profile { collation: 33, setup: &["SET NAMES utf8mb4 COLLATE utf8mb4_bin", "SET time_zone = '-05:00'"], four_bytes: true },
    Profile { collation: 8, setup: &["SET collation_connection = latin1_bin"], four_bytes: false },
    Profile { collation: 45, setup: &[], four_bytes: true },
    Profile { collation: 224, setup: &["SET NAMES utf8mb4"], four_bytes: true },
    Profile { collation: 45, setup: &["SET NAMES utf8mb4 COLLATE utf8mb4_bin", "SET NAMES utf8mb4"], four_bytes: true },
];

const STATE: &str = "SELECT @@character_set_client, @@character_set_connection, @@character_set_results, \
                     @@collation_connection, @@time_zone, @@sql_mode";

/// Many sessions with different character sets (from their logins and from `SET NAMES`),
/// `character_set_results` NULL, time zones and SQL modes, on two backend connections: each
/// checks its own state, and the bytes of a text it wrote, at every statement. A connection
/// another session left in its own character set must come back to this session's, whether
/// that was set at login or by a statement.
#[test]
fn every_session_keeps_its_own_character_set_and_state_on_shared_connections() {
    let db = MariaDb::start();
    db.sql("CREATE DATABASE cs; CREATE TABLE cs.t (id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET utf8mb4)");
    let s = mux(&db, 2);
    // What each profile's state is directly.
    let want: Vec<Vec<Option<String>>> = PROFILES
        .iter()
        .map(|p| {
            let mut r = Raw::login_as(&db.addr(), "app", "apppw", Some("cs"), CLIENT_CAPS, p.collation);
            p.setup.iter().for_each(|q| assert_eq!(err_code(&r.query(q)[0]), None, "{q}"));
            r.row(STATE)
        })
        .collect();
    let addr = s.listen.clone();
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let (addr, want) = (addr.clone(), want[i % PROFILES.len()].clone());
            std::thread::spawn(move || {
                let p = &PROFILES[i % PROFILES.len()];
                let mut r = Raw::login_as(&addr, "app", "apppw", Some("cs"), CLIENT_CAPS, p.collation);
                p.setup.iter().for_each(|q| assert_eq!(err_code(&r.query(q)[0]), None, "{q}"));
                for round in 0..40 {
                    assert_eq!(r.row(STATE), want, "session {i} (profile {}) round {round}", i % PROFILES.len());
                    if round % 10 == 0 && p.four_bytes {
                        // A four-byte character written and read back in the session's character set.
                        let id = i * 100 + round;
                        let done = r.query(&format!("INSERT INTO t VALUES ({id}, 'x\u{1F4A9}y')"));
                        assert_eq!(err_code(&done[0]), None, "{}", String::from_utf8_lossy(&done[0]));
                        let hex = r.row(&format!("SELECT HEX(v) FROM t WHERE id = {id}"));
                        assert_eq!(hex[0].as_deref(), Some("78F09F92A979"), "session {i} round {round}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a session saw another session's state");
    }
}

/// The session-state entries and status flags of every OK a statement's answer holds.
fn oks(r: &mut Raw, sql: &str) -> Vec<(u16, Vec<String>)> {
    let mut out = Vec::new();
    for p in r.query(sql) {
        let head = p.as_slice().first().copied();
        if head == Some(0x00) || (head == Some(0xfe) && p.len() > 5) {
            let Ok(ok) = basic::Ok::parse(&p, true) else { continue };
            let mut entries: Vec<String> = basic::state_changes(ok.session_state)
                .map(|c| match c {
                    StateChange::SystemVariable { name, value } => {
                        // (The GTID of each write differs from run to run.)
                        let name = String::from_utf8_lossy(name).to_lowercase();
                        let value = if name == "last_gtid" { "*".into() } else { String::from_utf8_lossy(value) };
                        format!("{name}={value}")
                    }
                    other => format!("{other:?}"),
                })
                .collect();
            entries.sort();
            out.push((ok.status & !status::IN_TRANS_READONLY, entries));
        }
    }
    out
}

/// A client that asked for CLIENT_SESSION_TRACK sees the state changes its own settings ask
/// for and the status flags they imply, as directly: not sluice's own tracking of every
/// variable and every change of state (its server status once said 16394 where MariaDB said 10),
/// nor the GTID of each write with the binary log on; and after it changed its settings, what
/// the new ones ask for. In users mode with and without multiplexing.
#[test]
fn session_tracking_shows_what_the_clients_own_settings_ask_for() {
    let db = MariaDb::start_with(&["--log-bin=binlog".to_string(), "--server-id=7".to_string()]);
    db.sql("CREATE DATABASE st; CREATE TABLE st.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)");
    let statements = [
        "SET @a = 1",
        "SET time_zone = '+01:00'",
        "SELECT 1; SELECT 2",
        "SET @b = 2; SELECT 3",
        "INSERT INTO t (v) VALUES (1)",
        "USE st",
        "SET autocommit = 0",
        "INSERT INTO t (v) VALUES (2)",
        "COMMIT",
        "SET autocommit = 1",
        "SET sql_mode = 'ANSI_QUOTES'",
        "SET NAMES latin1",
        // (The answer to a statement that changes the tracking itself differs: see the README.)
        "SET session_track_system_variables = 'sql_mode,last_gtid'",
        "SET sql_mode = ''",
        "SET time_zone = '+02:00'",
        "INSERT INTO t (v) VALUES (3)",
        "SET session_track_state_change = ON",
        "SET @c = 3",
        "SET session_track_state_change = OFF",
        "SET @d = 4",
        "SET session_track_system_variables = DEFAULT",
        "SET time_zone = '+04:00'",
    ];
    let skip = |q: &str| q.starts_with("SET session_track");
    let caps = CLIENT_CAPS | cap::SESSION_TRACK;
    let run = |addr: &str| {
        let mut r = Raw::login_caps(addr, "app", "apppw", Some("st"), caps);
        statements.iter().map(|q| (q, oks(&mut r, q))).filter(|(q, _)| !skip(q)).collect::<Vec<_>>()
    };
    let direct = run(&db.addr());
    assert!(direct.iter().any(|(_, o)| o.iter().any(|(_, e)| e.iter().any(|e| e.starts_with("last_gtid")))), "{direct:?}");
    for multiplex in [false, true] {
        let s = TestConfig::new().proxy(&format!("workers = 1\nmultiplex = {multiplex}\n")).dbs(&[&db]).app_users().start();
        let through = run(&s.listen);
        for (d, t) in direct.iter().zip(&through) {
            assert_eq!(d, t, "multiplex = {multiplex}");
        }
    }
}

/// COM_STMT_EXECUTE of a statement without parameters.
fn execute(r: &mut Raw, id: u32) -> Vec<Vec<u8>> {
    let mut p = vec![sluice_proto::consts::com::STMT_EXECUTE];
    p.extend_from_slice(&id.to_le_bytes());
    p.extend_from_slice(&[0, 1, 0, 0, 0]);
    r.command(&p)
}

/// Clients that prepare and close statements in a loop on shared connections: a statement no
/// client holds open any more is closed on the server, so the server's global
/// `max_prepared_stmt_count` is never reached because of sluice (the statements used to pile
/// up on the shared connections until every client got 1461).
#[test]
fn statements_clients_closed_are_closed_on_the_server() {
    let db = MariaDb::start();
    db.sql("SET GLOBAL max_prepared_stmt_count = 16");
    let s = mux(&db, 2);
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let addr = s.listen.clone();
            std::thread::spawn(move || {
                let mut r = Raw::login(&addr, "app", "apppw", None);
                for n in 0..60 {
                    let (id, _, _) = r.prepare(&format!("SELECT {i} + {n}"));
                    let answer = execute(&mut r, id);
                    assert_eq!(err_code(&answer[0]), None, "client {i}, statement {n}: {}", String::from_utf8_lossy(&answer[0]));
                    let mut close = vec![sluice_proto::consts::com::STMT_CLOSE];
                    close.extend_from_slice(&id.to_le_bytes());
                    r.command(&close);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client could not prepare a statement");
    }
    let count = |db: &MariaDb| -> u64 {
        db.sql("SHOW GLOBAL STATUS LIKE 'Prepared_stmt_count'").split_whitespace().last().unwrap().parse().unwrap()
    };
    assert!(count(&db) <= 6, "{} statements left prepared", count(&db));
}

/// `KILL id` among other statements, of a multiplexed session that holds no backend connection
/// between its statements: it needs none (the session is closed), and `KILL QUERY` of such a
/// session is a no-op that succeeds, as on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_of_a_session_between_statements_needs_no_backend_connection() {
    let db = MariaDb::start();
    let s = mux(&db, 4);
    let mut victim = app(&s).await;
    victim.query_drop("DO 1").await.unwrap();
    let id = victim.id();
    let mut killer = Raw::login(&s.listen, "app", "apppw", None);
    let no_error = |packets: Vec<Vec<u8>>| packets.iter().all(|p| err_code(p).is_none());
    assert!(no_error(killer.query(&format!("KILL QUERY {id}; SELECT 7"))));
    let one: Option<i64> = victim.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1), "KILL QUERY of an idle session leaves it as it was");
    assert!(no_error(killer.query(&format!("SELECT 8; KILL {id}"))));
    wait_for("the killed session to be gone", || !admin_get(&s, "/sessions", None).1.contains(&format!("\"id\":{id},")));
    assert!(victim.query_drop("SELECT 1").await.is_err(), "the killed session's connection is closed");
}

/// A statement that waited for a connection in vain is told who holds them and why, so that
/// a cap too small can be told from sessions that keep their connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_timeout_names_the_sessions_holding_the_connections() {
    let db = MariaDb::start();
    let s = TestConfig::new()
        .proxy("workers = 1\nmultiplex = true\nmax_backend_connections = 1\nqueue_timeout = \"500ms\"\n")
        .dbs(&[&db])
        .app_users()
        .start();
    let mut holder = app(&s).await;
    let mut waiter = app(&s).await;
    holder.query_drop("BEGIN").await.unwrap();
    holder.query_drop("DO 1").await.unwrap();
    let e = waiter.query_drop("SELECT 1").await.unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("1040") || msg.contains("max_backend_connections"), "{msg}");
    assert!(msg.contains(&format!("session {} (pinned: transaction)", holder.id())), "{msg}");
    holder.query_drop("COMMIT").await.unwrap();
    let one: Option<i64> = waiter.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
}

/// With autocommit off, a savepoint set before any table was touched leaves no
/// in-transaction flag, but the server keeps it: the session keeps its connection until COMMIT
/// or ROLLBACK, so that its own ROLLBACK TO finds the savepoint, and no other client can.
/// (A statement that touches a table sets the flag itself; one that touches none begins
/// nothing, so an idle PyMySQL session that ran only `SET`s can still move and drain.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_with_autocommit_off_keeps_its_connection() {
    let db = MariaDb::start();
    let s = mux(&db, 2);
    let mut a = app(&s).await;
    let mut b = app(&s).await;
    a.query_drop("SET autocommit = 0").await.unwrap();
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(!body.contains("\"transaction\""), "SET autocommit = 0 begins nothing: {body}");
    a.query_drop("SAVEPOINT sp").await.unwrap();
    // (A pin is published just after the answer reaches the client.)
    let pinned = || admin_get(&s, "/sessions", None).1.contains("\"transaction\"");
    wait_for("the savepoint to pin the session", pinned);
    // Another client finds no savepoint of that name on the connection it gets.
    let e = b.query_drop("ROLLBACK TO SAVEPOINT sp").await.unwrap_err();
    assert!(e.to_string().contains("1305"), "{e}");
    a.query_drop("SELECT 1").await.unwrap();
    a.query_drop("ROLLBACK TO SAVEPOINT sp").await.unwrap();
    a.query_drop("RELEASE SAVEPOINT sp").await.unwrap();
    a.query_drop("COMMIT").await.unwrap();
    wait_for("COMMIT to end the pin", || !pinned());
    // A statement that touches no table begins nothing; a savepoint, then autocommit turned on
    // (which commits), ends the pin.
    a.query_drop("SELECT 1").await.unwrap();
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(!body.contains("\"transaction\""), "{body}");
    a.query_drop("SAVEPOINT sp3").await.unwrap();
    wait_for("the savepoint to pin the session", pinned);
    a.query_drop("SET autocommit = 1").await.unwrap();
    a.query_drop("SELECT 1").await.unwrap();
    wait_for("autocommit on to end the pin", || !pinned());
}

/// A difference by design: a multiplexed session holds no backend connection while idle, so the
/// server's `wait_timeout` does not end it (directly, the server closes the connection); its
/// shared connections that the server closed meanwhile are replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_multiplexed_session_outlives_wait_timeout() {
    let db = MariaDb::start();
    let s = mux(&db, 2);
    let mut direct = connect(&db.addr(), "app", "apppw").await;
    let mut through = app(&s).await;
    for c in [&mut direct, &mut through] {
        c.query_drop("SET SESSION wait_timeout = 1").await.unwrap();
    }
    // Until the server has ended the idle direct connection (and so every idle connection of
    // the session's, which set the same wait_timeout before the direct one).
    let direct_id = direct.id();
    wait_for("the server to end the idle direct connection", || {
        db.sql(&format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {direct_id}")).trim().ends_with('0')
    });
    assert!(direct.query_drop("SELECT 1").await.is_err(), "the server ended the idle direct connection");
    let t: Option<i64> = through.query_first("SELECT @@wait_timeout").await.unwrap();
    assert_eq!(t, Some(1), "the session goes on, with its own wait_timeout");
}

/// Connection attributes under multiplexing: a session takes a shared connection opened with
/// its own attributes, or opens one while under the cap, so that
/// `performance_schema.session_connect_attrs` shows each client's own (past the cap, a
/// connection opened for another client is shared: see the README).
#[test]
fn a_session_runs_on_a_connection_carrying_its_own_attributes() {
    let db = MariaDb::start_with(&PRODUCTION_LIKE.map(String::from));
    let s = mux(&db, 4);
    let q = "SELECT ATTR_VALUE FROM performance_schema.session_connect_attrs \
             WHERE PROCESSLIST_ID = CONNECTION_ID() AND ATTR_NAME = 'program_name'";
    let mut direct = Raw::login_attrs(&db.addr(), "app", "apppw", &[("program_name", "direct")]);
    assert_eq!(direct.row(q), vec![Some("direct".to_string())], "the server shows attributes");
    let mut a = Raw::login_attrs(&s.listen, "app", "apppw", &[("program_name", "alpha")]);
    let mut b = Raw::login_attrs(&s.listen, "app", "apppw", &[("program_name", "beta")]);
    for round in 0..5 {
        assert_eq!(a.row(q), vec![Some("alpha".to_string())], "round {round}");
        assert_eq!(b.row(q), vec![Some("beta".to_string())], "round {round}");
    }
    assert!(app_threads(&db) <= 3, "sessions of the same attributes still share");
}

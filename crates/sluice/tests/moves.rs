//! Sessions whose backend dies while they are idle: in users mode they move to the survivor at
//! their next statement with their schema, variables and prepared statements; sessions that
//! cannot move (open transaction, untracked state, passthrough) get an error and a close.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_testkit::raw::Raw;

fn users_config(dbs: &[&MariaDb]) -> String {
    users_config_with(dbs, "")
}

/// [`users_config`] with `proxy` keys added.
fn users_config_with(dbs: &[&MariaDb], proxy: &str) -> String {
    TestConfig::new()
        .table("health", "interval = \"200ms\"\nrise = 1\nfall = 1\n")
        .proxy(&format!("balance = \"round-robin\"\n{proxy}"))
        .dbs(dbs)
        .app_users()
        .text()
}

/// The same schema and table on every server.
fn same_schema(dbs: &[&MariaDb]) {
    for d in dbs {
        d.sql("CREATE DATABASE IF NOT EXISTS moves; CREATE TABLE IF NOT EXISTS moves.t (id INT PRIMARY KEY, v VARCHAR(20)); REPLACE INTO moves.t VALUES (1, 'one'), (2, 'two')");
    }
}

/// Two servers with the same schema and a users-mode sluice in front of both.
fn two_backends() -> (MariaDb, MariaDb, SluiceProc) {
    let a = MariaDb::start();
    let b = MariaDb::start();
    same_schema(&[&a, &b]);
    let s = start_sluice_config(&users_config(&[&a, &b]));
    (a, b, s)
}

async fn port_of(c: &mut mysql_async::Conn) -> u16 {
    c.query_first("SELECT @@port").await.unwrap().unwrap()
}

/// Opens sessions until `n` of them landed on the backend at `port` (the others are closed).
async fn sessions_on(s: &SluiceProc, port: u16, n: usize) -> Vec<mysql_async::Conn> {
    let mut on = Vec::new();
    while on.len() < n {
        let mut c = app(s).await;
        if port_of(&mut c).await == port {
            on.push(c);
        }
    }
    on
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_users_mode_sessions_move_to_the_survivor_with_their_state() {
    let (mut a, b, s) = two_backends();

    // Sessions on both backends; the ones on `a` will lose it.
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    for _ in 0..4 {
        let mut c = app(&s).await;
        if port_of(&mut c).await == a.port { on_a.push(c) } else { on_b.push(c) }
    }
    assert_eq!((on_a.len(), on_b.len()), (2, 2), "round-robin spreads four sessions");
    let mut mover = on_a.pop().unwrap();
    let mut in_trx = on_a.pop().unwrap();

    // The mover changes its schema, charset, variables, and prepares statements.
    mover.query_drop("USE moves").await.unwrap();
    mover.query_drop("SET NAMES latin1").await.unwrap();
    mover
        .query_drop("SET SESSION sql_mode = 'ANSI_QUOTES,NO_ENGINE_SUBSTITUTION', wait_timeout = 1234, time_zone = '+03:00'")
        .await
        .unwrap();
    let by_id = mover.prep("SELECT v FROM t WHERE id = ?").await.unwrap();
    let plus = mover.prep("SELECT ? + 1").await.unwrap();
    let closed = mover.prep("SELECT 42").await.unwrap();
    mover.close(closed).await.unwrap();
    let v: Option<String> = mover.exec_first(&by_id, (1,)).await.unwrap();
    assert_eq!(v.as_deref(), Some("one"));
    let before: (String, String, String, u64, String) =
        mover.query_first("SELECT DATABASE(), @@character_set_client, @@sql_mode, @@wait_timeout, @@time_zone").await.unwrap().unwrap();

    // Another session is inside a transaction; it cannot move.
    in_trx.query_drop("BEGIN").await.unwrap();
    in_trx.query_drop("UPDATE moves.t SET v = 'uno' WHERE id = 1").await.unwrap();

    a.kill();
    wait_for("sluice sees the lost connections", || s.log_text().contains("the session moves at its next command"));

    // The mover carries on, on the survivor, with everything it had.
    assert_eq!(port_of(&mut mover).await, b.port);
    let after: (String, String, String, u64, String) =
        mover.query_first("SELECT DATABASE(), @@character_set_client, @@sql_mode, @@wait_timeout, @@time_zone").await.unwrap().unwrap();
    assert_eq!(after, before);
    assert_eq!(after.0, "moves");
    assert_eq!(after.1, "latin1");
    let v: Option<String> = mover.exec_first(&by_id, (2,)).await.unwrap();
    assert_eq!(v.as_deref(), Some("two"));
    let n: Option<i64> = mover.exec_first(&plus, (41,)).await.unwrap();
    assert_eq!(n, Some(42));
    // New statements get ids that do not collide with the old ones.
    let fresh = mover.prep("SELECT v FROM t WHERE id = ? + 1").await.unwrap();
    assert!(![by_id.id(), plus.id()].contains(&fresh.id()), "statement ids stay unique");
    let v: Option<String> = mover.exec_first(&fresh, (0,)).await.unwrap();
    assert_eq!(v.as_deref(), Some("one"));
    let v: Option<String> = mover.exec_first(&by_id, (1,)).await.unwrap();
    assert_eq!(v.as_deref(), Some("one"));
    mover.close(fresh).await.unwrap();
    mover.close(by_id).await.unwrap();
    let n: Option<i64> = mover.exec_first(&plus, (1,)).await.unwrap();
    assert_eq!(n, Some(2));

    // The session in a transaction gets an error, as it would from a dead server.
    let e = in_trx.query_drop("COMMIT").await.expect_err("a transaction on a dead backend fails");
    let _ = e;
    // Sessions on the survivor never noticed.
    for c in on_b.iter_mut() {
        assert_eq!(port_of(c).await, b.port);
    }
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"failure\",result=\"moved\"}"), 1);
    let (_, sessions) = admin_get(&s, "/sessions", None);
    assert!(sessions.contains("\"stmt_ids_mapped\":true"), "{sessions}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_with_untracked_state_do_not_move() {
    let mut a = MariaDb::start();
    let b = MariaDb::start();
    same_schema(&[&a, &b]);
    // No rebalancing: the four sessions piled on `a` would be spread by planned moves, which
    // read user variables back first, and the one with `@x` would rightly survive the loss.
    let s = start_sluice_config(&users_config_with(&[&a, &b], "rebalance = false\n"));
    let mut on_a = sessions_on(&s, a.port, 4).await;
    on_a[0].query_drop("SET @x = 1").await.unwrap();
    on_a[1].query_drop("CREATE TEMPORARY TABLE moves.tmp (a INT)").await.unwrap();
    on_a[2].query_drop("SELECT GET_LOCK('moves', 10)").await.unwrap();
    // A user variable inside a string literal is not a user variable.
    on_a[3].query_drop("SELECT 'someone@example.com'").await.unwrap();
    let (_, sessions) = admin_get(&s, "/sessions", None);
    let pins: Vec<String> =
        json(&sessions).as_array().unwrap().iter().flat_map(|x| x["pins"].as_array().unwrap().iter().map(|p| p.to_string())).collect();
    for pin in ["user_variables", "temporary_table", "lock"] {
        assert!(pins.contains(&format!("\"{pin}\"")), "/sessions shows the {pin} pin: {sessions}");
    }
    a.kill();
    let mut movable = on_a.pop().unwrap();
    for (i, mut c) in on_a.into_iter().enumerate() {
        let r: Result<Option<i32>, _> = c.query_first("SELECT 1").await;
        assert!(r.is_err(), "session {i} with untracked state must not continue elsewhere");
    }
    let one: Option<i32> = movable.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    assert_eq!(port_of(&mut movable).await, b.port);
    wait_for("every failed session is gone", || json(&admin_get(&s, "/sessions", None).1).as_array().unwrap().len() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_stays_dead_and_a_restarted_backend_takes_its_sessions_back() {
    let mut a = MariaDb::start();
    a.sql("CREATE DATABASE IF NOT EXISTS moves");
    let s = start_sluice_config(&users_config(&[&a]));
    let mut victim = app(&s).await;
    let mut killer = app(&s).await;
    let mut idle = app(&s).await;
    idle.query_drop("USE moves").await.unwrap();
    // KILL through sluice ends the session: its backend connection is not recreated.
    killer.query_drop(format!("KILL {}", victim.id())).await.unwrap();
    wait_for("sluice closes the killed session", || json(&admin_get(&s, "/sessions", None).1).as_array().unwrap().len() == 2);
    victim.query_drop("SELECT 1").await.expect_err("a killed session stays dead");
    // A KILL run on the backend behind sluice's back ends only the backend connection: sluice
    // cannot tell it from a crash, and the idle session carries on over a new one.
    let thread: Option<u32> = killer.query_first("SELECT CONNECTION_ID()").await.unwrap();
    let mut direct = connect(&a.addr(), "app", "apppw").await;
    direct.query_drop(format!("KILL {}", thread.unwrap())).await.unwrap();
    drop(direct);
    wait_for("sluice sees the lost connection", || s.log_text().contains("the session moves at its next command"));
    let thread_after: Option<u32> = killer.query_first("SELECT CONNECTION_ID()").await.unwrap();
    assert_ne!(thread_after, thread);

    // The only backend restarts (a graceful stop): the idle session waits, then moves back.
    a.restart();
    wait_for("the backend is up again", || admin_get(&s, "/backends", None).1.contains("\"up\":true"));
    let db: Option<String> = idle.query_first("SELECT DATABASE()").await.unwrap();
    assert_eq!(db.as_deref(), Some("moves"));
    assert_eq!(metric(&s, "sluice_session_moves_total{reason=\"failure\",result=\"moved\"}"), 2);
}

/// The port a raw session is on (the text row of `SELECT @@port`).
fn raw_port(r: &mut Raw) -> u16 {
    let packets = r.query("SELECT @@port");
    let row =
        packets.iter().find(|p| p.len() > 1 && p[0] as usize == p.len() - 1 && p[1..].iter().all(u8::is_ascii_digit)).expect("port row");
    std::str::from_utf8(&row[1..]).unwrap().parse().unwrap()
}

/// COM_STMT_EXECUTE of `SELECT ? + 1` with one BIGINT; the types only when `bind` is set, as
/// libmariadb does (it sends them with the first execute only).
fn execute(r: &mut Raw, id: &[u8], bind: bool, v: i64) -> Vec<Vec<u8>> {
    let mut p = vec![sluice_proto::consts::com::STMT_EXECUTE];
    p.extend_from_slice(id);
    p.extend_from_slice(&[0, 1, 0, 0, 0, 0]);
    if bind {
        p.extend_from_slice(&[1, 8, 0]);
    } else {
        p.push(0);
    }
    p.extend_from_slice(&v.to_le_bytes());
    r.command(&p)
}

#[test]
fn a_moved_statement_gets_the_parameter_types_the_client_sent_once() {
    let (mut a, b, s) = two_backends();
    let mut r = loop {
        let mut r = Raw::login(&s.listen, "app", "apppw", None);
        if raw_port(&mut r) == a.port {
            break r;
        }
    };
    let id = r.prepare("SELECT ? + 1").0.to_le_bytes().to_vec();
    let last_i64 = |packets: &[Vec<u8>]| {
        let row = packets.iter().find(|p| p.len() == 10 && p[0] == 0).expect("binary row");
        i64::from_le_bytes(row[2..10].try_into().unwrap())
    };
    assert_eq!(last_i64(&execute(&mut r, &id, true, 41)), 42);
    assert_eq!(last_i64(&execute(&mut r, &id, false, 1)), 2);
    a.kill();
    wait_for("sluice sees the lost connection", || s.log_text().contains("the session moves at its next command"));
    // The client does not send the types again; the new backend connection needs them.
    let after = execute(&mut r, &id, false, 99);
    assert!(after.iter().all(|p| err_code(p).is_none()), "execute after the move: {after:?}");
    assert_eq!(last_i64(&after), 100);
    assert_eq!(raw_port(&mut r), b.port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_set_after_a_reset_or_a_change_of_user_moves_too() {
    let (mut a, b, s) = two_backends();
    let mut sessions = sessions_on(&s, a.port, 2).await;
    // COM_RESET_CONNECTION puts the server's variable tracking back to its default.
    let mut reset = sessions.pop().unwrap();
    reset.reset().await.unwrap();
    reset.query_drop("SET SESSION sql_mode = 'ANSI_QUOTES'").await.unwrap();
    // COM_CHANGE_USER too, and the session is now another user's.
    let mut changed = sessions.pop().unwrap();
    changed
        .change_user(mysql_async::ChangeUserOpts::default().with_user(Some("other".into())).with_pass(Some("otherpw".into())))
        .await
        .unwrap();
    changed.query_drop("SET SESSION sql_mode = 'ANSI_QUOTES'").await.unwrap();
    a.kill();
    wait_for("sluice sees both lost connections", || s.log_text().matches("the session moves at its next command").count() == 2);
    for (c, user) in [(&mut reset, "app@%"), (&mut changed, "other@%")] {
        let (mode, who): (String, String) = c.query_first("SELECT @@sql_mode, CURRENT_USER()").await.unwrap().unwrap();
        assert_eq!((mode.as_str(), who.as_str()), ("ANSI_QUOTES", user));
        assert_eq!(port_of(c).await, b.port);
    }
}

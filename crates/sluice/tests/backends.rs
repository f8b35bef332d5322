//! Backend variants: Unix-socket backends, TLS to backends, monitor-user health checks,
//! balancing policies, COM_PROCESS_KILL.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_proto::consts::com;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_backend() {
    let db = shared_db();
    let s = TestConfig::new().backend(&db.socket.display().to_string()).start();
    let mut c = app(&s).await;
    // Over the socket the server sees the client as localhost.
    let host: Option<String> = c.query_first("SELECT SUBSTRING_INDEX(USER(), '@', -1)").await.unwrap();
    assert_eq!(host.as_deref(), Some("localhost"));
    c.disconnect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_the_backend() {
    let (db, cert) = start_tls_db();
    let cfg = TestConfig::new().backend_with(&db.addr(), &format!("tls = true\ntls_ca = \"{}\"\n", cert.display()));
    for users in [false, true] {
        let auth = if users { "users mode" } else { "passthrough" };
        let s = if users { cfg.clone().user("app", "password = \"apppw\"\n") } else { cfg.clone() }.start();
        let mut c = app(&s).await;
        assert!(!ssl_cipher(&mut c).await.is_empty(), "the backend connection is encrypted ({auth:?})");
        c.disconnect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_user_health_checks_log_in_and_ping() {
    let db = MariaDb::start();
    db.sql("SET GLOBAL log_warnings = 4");
    let counters = || db.sql("SHOW GLOBAL STATUS LIKE 'Aborted_c%'");
    let aborted_lines = || std::fs::read_to_string(db.dir.join("error.log")).unwrap().matches("Aborted connection").count();
    let (before, lines_before) = (counters(), aborted_lines());
    let cfg = TestConfig::new().table("health", "interval = \"50ms\"\nuser = \"monitor\"\npassword = \"monitorpw\"\n").dbs(&[&db]).text();
    let s = start_sluice_config(&cfg);
    wait_for("health checks ran", || {
        let (_, body) = admin_get(&s, "/backends", None);
        json(&body)[0]["checks"].as_u64().unwrap_or(0) >= 10
    });
    let (_, body) = admin_get(&s, "/backends", None);
    assert_eq!(json(&body)[0]["up"], true);
    // Logged-in probes that quit leave no aborted connections behind.
    assert_eq!(counters(), before);
    assert_eq!(aborted_lines(), lines_before);
    // A wrong monitor password takes the backend down, with the reason.
    let bad = cfg.replace("monitorpw", "wrong");
    let s2 = start_sluice_config(&bad);
    wait_for("backend down", || admin_get(&s2, "/backends", None).1.contains("\"up\":false"));
    assert!(admin_get(&s2, "/backends", None).1.contains("Access denied"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balancing_policies_spread_sessions() {
    let a = MariaDb::start();
    let b = MariaDb::start();
    let count_ports = |conns: &Vec<(u16, mysql_async::Conn)>| {
        let on_a = conns.iter().filter(|(p, _)| *p == a.port).count();
        (on_a, conns.len() - on_a)
    };
    // least-connections and round-robin: an even spread.
    for policy in ["least-connections", "round-robin"] {
        let s = TestConfig::new().proxy(&format!("balance = \"{policy}\"\n")).dbs(&[&a, &b]).start();
        let mut conns = Vec::new();
        for _ in 0..10 {
            let mut c = app(&s).await;
            let port: Option<u16> = c.query_first("SELECT @@port").await.unwrap();
            conns.push((port.unwrap(), c));
        }
        assert_eq!(count_ports(&conns), (5, 5), "{policy}");
    }
    // weighted-random: a backend with weight 0 is refused, so use 1 and 9.
    let s = TestConfig::new()
        .proxy("balance = \"weighted-random\"\n")
        .backend_with(&a.addr(), "weight = 1\n")
        .backend_with(&b.addr(), "weight = 9\n")
        .start();
    let mut conns = Vec::new();
    for _ in 0..40 {
        let mut c = app(&s).await;
        let port: Option<u16> = c.query_first("SELECT @@port").await.unwrap();
        conns.push((port.unwrap(), c));
    }
    let (on_a, on_b) = count_ports(&conns);
    assert!(on_b > on_a, "weight 9 gets more sessions than weight 1: {on_a} vs {on_b}");
}

#[test]
fn com_process_kill_uses_sluice_ids() {
    let s = shared_sluice();
    let mut victim = Raw::login(&s.listen, "app", "apppw", None);
    let victim_id = victim.greeting.as_ref().unwrap().connection_id;
    let mut killer = Raw::login(&s.listen, "app", "apppw", None);
    let mut p = vec![com::PROCESS_KILL];
    p.extend_from_slice(&victim_id.to_le_bytes());
    let r = killer.command(&p);
    assert_eq!(r[0][0], 0, "{}", String::from_utf8_lossy(&r[0]));
    assert!(victim.is_closed(), "the killed session is closed");
    let mut p = vec![com::PROCESS_KILL];
    p.extend_from_slice(&3_999_999u32.to_le_bytes());
    assert_eq!(err_code(&killer.command(&p)[0]), Some(1094));
}

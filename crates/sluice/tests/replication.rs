//! Backends in a replication topology: the part each plays, read by the health checks' monitor
//! user (`role = "auto"`) or configured, replica lag, and a promotion followed.

mod common;

use common::*;
use sluice_testkit::Topology;

fn backends(s: &SluiceProc) -> serde_json::Value {
    json(&admin_get(s, "/backends", None).1)
}

fn named<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v.as_array().expect("a list").iter().find(|b| b["name"] == name).expect("the backend")
}

fn metrics_have(s: &SluiceProc, line: &str) -> bool {
    admin_get(s, "/metrics", None).1.lines().any(|l| l == line)
}

#[test]
fn the_monitor_reads_roles_and_lag_and_follows_a_promotion() {
    let mut t = Topology::start(2);
    let s = TestConfig::new()
        .table("health", "interval = \"50ms\"\nuser = \"monitor\"\npassword = \"monitorpw\"\n")
        .backend_with(&t.servers[0].addr(), "name = \"a\"\n")
        .backend_with(&t.servers[1].addr(), "name = \"b\"\n")
        .backend_with(&t.servers[2].addr(), "name = \"c\"\nrole = \"primary\"\n")
        .start();
    wait_for("the replicas' status read", || {
        let v = backends(&s);
        named(&v, "b")["replication"]["replicating"] == true && named(&v, "c")["replication"]["replicating"] == true
    });
    let v = backends(&s);
    let (a, b, c) = (named(&v, "a"), named(&v, "b"), named(&v, "c"));
    for (x, serves, read_only) in [(a, "primary", false), (b, "replica", true)] {
        assert_eq!(x["role"], "auto");
        assert_eq!(x["serves_as"], serves);
        assert_eq!(x["replication"]["read_only"], read_only);
    }
    assert_eq!(b["replication"]["source"], format!("127.0.0.1:{}", t.servers[0].port));
    assert_eq!(b["replication"]["lag_seconds"], 0);
    assert_eq!(a["replication"]["replicating"], serde_json::Value::Null, "the primary replicates from nobody");
    // A configured role stands, whatever the server says.
    assert_eq!(c["role"], "primary");
    assert_eq!(c["serves_as"], "primary");
    assert_eq!(c["replication"]["read_only"], true);
    assert!(metrics_have(&s, "sluice_backend_primary{backend=\"a\"} 1"));
    assert!(metrics_have(&s, "sluice_backend_primary{backend=\"b\"} 0"));
    assert!(metrics_have(&s, "sluice_backend_replica_lag_seconds{backend=\"b\"} 0"));
    assert!(metrics_have(&s, "sluice_backend_replica_lag_seconds{backend=\"a\"} -1"));

    // Lag: a replica 30 s behind reports it; one whose SQL thread stopped does not replicate.
    t.delay(1, 30);
    t.stop_sql_thread(2);
    t.primary().sql("CREATE TABLE test.lag (id INT PRIMARY KEY); INSERT INTO test.lag VALUES (1)");
    wait_for("the delay seen", || named(&backends(&s), "b")["replication"]["lag_seconds"].as_u64().is_some_and(|l| l >= 1));
    wait_for("the stopped thread seen", || named(&backends(&s), "c")["replication"]["replicating"] == false);
    assert!(metrics_have(&s, "sluice_backend_replica_lag_seconds{backend=\"c\"} -1"));

    // A promotion, as a failover tool makes it: the roles follow.
    t.delay(1, 0);
    t.start_sql_thread(2);
    t.promote(1);
    wait_for("the new roles", || {
        let v = backends(&s);
        named(&v, "a")["serves_as"] == "replica" && named(&v, "b")["serves_as"] == "primary"
    });
    wait_for("the old primary replicating from the new one", || {
        named(&backends(&s), "a")["replication"]["source"] == format!("127.0.0.1:{}", t.servers[1].port).as_str()
    });
    assert!(metrics_have(&s, "sluice_backend_primary{backend=\"b\"} 1"));
    assert!(metrics_have(&s, "sluice_backend_primary{backend=\"a\"} 0"));
}

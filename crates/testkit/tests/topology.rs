//! The replication topology the routing tests stand on: replicas follow the primary, lag when
//! told, and follow a promoted replica.

use sluice_testkit::Topology;

fn count(t: &Topology, i: usize) -> String {
    t.servers[i].sql("SELECT COUNT(*) FROM test.r").trim().to_string()
}

#[test]
fn replicas_follow_lag_when_told_and_follow_a_promoted_replica() {
    let mut t = Topology::start(2);
    assert_eq!(t.primary_index(), 0);
    assert_eq!(t.replica_indexes(), [1, 2]);
    t.primary().sql("CREATE TABLE test.r (id INT PRIMARY KEY); INSERT INTO test.r VALUES (1)");
    t.wait_caught_up();
    for i in [1, 2] {
        assert_eq!(count(&t, i), "1", "replica {i} has the primary's row");
        assert_eq!(t.servers[i].sql("SELECT @@read_only").trim(), "1", "replica {i} is read-only");
        assert!(t.servers[i].sql("SHOW SLAVE STATUS").contains("Slave_Pos"), "replica {i} replicates by GTID");
    }
    assert_eq!(t.primary().sql("SELECT @@read_only").trim(), "0");

    // A stopped SQL thread: replica 2 stays behind until it runs again.
    t.stop_sql_thread(2);
    t.primary().sql("INSERT INTO test.r VALUES (2)");
    assert!(t.caught_up(1));
    assert_eq!(count(&t, 1), "2");
    assert_eq!(count(&t, 2), "1", "a replica whose SQL thread stopped applies nothing");
    t.start_sql_thread(2);
    assert!(t.caught_up(2));
    assert_eq!(count(&t, 2), "2");

    // A delay: a write is not applied within a second on a replica 30 s behind, and is once
    // the delay ends.
    t.delay(1, 30);
    t.primary().sql("INSERT INTO test.r VALUES (3)");
    let pos = t.primary_gtid();
    assert_eq!(t.servers[1].sql(&format!("SELECT MASTER_GTID_WAIT('{pos}', 1)")).trim(), "-1", "the delayed replica is behind");
    assert!(t.servers[1].sql("SHOW SLAVE STATUS").contains("\t30\t"), "SQL_Delay is 30");
    t.delay(1, 0);
    assert!(t.caught_up(1));
    assert_eq!(count(&t, 1), "3");

    // Promotion: the old primary turns read-only and follows the new one with the other replica.
    t.promote(1);
    assert_eq!(t.primary_index(), 1);
    assert_eq!(t.replica_indexes(), [0, 2]);
    assert_eq!(t.servers[0].sql("SELECT @@read_only").trim(), "1");
    assert_eq!(t.servers[1].sql("SELECT @@read_only").trim(), "0");
    t.primary().sql("INSERT INTO test.r VALUES (4)");
    t.wait_caught_up();
    for i in 0..3 {
        assert_eq!(count(&t, i), "4", "server {i} has every row after the promotion");
    }
    for i in [0, 2] {
        let status = t.servers[i].sql("SHOW SLAVE STATUS");
        assert!(status.contains(&format!("\t{}\t", t.servers[1].port)), "server {i} replicates from the new primary: {status}");
    }
}

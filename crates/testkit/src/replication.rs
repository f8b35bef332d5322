//! A replication topology for tests and benchmarks: a MariaDB primary and replicas that follow it
//! with semi-synchronous GTID replication (`MASTER_USE_GTID = slave_pos`), each on its own
//! loopback port. A replica
//! can be made to lag (a replication delay, or its SQL thread stopped), and one can be promoted
//! the way an external failover tool does it: the old primary made read-only, the replica made
//! writable, every other server pointed at it.

use crate::mariadb::MariaDb;

/// The account replicas use to read the primary's binary log (every test server has it).
const REPLICATION_USER: &str = "app";
const REPLICATION_PASSWORD: &str = "apppw";

/// How long a wait for a replica to catch up may last.
const CATCH_UP_SECS: u32 = 60;

/// A primary and its replicas. Server `i` has `server_id = i + 1`; all of them write binary logs
/// with the replicated changes in them (`log_slave_updates`), so any of them can be promoted.
pub struct Topology {
    pub servers: Vec<MariaDb>,
    primary: usize,
}

impl Topology {
    /// Starts a primary and `replicas` replicas following it, read-only, and caught up. The
    /// `monitor` user may read replication status (`SLAVE MONITOR`) on all of them.
    pub fn start(replicas: usize) -> Topology {
        let servers: Vec<MariaDb> = (0..=replicas).map(|i| MariaDb::start_with(&server_options(i))).collect();
        let t = Topology { servers, primary: 0 };
        // Written to the primary's log, so the replicas repeat it.
        t.primary().sql("GRANT SLAVE MONITOR ON *.* TO 'monitor'@'%'");
        for i in 1..=replicas {
            t.follow(i, 0);
            t.servers[i].sql("SET GLOBAL read_only = 1");
        }
        t.wait_caught_up();
        t
    }

    /// The index of the server that is the primary now.
    pub fn primary_index(&self) -> usize {
        self.primary
    }

    pub fn primary(&self) -> &MariaDb {
        &self.servers[self.primary]
    }

    /// The indexes of the replicas, in order.
    pub fn replica_indexes(&self) -> Vec<usize> {
        (0..self.servers.len()).filter(|&i| i != self.primary).collect()
    }

    /// Points server `i` at server `source` and starts replicating from the GTID position it has
    /// applied.
    fn follow(&self, i: usize, source: usize) {
        let s = &self.servers[source];
        self.servers[i].sql(&format!(
            "STOP SLAVE; CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = '{REPLICATION_USER}', \
             MASTER_PASSWORD = '{REPLICATION_PASSWORD}', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1; START SLAVE;",
            s.port
        ));
    }

    /// Makes replica `i` apply each transaction `secs` seconds after the primary committed it
    /// (`MASTER_DELAY`; 0 ends the delay).
    pub fn delay(&self, i: usize, secs: u32) {
        assert_ne!(i, self.primary, "the primary replicates from nobody");
        self.servers[i].sql(&format!("STOP SLAVE; CHANGE MASTER TO MASTER_DELAY = {secs}; START SLAVE;"));
    }

    /// Stops replica `i` applying what it receives: it falls behind until
    /// [`Topology::start_sql_thread`].
    pub fn stop_sql_thread(&self, i: usize) {
        assert_ne!(i, self.primary, "the primary replicates from nobody");
        self.servers[i].sql("STOP SLAVE SQL_THREAD");
    }

    pub fn start_sql_thread(&self, i: usize) {
        self.servers[i].sql("START SLAVE SQL_THREAD");
    }

    /// The primary's GTID position: what every replica has applied once it has caught up.
    pub fn primary_gtid(&self) -> String {
        self.primary().sql("SELECT @@gtid_binlog_pos").trim().to_string()
    }

    /// Whether replica `i` has applied everything the primary had committed when this was
    /// called, waiting up to a minute for it.
    pub fn caught_up(&self, i: usize) -> bool {
        let pos = self.primary_gtid();
        if pos.is_empty() {
            return true;
        }
        self.servers[i].sql(&format!("SELECT MASTER_GTID_WAIT('{pos}', {CATCH_UP_SECS})")).trim() == "0"
    }

    /// Waits until every replica has applied what the primary has committed; panics, with the
    /// replica's status, if one has not within a minute.
    pub fn wait_caught_up(&self) {
        for i in self.replica_indexes() {
            assert!(self.caught_up(i), "replica {i} did not catch up: {}", self.servers[i].sql("SHOW SLAVE STATUS"));
        }
    }

    /// Promotes replica `i`, as an external failover tool would for a planned switch-over: the
    /// primary is made read-only, the replica catches up with it, stops replicating and is made
    /// writable, and every other server (the old primary too) replicates from it.
    pub fn promote(&mut self, i: usize) {
        assert_ne!(i, self.primary, "server {i} is the primary already");
        let old = self.primary;
        self.servers[old].sql("SET GLOBAL read_only = 1");
        assert!(self.caught_up(i), "replica {i} did not catch up before its promotion");
        self.servers[i].sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0;");
        // The old primary has applied everything it logged: it starts from there.
        self.servers[old].sql("SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos");
        self.primary = i;
        for r in self.replica_indexes() {
            self.follow(r, i);
        }
    }
}

/// What makes server `i` a member of a topology: its own server id, a binary log holding the
/// changes it applies as a replica too, and row-based events. Replication is semi-synchronous
/// (MariaDB's built-in plugin), with the wait after the binary log's sync and before the
/// engine's commit (`AFTER_SYNC`): a transaction a client saw committed is in a replica's relay
/// log, so a failover that promotes the replica that received most loses nothing acknowledged.
/// A primary that no replica acknowledges within a second goes on asynchronously.
fn server_options(i: usize) -> Vec<String> {
    vec![
        format!("--server-id={}", i + 1),
        "--log-bin=mariadb-bin".to_string(),
        "--log-slave-updates".to_string(),
        "--binlog-format=ROW".to_string(),
        "--rpl-semi-sync-master-enabled=ON".to_string(),
        "--rpl-semi-sync-slave-enabled=ON".to_string(),
        "--rpl-semi-sync-master-wait-point=AFTER_SYNC".to_string(),
        "--rpl-semi-sync-master-timeout=1000".to_string(),
    ]
}

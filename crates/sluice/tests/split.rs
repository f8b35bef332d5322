//! The read/write split on real replicated MariaDB: a primary and two replicas. Every server
//! has its own row in `test.whoami` (written with the binary log off), so a statement's answer
//! names the server that ran it. The client logs in as `other`, which may not write on a
//! read-only server: a write sent to a replica would fail.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_testkit::Topology;

/// Gives every server its own row in `test.whoami` ("s0" on the primary, "s1", "s2" on the
/// replicas), and an empty `test.items` and a sequence everywhere.
fn label(t: &Topology) {
    t.primary().sql(
        "CREATE TABLE test.whoami (name VARCHAR(16)); CREATE TABLE test.items (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(16)); \
         CREATE SEQUENCE test.seq",
    );
    t.wait_caught_up();
    for (i, s) in t.servers.iter().enumerate() {
        s.sql(&format!("SET sql_log_bin = 0; INSERT INTO test.whoami VALUES ('s{i}')"));
    }
}

/// A sluice in front of the topology (backends named s0, s1, s2), the monitor user reading roles
/// and lag, with `routing` keys (the split unless told otherwise).
fn sluice(t: &Topology, routing: &str) -> SluiceProc {
    let mut c = TestConfig::new()
        .proxy("workers = 1\n")
        .table("health", "interval = \"50ms\"\nuser = \"monitor\"\npassword = \"monitorpw\"\n")
        .table("routing", routing)
        .app_users();
    for (i, s) in t.servers.iter().enumerate() {
        c = c.backend_with(&s.addr(), &format!("name = \"s{i}\"\n"));
    }
    c.start()
}

fn backend(s: &SluiceProc, name: &str) -> serde_json::Value {
    let v = json(&admin_get(s, "/backends", None).1);
    v.as_array().expect("a list").iter().find(|b| b["name"] == name).expect("the backend").clone()
}

fn wait_serving_reads(s: &SluiceProc, replicas: &[&str]) {
    for r in replicas {
        wait_for(&format!("{r} serving reads"), || backend(s, r)["serves_reads"] == true);
    }
}

async fn other(s: &SluiceProc) -> mysql_async::Conn {
    let mut c = connect(&s.listen, "other", "otherpw").await;
    c.query_drop("USE test").await.expect("USE test");
    c
}

/// The servers that answered `sql` (a query naming the server) `n` times.
async fn answered(c: &mut mysql_async::Conn, sql: &str, n: usize) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..n {
        let who: String = c.query_first(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")).expect("a row");
        seen.insert(who);
    }
    seen
}

fn set(names: &[&str]) -> std::collections::BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Where the last row of `test.items` was written from: the server that ran the insert.
fn last_written(t: &Topology) -> String {
    t.primary().sql("SELECT v FROM test.items ORDER BY id DESC LIMIT 1").trim().lines().last().unwrap_or_default().trim().to_string()
}

const WHO: &str = "SELECT name FROM whoami";
const WRITE: &str = "INSERT INTO items (v) SELECT name FROM whoami";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_replicas_and_the_rest_to_the_primary_with_the_sessions_state() {
    let t = Topology::start(2);
    label(&t);
    let s = sluice(&t, "split = true\n");
    wait_serving_reads(&s, &["s1", "s2"]);
    let mut c = other(&s).await;

    // Reads are spread over both replicas; the primary answers none.
    assert_eq!(answered(&mut c, WHO, 20).await, set(&["s1", "s2"]));
    // Writes run on the primary.
    c.query_drop(WRITE).await.unwrap();
    assert_eq!(last_written(&t), "s0");
    // So do reads that lock, assign, read what only the primary knows or open a transaction.
    for sql in [
        "SELECT name FROM whoami FOR UPDATE",
        "SELECT name FROM whoami LOCK IN SHARE MODE",
        "SELECT name FROM whoami WHERE LAST_INSERT_ID() >= 0",
        "SELECT name FROM whoami WHERE NEXTVAL(seq) > 0",
    ] {
        assert_eq!(answered(&mut c, sql, 3).await, set(&["s0"]), "{sql}");
    }
    c.query_drop("SELECT name INTO @n FROM whoami").await.unwrap();
    // (The variable, set on the primary, reaches the replica that reads it.)
    let n: String = c.query_first("SELECT @n").await.unwrap().unwrap();
    assert_eq!(n, "s0");
    for begin in ["BEGIN", "START TRANSACTION READ ONLY"] {
        c.query_drop(begin).await.unwrap();
        assert_eq!(answered(&mut c, WHO, 3).await, set(&["s0"]), "{begin}");
        c.query_drop("COMMIT").await.unwrap();
    }
    c.query_drop("SET autocommit = 0").await.unwrap();
    assert_eq!(answered(&mut c, WHO, 3).await, set(&["s0"]), "autocommit off");
    c.query_drop("COMMIT").await.unwrap();
    c.query_drop("SET autocommit = 1").await.unwrap();
    assert_eq!(answered(&mut c, WHO, 10).await, set(&["s1", "s2"]), "autocommit on again");

    // Session state reaches the replicas: the time zone changes what FROM_UNIXTIME says there.
    c.query_drop("SET time_zone = '+05:00'").await.unwrap();
    let seen = answered(&mut c, "SELECT CONCAT(name, ' ', FROM_UNIXTIME(0)) FROM whoami", 10).await;
    assert_eq!(seen, set(&["s1 1970-01-01 05:00:00", "s2 1970-01-01 05:00:00"]));

    // A read that left warnings on a replica, then a write: the write still runs on the primary.
    let _: Vec<(String, i64)> = c.query("SELECT name, CAST('1x' AS SIGNED) FROM whoami").await.unwrap();
    c.query_drop(WRITE).await.unwrap();
    assert_eq!(last_written(&t), "s0", "a write after a read with warnings");

    // Prepared statements are prepared where they run.
    let read = c.prep("SELECT name FROM whoami WHERE ? = ?").await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..10 {
        let who: String = c.exec_first(&read, (i, i)).await.unwrap().expect("a row");
        seen.insert(who);
    }
    assert_eq!(seen, set(&["s1", "s2"]), "a prepared read");
    let write = c.prep("INSERT INTO items (v) SELECT CONCAT(name, ?) FROM whoami").await.unwrap();
    c.exec_drop(&write, ("!",)).await.unwrap();
    assert_eq!(last_written(&t), "s0!");

    assert!(metric(&s, "sluice_split_statements_total{to=\"replica\",reason=\"read\"}") >= 40);
    assert!(metric(&s, "sluice_split_statements_total{to=\"primary\",reason=\"write\"}") >= 2);
    assert!(metric(&s, "sluice_split_statements_total{to=\"primary\",reason=\"locking_read\"}") >= 6);
    assert!(metric(&s, "sluice_split_statements_total{to=\"primary\",reason=\"autocommit_off\"}") >= 1);
    assert_eq!(backend(&s, "s0")["serves_reads"], false, "the primary is no replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_behind_serve_no_reads_and_a_promotion_is_followed() {
    let mut t = Topology::start(2);
    label(&t);
    let s = sluice(&t, "split = true\nmax_replica_lag = \"1s\"\n");
    // The same servers without the split: its sessions belong on the primary.
    let plain = sluice(&t, "");
    wait_serving_reads(&s, &["s1", "s2"]);
    let mut c = other(&s).await;
    let mut p = other(&plain).await;
    assert_eq!(answered(&mut p, WHO, 5).await, set(&["s0"]), "sessions without the split go to the primary");

    // A replica whose SQL thread stopped serves no reads, and says why.
    t.stop_sql_thread(1);
    wait_for("s1 out of reads", || backend(&s, "s1")["serves_reads"] == false);
    assert!(backend(&s, "s1")["reads_out"].as_str().is_some_and(|w| w.contains("replication stopped")), "{}", backend(&s, "s1"));
    assert_eq!(answered(&mut c, WHO, 10).await, set(&["s2"]));
    // With no replica fit for reads, reads go to the primary.
    t.stop_sql_thread(2);
    wait_for("s2 out of reads", || backend(&s, "s2")["serves_reads"] == false);
    assert_eq!(answered(&mut c, WHO, 5).await, set(&["s0"]));
    assert!(metric(&s, "sluice_split_statements_total{to=\"primary\",reason=\"no_replica\"}") >= 5);
    t.start_sql_thread(1);
    t.start_sql_thread(2);
    wait_serving_reads(&s, &["s1", "s2"]);

    // A replica further behind than max_replica_lag serves none until it catches up.
    t.delay(1, 30);
    t.primary().sql("INSERT INTO test.items (v) VALUES ('lag')");
    wait_for("s1 lagging", || backend(&s, "s1")["reads_out"].as_str().is_some_and(|w| w.contains("behind")));
    assert_eq!(answered(&mut c, WHO, 10).await, set(&["s2"]));
    let metrics = admin_get(&s, "/metrics", None).1;
    assert!(metrics.lines().any(|l| l == "sluice_backend_serving_reads{backend=\"s1\"} 0"), "{metrics}");
    assert!(metrics.lines().any(|l| l == "sluice_backend_serving_reads{backend=\"s2\"} 1"), "{metrics}");
    t.delay(1, 0);
    wait_serving_reads(&s, &["s1"]);

    // A failover tool promotes s1: new writes go there, the old primary serves reads, and the
    // session without the split, idle on the old primary, moves to the new one.
    t.promote(1);
    wait_for("s1 the primary", || backend(&s, "s1")["serves_as"] == "primary" && backend(&plain, "s1")["serves_as"] == "primary");
    c.query_drop(WRITE).await.unwrap();
    assert_eq!(last_written(&t), "s1");
    wait_serving_reads(&s, &["s0", "s2"]);
    assert_eq!(answered(&mut c, WHO, 10).await, set(&["s0", "s2"]));
    wait_for("the plain session moved", || metric(&plain, "sluice_session_moves_total{reason=\"role\",result=\"moved\"}") >= 1);
    assert_eq!(answered(&mut p, WHO, 3).await, set(&["s1"]), "the session without the split followed the primary");
    p.query_drop(WRITE).await.unwrap();
    assert_eq!(last_written(&t), "s1");
}

/// Inserts `n` rows through `c`, each followed by a read of it; how many reads saw their row.
async fn insert_then_select(c: &mut mysql_async::Conn, tag: &str, n: usize) -> usize {
    insert_then_count(c, None, tag, n).await
}

/// Inserts `n` rows through `w` and counts, right after each insert, the rows `r` (or `w`)
/// finds.
async fn insert_then_count(w: &mut mysql_async::Conn, mut r: Option<&mut mysql_async::Conn>, tag: &str, n: usize) -> usize {
    let mut seen = 0;
    for i in 0..n {
        w.query_drop(format!("INSERT INTO items (v) VALUES ('{tag}{i}')")).await.unwrap();
        let sql = format!("SELECT COUNT(*) FROM items WHERE v = '{tag}{i}'");
        let found: i64 = match r.as_deref_mut() {
            Some(r) => r.query_first(sql).await,
            None => w.query_first(sql).await,
        }
        .unwrap()
        .unwrap();
        seen += found as usize;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn causal_reads_see_the_sessions_own_writes() {
    let t = Topology::start(1);
    label(&t);
    // A replica 2 s behind: without causal reads a read right after a write misses it.
    t.delay(1, 2);
    let none = sluice(&t, "split = true\n");
    let causal = sluice(&t, "split = true\ncausal_reads = \"session\"\ncausal_reads_timeout = \"0s\"\n");
    wait_serving_reads(&none, &["s1"]);
    wait_serving_reads(&causal, &["s1"]);
    let mut c = other(&none).await;
    let missed = 1000 - insert_then_select(&mut c, "n", 1000).await;
    assert!(missed > 0, "the control run without causal reads saw every row: the delay was not real");
    let mut c = other(&causal).await;
    assert_eq!(insert_then_select(&mut c, "c", 1000).await, 1000, "causal reads saw their own writes");
    // Each of those reads found the replica without the write, and ran on the primary.
    assert!(metric(&causal, "sluice_split_statements_total{to=\"primary\",reason=\"causal\"}") >= 1000);

    // A replica that catches up within the timeout answers after waiting for the write.
    t.delay(1, 0);
    let waiting = sluice(&t, "split = true\ncausal_reads = \"session\"\ncausal_reads_timeout = \"30s\"\n");
    wait_serving_reads(&waiting, &["s1"]);
    let mut c = other(&waiting).await;
    assert_eq!(insert_then_select(&mut c, "w", 200).await, 200);
    assert_eq!(metric(&waiting, "sluice_split_statements_total{to=\"primary\",reason=\"causal\"}"), 0);
    assert!(metric(&waiting, "sluice_split_statements_total{to=\"replica\",reason=\"read\"}") >= 200);
    // (Reads with no write before them do not wait.)
    let who: String = c.query_first(WHO).await.unwrap().unwrap();
    assert_eq!(who, "s1");
}

/// Inserts through one session and counts, through another that never writes, the rows it
/// finds right after each insert.
async fn write_then_read_elsewhere(s: &SluiceProc, tag: &str, n: usize) -> usize {
    let (mut w, mut r) = (other(s).await, other(s).await);
    insert_then_count(&mut w, Some(&mut r), tag, n).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_causal_reads_see_every_sessions_writes() {
    let t = Topology::start(1);
    label(&t);
    t.delay(1, 2);
    let session = sluice(&t, "split = true\ncausal_reads = \"session\"\ncausal_reads_timeout = \"0s\"\n");
    let global = sluice(&t, "split = true\ncausal_reads = \"global\"\ncausal_reads_timeout = \"0s\"\n");
    wait_serving_reads(&session, &["s1"]);
    wait_serving_reads(&global, &["s1"]);
    // The control: a session's causal reads do not wait for another session's writes.
    let missed = 200 - write_then_read_elsewhere(&session, "s", 200).await;
    assert!(missed > 0, "the reading session saw every row without waiting: the delay was not real");
    assert_eq!(write_then_read_elsewhere(&global, "g", 200).await, 200, "global causal reads saw the other session's writes");
    assert!(metric(&global, "sluice_split_statements_total{to=\"primary\",reason=\"causal\"}") >= 200);
}

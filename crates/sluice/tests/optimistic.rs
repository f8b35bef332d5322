//! Optimistic transactions (`[routing] optimistic_transactions`) on real replicated MariaDB: a
//! transaction begins on a replica (with autocommit off, every implicit one), moves to the
//! primary at its first write when its reads are the same there, and gets error 1213 when they
//! are not. The client logs in as `other`, which may not write on a read-only server: a write
//! left on the replica would fail.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_testkit::Topology;

fn optimistic_sluice(t: &Topology) -> SluiceProc {
    t.primary().sql("CREATE TABLE test.r (id INT PRIMARY KEY, v INT); INSERT INTO test.r VALUES (1, 10), (2, 20)");
    t.wait_caught_up();
    split_sluice_with(t, "optimistic_transactions = true\n")
}

/// The backend the only session is on now (its open transaction's).
fn on(s: &SluiceProc) -> String {
    let l = json(&admin_get(s, "/sessions", None).1);
    l[0]["backend"].as_str().unwrap_or_default().to_string()
}

fn replays(s: &SluiceProc, result: &str) -> u64 {
    metric(s, &format!("sluice_transaction_replays_total{{result=\"{result}\"}}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_reads_on_a_replica_and_moves_to_the_primary_at_its_first_write() {
    let t = Topology::start(1);
    let s = optimistic_sluice(&t);
    let (primary, replica) = ("s0", "s1");
    let mut c = connect(&s.listen, "other", "otherpw").await;

    // Autocommit off: the implicit transaction begins on the replica.
    c.query_drop("SET autocommit = 0").await.unwrap();
    let v: Option<i64> = c.query_first("SELECT v FROM test.r WHERE id = 1").await.unwrap();
    assert_eq!(v, Some(10));
    assert_eq!(on(&s), replica, "the transaction's reads run on the replica");
    c.query_drop("UPDATE test.r SET v = v + 1 WHERE id = 1").await.unwrap();
    assert_eq!(on(&s), primary, "from its first write on, it runs on the primary");
    c.query_drop("COMMIT").await.unwrap();
    assert_eq!(t.servers[0].sql("SELECT v FROM test.r WHERE id = 1").trim(), "11");
    assert_eq!(replays(&s, "optimistic"), 1);

    // A transaction that only reads begins and ends on the replica.
    let v: Option<i64> = c.query_first("SELECT v FROM test.r WHERE id = 2").await.unwrap();
    assert_eq!(v, Some(20));
    assert_eq!(on(&s), replica);
    c.query_drop("COMMIT").await.unwrap();
    assert_eq!(replays(&s, "optimistic"), 1, "nothing moved");

    // With autocommit on, an explicit transaction does the same.
    c.query_drop("SET autocommit = 1").await.unwrap();
    c.query_drop("BEGIN").await.unwrap();
    let v: Option<i64> = c.query_first("SELECT v FROM test.r WHERE id = 2").await.unwrap();
    assert_eq!(v, Some(20));
    assert_eq!(on(&s), replica);
    c.query_drop("UPDATE test.r SET v = v + 1 WHERE id = 2").await.unwrap();
    c.query_drop("COMMIT").await.unwrap();
    assert_eq!(t.servers[0].sql("SELECT v FROM test.r WHERE id = 2").trim(), "21");
    assert_eq!(replays(&s, "optimistic"), 2);
    assert!(metric(&s, "sluice_split_statements_total{to=\"replica\",reason=\"optimistic\"}") >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_whose_reads_differ_on_the_primary_gets_an_error() {
    let t = Topology::start(1);
    let s = optimistic_sluice(&t);
    let mut c = connect(&s.listen, "other", "otherpw").await;
    c.query_drop("SET autocommit = 0").await.unwrap();
    let v: Option<i64> = c.query_first("SELECT v FROM test.r WHERE id = 2").await.unwrap();
    assert_eq!(v, Some(20));
    // Another client changes what the transaction read (its snapshot on the replica keeps 20).
    t.primary().sql("UPDATE test.r SET v = 99 WHERE id = 2");

    let e = c.query_drop("UPDATE test.r SET v = v + 1 WHERE id = 1").await.unwrap_err();
    let mysql_async::Error::Server(e) = e else { panic!("a server error: {e}") };
    assert_eq!(e.code, 1213, "{}", e.message);
    assert_eq!(e.state, "40001");
    assert!(e.message.contains("began on replica s1 and moved to the primary"), "{}", e.message);
    assert!(e.message.contains("statement 1 (SELECT v FROM test.r WHERE id = 2) had another result"), "{}", e.message);
    assert_eq!(replays(&s, "optimistic_diverged"), 1);
    // Nothing of it was written; the session goes on, and its next transaction does.
    assert_eq!(t.servers[0].sql("SELECT v FROM test.r WHERE id = 1").trim(), "10");
    t.wait_caught_up();
    let v: Option<i64> = c.query_first("SELECT v FROM test.r WHERE id = 2").await.unwrap();
    assert_eq!(v, Some(99));
    c.query_drop("UPDATE test.r SET v = v + 1 WHERE id = 1").await.unwrap();
    c.query_drop("COMMIT").await.unwrap();
    assert_eq!(t.servers[0].sql("SELECT v FROM test.r WHERE id = 1").trim(), "11");
}

/// Prepared statements (the binary protocol, as most drivers send parameters): the executes
/// read on the replica are run again on the primary, prepared there first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_prepared_statements_moves_to_the_primary() {
    let t = Topology::start(1);
    let s = optimistic_sluice(&t);
    let mut c = connect(&s.listen, "other", "otherpw").await;
    c.query_drop("SET autocommit = 0").await.unwrap();
    let v: Option<i64> = c.exec_first("SELECT v FROM test.r WHERE id = ?", (1,)).await.unwrap();
    assert_eq!(v, Some(10));
    assert_eq!(on(&s), "s1", "the transaction's reads run on the replica");
    c.exec_drop("UPDATE test.r SET v = v + ? WHERE id = ?", (5, 1)).await.unwrap();
    assert_eq!(on(&s), "s0");
    let v: Option<i64> = c.exec_first("SELECT v FROM test.r WHERE id = ?", (1,)).await.unwrap();
    assert_eq!(v, Some(15));
    c.query_drop("COMMIT").await.unwrap();
    assert_eq!(t.servers[0].sql("SELECT v FROM test.r WHERE id = 1").trim(), "15");
    assert_eq!(replays(&s, "optimistic"), 1);
}

//! Commit marks (`[routing] commit_table`), against a real replicated MariaDB behind the fault
//! shim: a COMMIT whose connection is lost is looked up in the commit table on the primary
//! and answered as it turned out, never run twice: committed (its answer was lost), or
//! replayed and committed (it never reached the server). A lost ROLLBACK is answered. A user
//! without the grants on the table goes on unmarked, and its lost COMMIT is reported as
//! unknown (1180).

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_testkit::Topology;
use sluice_testkit::fault::{Action, Dir, Fault, FaultProxy, Trigger};

struct Rig {
    t: Topology,
    shim: FaultProxy,
    s: SluiceProc,
}

/// A primary (behind the shim) and a replica, failover on, and the commit table made.
fn rig() -> Rig {
    let t = Topology::start(1);
    t.primary().sql("CREATE TABLE test.r (id INT PRIMARY KEY, v INT); INSERT INTO test.r VALUES (1, 10)");
    let shim = FaultProxy::start(&t.servers[0].addr());
    let mut c = TestConfig::new()
        .table("health", "interval = \"100ms\"\ntimeout = \"500ms\"\nfall = 2\nrise = 2\nuser = \"monitor\"\npassword = \"monitorpw\"\n")
        .table("failover", "enabled = true\nuser = \"app\"\npassword = \"apppw\"\nafter = \"300ms\"\n")
        .table("routing", "commit_table = \"sluice.commits\"\n")
        .app_users();
    for (i, server) in t.servers.iter().enumerate() {
        let address = if i == 0 { shim.addr() } else { server.addr() };
        c = c.backend_with(&address, &format!("name = \"s{i}\"\n"));
    }
    let s = c.start();
    let made = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'sluice' AND table_name = 'commits'";
    if !try_wait_for(|| t.primary().sql(made).trim() == "1") {
        panic!("the commit table was not made on the primary; sluice's log:\n{}", s.log_text());
    }
    Rig { t, shim, s }
}

impl Rig {
    fn v(&self) -> String {
        self.t.primary().sql("SELECT v FROM test.r WHERE id = 1").trim().to_string()
    }

    fn replays(&self, result: &str) -> u64 {
        metric(&self.s, &format!("sluice_transaction_replays_total{{result=\"{result}\"}}"))
    }

    /// The next connection to send `pattern` to the server is reset right after it: the
    /// statement may never be read.
    fn reset_after(&self, pattern: &[u8]) {
        self.shim.arm(Fault::new(Trigger::Pattern(Dir::ToServer, pattern.to_vec()), Dir::ToServer, 0, Action::Reset));
    }

    /// The next connection to send `pattern` to the server is reset once the first byte of
    /// the answer came back: the statement ran.
    fn reset_answer_to(&self, pattern: &[u8]) {
        self.shim.arm(Fault::new(Trigger::Pattern(Dir::ToServer, pattern.to_vec()), Dir::ToClient, 1, Action::Reset));
    }
}

async fn update_in_transaction(c: &mut mysql_async::Conn) {
    c.query_drop("BEGIN").await.unwrap();
    c.query_drop("UPDATE test.r SET v = v + 1 WHERE id = 1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commits_are_answered_as_they_turned_out() {
    let r = rig();
    let mut c = app(&r.s).await;

    // The COMMIT ran; its answer was lost: the client gets its OK, and it ran once.
    update_in_transaction(&mut c).await;
    r.reset_answer_to(b"COMMIT");
    c.query_drop("COMMIT").await.expect("the COMMIT answered");
    assert_eq!(r.shim.fired(), 1);
    assert_eq!(r.v(), "11");
    assert_eq!(r.replays("committed"), 1);

    // The COMMIT never reached the server: the transaction is replayed and committed, once.
    update_in_transaction(&mut c).await;
    r.reset_after(b"VALUES(seq)");
    c.query_drop("COMMIT").await.expect("the COMMIT answered");
    assert_eq!(r.shim.fired(), 2);
    assert_eq!(r.v(), "12");
    assert_eq!(r.replays("replayed"), 1);

    // A lost ROLLBACK: answered, and nothing of the transaction is kept.
    update_in_transaction(&mut c).await;
    r.reset_answer_to(b"ROLLBACK");
    c.query_drop("ROLLBACK").await.expect("the ROLLBACK answered");
    assert_eq!(r.shim.fired(), 3);
    assert_eq!(r.v(), "12");

    // The session goes on, out of any transaction.
    let v: Option<i64> = c.query_first("SELECT v FROM test.r WHERE id = 1").await.unwrap();
    assert_eq!(v, Some(12));
    c.query_drop("UPDATE test.r SET v = 0 WHERE id = 1").await.unwrap();
    assert_eq!(r.v(), "0");
    assert_eq!(r.replays("unknown"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_grants_goes_on_unmarked() {
    let r = rig();
    // `other` may write test.* only.
    let mut c = connect(&r.s.listen, "other", "otherpw").await;
    update_in_transaction(&mut c).await;
    c.query_drop("COMMIT").await.expect("a COMMIT without its mark");
    assert_eq!(r.v(), "11");

    update_in_transaction(&mut c).await;
    r.reset_answer_to(b"COMMIT");
    let e = c.query_drop("COMMIT").await.unwrap_err();
    let mysql_async::Error::Server(e) = e else { panic!("a server error: {e}") };
    assert_eq!(e.code, 1180, "{}", e.message);
    assert!(e.message.contains("whether it committed is unknown"), "{}", e.message);
    assert_eq!(r.v(), "12", "it committed, which the client was not told");
    assert_eq!(r.replays("unknown"), 1);
}

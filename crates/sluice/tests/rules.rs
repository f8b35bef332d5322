//! Query rules and digests on real MariaDB: blocking, rewriting, timing out and mirroring
//! statements, routing them to named backends and groups (a rule or a comment), and the
//! per-digest statistics and per-rule hits the admin API and `/metrics` show.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_testkit::{MariaDb, Topology};

const RULES: &str = r#"
[[rules]]
name = "no-deletes"
match = "^delete from items"
block = "deletes go through the batch job"
error_code = 1142
[[rules]]
name = "old-name"
match = "from items_v1"
rewrite = "(?i)items_v1"
replace = "items"
[[rules]]
name = "slow"
match = "sleep"
timeout = "200ms"
[[rules]]
name = "shadow"
user = "app"
match = "^insert into items"
mirror = "shadow"
"#;

/// Two servers: `main`, which sessions use, and `shadow`, which only receives mirrored copies
/// (a replica by role, so no session is sent there).
fn two() -> (MariaDb, MariaDb, SluiceProc) {
    let (main, shadow) = (MariaDb::start(), MariaDb::start());
    for db in [&main, &shadow] {
        db.sql("CREATE TABLE test.items (id INT AUTO_INCREMENT PRIMARY KEY, v INT)");
    }
    let mut c = TestConfig::new().proxy("workers = 2\n").app_users();
    c = c
        .backend_with(&main.addr(), "name = \"main\"\nrole = \"primary\"\n")
        .backend_with(&shadow.addr(), "name = \"shadow\"\nrole = \"replica\"\n");
    let s = c.table("digests", "enabled = true\n").text() + RULES;
    let proc = start_sluice_config(&s);
    (main, shadow, proc)
}

fn count(db: &MariaDb, sql: &str) -> u64 {
    db.sql(sql).trim().lines().last().unwrap_or("0").trim().parse().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_block_rewrite_time_out_and_mirror() {
    let (main, shadow, s) = two();
    let mut c = connect(&s.listen, "app", "apppw").await;
    c.query_drop("USE test").await.expect("USE");
    // Block: the configured error, and the session goes on.
    let e = c.query_drop("DELETE FROM items WHERE id = 1").await.expect_err("blocked");
    match e {
        mysql_async::Error::Server(e) => {
            assert_eq!(e.code, 1142);
            assert_eq!(e.message, "deletes go through the batch job");
        }
        e => panic!("{e}"),
    }
    // Mirror: every insert also reaches the shadow, whose answers the client never sees.
    for i in 0..20 {
        c.exec_drop("INSERT INTO items (v) VALUES (?)", (i,)).await.expect("prepared insert");
        c.query_drop(format!("INSERT INTO items (v) VALUES ({i})")).await.expect("insert");
    }
    assert_eq!(count(&main, "SELECT COUNT(*) FROM test.items"), 40);
    // (Only text queries are mirrored: a prepared statement's copy would need its parameters.)
    wait_for("the shadow's copies", || count(&shadow, "SELECT COUNT(*) FROM test.items") == 20);
    // Rewrite: the old table name still works.
    let n: u64 = c.query_first("SELECT COUNT(*) FROM items_v1 WHERE v >= 0").await.expect("rewritten").expect("row");
    assert_eq!(n, 40);
    // Timeout: the statement is killed on its backend, and the client gets the server's error.
    match c.query_drop("SELECT SLEEP(60)").await.expect_err("killed") {
        mysql_async::Error::Server(e) => assert_eq!(e.code, 1317, "{}", e.message),
        e => panic!("{e}"),
    }
    let after: u64 = c.query_first("SELECT COUNT(*) FROM items").await.expect("the session goes on").expect("row");
    assert_eq!(after, 40);
    // Hits per rule, in /metrics and /rules.
    assert_eq!(metric(&s, "sluice_rule_hits_total{rule=\"no-deletes\"}"), 1);
    // (The prepare, once, and each execute and query.)
    assert_eq!(metric(&s, "sluice_rule_hits_total{rule=\"shadow\"}"), 41);
    assert_eq!(metric(&s, "sluice_rule_timeouts_total{rule=\"slow\"}"), 1);
    assert_eq!(metric(&s, "sluice_mirrored_statements_total{outcome=\"sent\"}"), 20);
    let rules = json(&admin_get(&s, "/rules", None).1);
    assert_eq!(rules[1]["name"], "old-name");
    assert_eq!(rules[1]["hits"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digests_count_statements_by_shape() {
    let (_main, _shadow, s) = two();
    let mut c = connect(&s.listen, "other", "otherpw").await;
    c.query_drop("USE test").await.expect("USE");
    for i in 0..30 {
        c.query_drop(format!("INSERT INTO items (v) VALUES ({i}), ({i})")).await.expect("insert");
        let _: Vec<i64> = c.query(format!("SELECT v FROM items WHERE v IN ({i}, {})", i + 1)).await.expect("select");
        let _: Vec<i64> = c.exec("SELECT v FROM items WHERE id = ?", (i,)).await.expect("execute");
    }
    let _ = c.query_drop("SELECT nope FROM items").await.expect_err("unknown column");
    c.disconnect().await.expect("quit");
    wait_sessions_closed(&s);
    let (code, body) = admin_get(&s, "/digests?top=10&by=count", None);
    assert_eq!(code, 200, "{body}");
    let v = json(&body);
    let list = v["digests"].as_array().expect("digests");
    let find = |text: &str| list.iter().find(|d| d["text"] == text).unwrap_or_else(|| panic!("{text} in {body}")).clone();
    let insert = find("insert into items(v) values (...)");
    assert_eq!(insert["count"], 30);
    let select = find("select v from items where v in (...)");
    assert_eq!(select["count"], 30);
    // Rows sent: each IN list matched the two rows just inserted.
    assert_eq!(select["rows"], 60, "{select}");
    assert_eq!(find("select v from items where id = ?")["count"], 30);
    assert_eq!(find("select nope from items")["errors"], 1);
    assert!(select["p99_us"].as_f64().expect("p99") >= select["min_us"].as_f64().expect("min"));
    assert_eq!(select["schema"], "test");
    let (code, _) = admin_get(&s, "/digests?by=nonsense", None);
    assert_eq!(code, 400);
}

/// Statements that differ in their values, spacing and comments alone count as one digest,
/// in passthrough and in users mode (where the digest comes from the table of keys read in the
/// statement's one pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_differing_in_values_spacing_and_comments_count_as_one() {
    let db = shared_db();
    for users in [false, true] {
        let base = TestConfig::new().dbs(&[db]).table("digests", "enabled = true\n");
        let s = if users { base.app_users().start() } else { base.start() };
        let mut c = app(&s).await;
        for i in 0..20 {
            let (select, space) = if i % 2 == 0 { ("SELECT", "") } else { ("select", "  ") };
            let _: Vec<i64> = c.query(format!("{select} {i} /* trace {i} */ + 1 AS  n{space}")).await.unwrap();
        }
        c.disconnect().await.unwrap();
        wait_sessions_closed(&s);
        let (code, body) = admin_get(&s, "/digests?by=count", None);
        assert_eq!(code, 200, "{body}");
        let v = json(&body);
        assert_eq!(v["enabled"], true, "{body}");
        let list = v["digests"].as_array().expect("digests");
        let it = list.iter().find(|d| d["text"] == "select ? + ? as n").unwrap_or_else(|| panic!("users mode {users}: {body}"));
        assert_eq!(it["count"], 20, "users mode {users}: {body}");
    }
}

/// Without a `[digests]` table, a users-mode session's statements are counted (it reads them
/// anyway) and a passthrough session's are not; `enabled = false` counts none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digests_are_on_by_default_where_statements_are_read_anyway() {
    let db = shared_db();
    for (users, table, counted) in [(true, "", true), (false, "", false), (true, "enabled = false\n", false)] {
        let base = TestConfig::new().dbs(&[db]);
        let base = if table.is_empty() { base } else { base.table("digests", table) };
        let s = if users { base.app_users().start() } else { base.start() };
        let mut c = app(&s).await;
        for i in 0..5 {
            let _: Vec<i64> = c.query(format!("SELECT {i} + 1 AS by_default")).await.unwrap();
        }
        c.disconnect().await.unwrap();
        wait_sessions_closed(&s);
        let (code, body) = admin_get(&s, "/digests?by=count", None);
        assert_eq!(code, 200, "{body}");
        let v = json(&body);
        let list = v["digests"].as_array().expect("digests");
        let it = list.iter().find(|d| d["text"] == "select ? + ? as by_default");
        assert_eq!(it.map(|d| d["count"].clone()), counted.then(|| json("5")), "users mode {users}, [digests] {table:?}: {body}");
    }
}

/// Routes over a replicated topology: a rule naming a backend or a group, a comment, and a
/// comment that wins over a rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_comments_route_statements() {
    let t = Topology::start(2);
    t.primary().sql("CREATE TABLE test.whoami (name VARCHAR(16))");
    t.wait_caught_up();
    for (i, db) in t.servers.iter().enumerate() {
        db.sql(&format!("SET sql_log_bin = 0; INSERT INTO test.whoami VALUES ('s{i}')"));
    }
    let mut c = TestConfig::new()
        .proxy("workers = 1\n")
        .table("health", "interval = \"50ms\"\nuser = \"monitor\"\npassword = \"monitorpw\"\n")
        .table("routing", "split = true\n")
        .app_users()
        .rule("name = \"to-primary\"\nmatch = \"where \\\\? = \\\\?\"\nroute = \"s0\"\n")
        .rule("name = \"to-second\"\nmatch = \"where name like\"\nroute = \"second\"\n");
    for (i, db) in t.servers.iter().enumerate() {
        let group = if i == 2 { "group = \"second\"\n" } else { "" };
        c = c.backend_with(&db.addr(), &format!("name = \"s{i}\"\n{group}"));
    }
    let s = c.start();
    for r in ["s1", "s2"] {
        wait_for(&format!("{r} serving reads"), || {
            json(&admin_get(&s, "/backends", None).1).as_array().expect("list").iter().any(|b| b["name"] == r && b["serves_reads"] == true)
        });
    }
    let mut c = connect(&s.listen, "other", "otherpw").await;
    c.query_drop("USE test").await.expect("USE");
    let mut seen = std::collections::BTreeMap::<&str, std::collections::BTreeSet<String>>::new();
    for _ in 0..12 {
        for (what, sql) in [
            ("plain", "SELECT name FROM whoami"),
            ("rule-backend", "SELECT name FROM whoami WHERE 1 = 1"),
            ("rule-group", "SELECT name FROM whoami WHERE name LIKE '%'"),
            ("comment", "SELECT /* sluice: route=primary */ name FROM whoami"),
            ("comment-over-rule", "SELECT /* sluice: route=s1 */ name FROM whoami WHERE 1 = 1"),
        ] {
            let who: String = c.query_first(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")).expect("row");
            seen.entry(what).or_default().insert(who);
        }
    }
    let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<std::collections::BTreeSet<_>>();
    assert_eq!(seen["plain"], set(&["s1", "s2"]));
    assert_eq!(seen["rule-backend"], set(&["s0"]));
    assert_eq!(seen["rule-group"], set(&["s2"]));
    assert_eq!(seen["comment"], set(&["s0"]));
    assert_eq!(seen["comment-over-rule"], set(&["s1"]));
    assert_eq!(metric(&s, "sluice_split_statements_total{to=\"rule\",reason=\"rule\"}"), 48);
}

/// The result cache: a read's answer is served again, without the backend, to the same user
/// for the same text until its TTL passes; not to another user, not in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_reads_are_served_from_the_cache_until_they_expire() {
    let db = MariaDb::start();
    db.sql("CREATE TABLE test.items (id INT PRIMARY KEY, v INT); INSERT INTO test.items VALUES (1, 10), (2, 20)");
    let s = TestConfig::new()
        .proxy("workers = 1\n")
        .app_users()
        .dbs(&[&db])
        .rule("name = \"long\"\nmatch = \"where id = \\\\?$\"\ncache_ttl = \"1h\"\n")
        .rule("name = \"short\"\nmatch = \"where id > \\\\?$\"\ncache_ttl = \"1s\"\n")
        .start();
    let mut c = connect(&s.listen, "app", "apppw").await;
    c.query_drop("USE test").await.expect("USE");
    let v: Option<i64> = c.query_first("SELECT v FROM items WHERE id = 1").await.expect("first read");
    assert_eq!(v, Some(10));
    let sum: Option<i64> = c.query_first("SELECT SUM(v) FROM items WHERE id > 0").await.expect("first sum");
    assert_eq!(sum, Some(30));
    // Changed behind sluice's back: the cache still answers with what it kept.
    db.sql("UPDATE test.items SET v = v + 1");
    let v: Option<i64> = c.query_first("SELECT v FROM items WHERE id = 1").await.expect("cached read");
    assert_eq!(v, Some(10), "served from the cache");
    assert_eq!(metric(&s, "sluice_result_cache_total{outcome=\"hit\"}"), 1);
    // Another text, another user, a transaction: the backend answers.
    let v: Option<i64> = c.query_first("SELECT v FROM items WHERE id = 2").await.expect("other text");
    assert_eq!(v, Some(21));
    let mut o = connect(&s.listen, "other", "otherpw").await;
    o.query_drop("USE test").await.expect("USE");
    let v: Option<i64> = o.query_first("SELECT v FROM items WHERE id = 1").await.expect("other user");
    assert_eq!(v, Some(11));
    c.query_drop("BEGIN").await.expect("BEGIN");
    let v: Option<i64> = c.query_first("SELECT v FROM items WHERE id = 1").await.expect("in a transaction");
    assert_eq!(v, Some(11));
    c.query_drop("COMMIT").await.expect("COMMIT");
    // A short TTL runs out: the cached sum is served until it does, then the server's.
    let mut sum: Option<i64> = None;
    for _ in 0..600 {
        sum = c.query_first("SELECT SUM(v) FROM items WHERE id > 0").await.expect("sum");
        if sum != Some(30) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(sum, Some(32), "the 1 s answer expired");
}

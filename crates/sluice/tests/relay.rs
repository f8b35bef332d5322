//! The command relay against a real MariaDB: every command, multi-results, prepared statements
//! with cursors and long data, large packets, LOAD DATA LOCAL, KILL.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_proto::consts::{com, status};

#[tokio::test]
async fn queries_multi_statements_and_multi_results() {
    let s = shared_sluice();
    let mut c = app(s).await;
    fresh_db(&mut c, "relay_multi").await;
    c.query_drop("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))").await.unwrap();
    c.query_drop("INSERT INTO t VALUES (1, 'a'), (2, ''), (3, NULL)").await.unwrap();
    let rows: Vec<(i32, Option<String>)> = c.query("SELECT id, v FROM t ORDER BY id").await.unwrap();
    assert_eq!(rows, vec![(1, Some("a".into())), (2, Some("".into())), (3, None)]);

    // Several statements in one COM_QUERY: several result sets and OKs.
    let mut r = c.query_iter("SELECT 1; UPDATE t SET v = 'b' WHERE id = 1; SELECT id FROM t ORDER BY id").await.unwrap();
    let first: Vec<i64> = r.collect().await.unwrap();
    assert_eq!(first, vec![1]);
    let second: Vec<mysql_async::Row> = r.collect().await.unwrap();
    assert!(second.is_empty());
    assert_eq!(r.affected_rows(), 1);
    let third: Vec<i32> = r.collect().await.unwrap();
    assert_eq!(third, vec![1, 2, 3]);
    drop(r);

    // A stored procedure answers with two result sets and a final OK.
    c.query_drop("CREATE PROCEDURE two() BEGIN SELECT 'x'; SELECT 'y', 'z'; END").await.unwrap();
    let mut r = c.query_iter("CALL two()").await.unwrap();
    let a: Vec<String> = r.collect().await.unwrap();
    let b: Vec<(String, String)> = r.collect().await.unwrap();
    assert_eq!((a, b), (vec!["x".to_string()], vec![("y".to_string(), "z".to_string())]));
    drop(r);

    // An error ends the statement cleanly and the session goes on.
    let e = c.query_drop("SELECT * FROM no_such_table").await.unwrap_err();
    assert!(e.to_string().contains("1146"), "{e}");
    let one: Option<i32> = c.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    c.disconnect().await.unwrap();
}

#[tokio::test]
async fn prepared_statements_in_binary_protocol() {
    let s = shared_sluice();
    let mut c = app(s).await;
    fresh_db(&mut c, "relay_ps").await;
    c.query_drop("CREATE TABLE t (id INT, d DOUBLE, s TEXT, b BLOB, dt DATETIME)").await.unwrap();
    let ins = c.prep("INSERT INTO t VALUES (?, ?, ?, ?, ?)").await.unwrap();
    for i in 0..20 {
        c.exec_drop(&ins, (i, i as f64 / 2.0, format!("s{i}"), vec![i as u8; i as usize], "2024-01-02 03:04:05")).await.unwrap();
    }
    c.close(ins).await.unwrap();
    let rows: Vec<(i32, f64, String, Vec<u8>)> = c.exec("SELECT id, d, s, b FROM t WHERE id >= ? ORDER BY id", (10,)).await.unwrap();
    assert_eq!(rows.len(), 10);
    assert_eq!(rows[3], (13, 6.5, "s13".to_string(), vec![13u8; 13]));
    c.disconnect().await.unwrap();
}

#[tokio::test]
async fn values_of_64_mib_both_ways() {
    let s = shared_sluice();
    let mut c = app(s).await;
    fresh_db(&mut c, "relay_big").await;
    c.query_drop("CREATE TABLE t (id INT, b LONGBLOB)").await.unwrap();
    let big: Vec<u8> = (0..64 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    c.exec_drop("INSERT INTO t VALUES (1, ?)", (big.clone(),)).await.unwrap();
    // Binary protocol.
    let back: Option<Vec<u8>> = c.exec_first("SELECT b FROM t WHERE id = ?", (1,)).await.unwrap();
    assert!(back.as_ref() == Some(&big), "64 MiB value came back different (binary protocol)");
    // Text protocol, and a query text of more than 16 MiB.
    let back: Option<Vec<u8>> = c.query_first("SELECT b FROM t WHERE id = 1").await.unwrap();
    assert!(back.as_ref() == Some(&big), "64 MiB value came back different (text protocol)");
    let long_sql = format!("SELECT LENGTH('{}')", "q".repeat(20 * 1024 * 1024));
    let n: Option<u64> = c.query_first(long_sql).await.unwrap();
    assert_eq!(n, Some(20 * 1024 * 1024));
    c.disconnect().await.unwrap();
}

/// A result set of many rows of varied sizes: several megabytes that sluice reads in growing
/// buffers, rows straddling every read, in both protocols, and the session goes on after it.
#[tokio::test]
async fn results_of_many_rows_of_varied_sizes() {
    let s = shared_sluice();
    let mut c = app(s).await;
    c.query_drop("SET SESSION max_recursive_iterations = 100000").await.unwrap();
    let sql = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 20000) \
               SELECT n, REPEAT(CHAR(65 + n % 26), n % 700) FROM r";
    let expected: Vec<(u32, String)> =
        (1..=20000u32).map(|n| (n, char::from(b'A' + (n % 26) as u8).to_string().repeat((n % 700) as usize))).collect();
    let text: Vec<(u32, String)> = c.query(sql).await.unwrap();
    assert!(text == expected, "text protocol: {} rows, not the 20000 expected", text.len());
    let binary: Vec<(u32, String)> = c.exec(sql, ()).await.unwrap();
    assert!(binary == expected, "binary protocol: {} rows, not the 20000 expected", binary.len());
    let one: Option<i32> = c.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    c.disconnect().await.unwrap();
}
#[tokio::test]
async fn ping_init_db_reset_and_change_user() {
    let s = shared_sluice();
    let mut c = app(s).await;
    c.ping().await.unwrap();
    c.query_drop("CREATE DATABASE IF NOT EXISTS relay_cmd").await.unwrap();
    c.query_drop("USE relay_cmd").await.unwrap();
    let db: Option<String> = c.query_first("SELECT DATABASE()").await.unwrap();
    assert_eq!(db.as_deref(), Some("relay_cmd"));
    c.query_drop("SET @v = 42").await.unwrap();
    c.reset().await.unwrap();
    let v: Option<Option<i32>> = c.query_first("SELECT @v").await.unwrap();
    assert_eq!(v, Some(None), "COM_RESET_CONNECTION clears user variables");

    c.change_user(mysql_async::ChangeUserOpts::default().with_user(Some("other".into())).with_pass(Some("otherpw".into()))).await.unwrap();
    let u: Option<String> = c.query_first("SELECT CURRENT_USER()").await.unwrap();
    assert_eq!(u.as_deref(), Some("other@%"));
    let bad = c.change_user(mysql_async::ChangeUserOpts::default().with_user(Some("other".into())).with_pass(Some("wrong".into()))).await;
    assert!(bad.is_err(), "a wrong password in COM_CHANGE_USER is refused");
}

#[tokio::test]
async fn statistics_field_list_set_option_and_unknown_commands() {
    let s = shared_sluice();
    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    let st = r.command(&[com::STATISTICS]);
    assert!(String::from_utf8_lossy(&st[0]).contains("Uptime"), "{:?}", st);

    r.query("CREATE DATABASE IF NOT EXISTS relay_raw");
    r.query("CREATE TABLE IF NOT EXISTS relay_raw.f (a INT, b INT)");
    let mut p = vec![com::INIT_DB];
    p.extend_from_slice(b"relay_raw");
    assert_eq!(r.command(&p)[0][0], 0);
    let mut p = vec![com::FIELD_LIST];
    p.extend_from_slice(b"f\0");
    let fields = r.command(&p);
    assert_eq!(fields.len(), 3, "two column definitions and the terminator");

    // Multi-statements off, then on again.
    let off = r.command(&[com::SET_OPTION, 1, 0]);
    assert_ne!(off[0][0], 0xff);
    let e = r.query("SELECT 1; SELECT 2");
    assert_eq!(err_code(e.last().unwrap()), Some(1064));
    r.command(&[com::SET_OPTION, 0, 0]);
    let ok = r.query("SELECT 1; SELECT 2");
    assert!(ok.iter().all(|p| err_code(p).is_none()));

    // Replication commands are refused with a clear error; the session continues.
    let e = r.command(&[com::BINLOG_DUMP, 0, 0, 0, 0]);
    assert_eq!(err_code(&e[0]), Some(1047));
    assert!(r.query("SELECT 1").iter().all(|p| err_code(p).is_none()));
}

#[tokio::test]
async fn cursors_fetch_and_long_data() {
    let s = shared_sluice();
    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    r.query("CREATE DATABASE IF NOT EXISTS relay_cursor");
    r.query("CREATE TABLE IF NOT EXISTS relay_cursor.t (id INT, b BLOB)");
    r.query("DELETE FROM relay_cursor.t");
    r.query("INSERT INTO relay_cursor.t VALUES (1, NULL), (2, NULL), (3, NULL), (4, NULL), (5, NULL)");

    // Long data: the parameter is sent in pieces before the execute.
    let (id, _, params) = r.prepare("UPDATE relay_cursor.t SET b = ? WHERE id = 1");
    assert_eq!(params, 1);
    for chunk in [&b"hello "[..], b"long ", b"data"] {
        let mut ld = vec![com::STMT_SEND_LONG_DATA];
        ld.extend_from_slice(&id.to_le_bytes());
        ld.extend_from_slice(&0u16.to_le_bytes());
        ld.extend_from_slice(chunk);
        assert!(r.command(&ld).is_empty());
    }
    let mut ex = vec![com::STMT_EXECUTE];
    ex.extend_from_slice(&id.to_le_bytes());
    ex.push(0); // no cursor
    ex.extend_from_slice(&1u32.to_le_bytes());
    ex.push(0); // null bitmap
    ex.push(1); // new params bound
    ex.extend_from_slice(&[0xfc, 0]); // MYSQL_TYPE_BLOB
    let res = r.command(&ex);
    assert_eq!(res[0][0], 0, "{}", String::from_utf8_lossy(&res[0]));
    let b = r.query("SELECT b FROM relay_cursor.t WHERE id = 1");
    assert!(b.iter().any(|p| p.ends_with(b"hello long data")), "{b:?}");
    let mut close = vec![com::STMT_CLOSE];
    close.extend_from_slice(&id.to_le_bytes());
    assert!(r.command(&close).is_empty());

    // A read-only cursor, fetched two rows at a time.
    let (id, cols, _) = r.prepare("SELECT id FROM relay_cursor.t ORDER BY id");
    assert_eq!(cols, 1);
    let mut ex = vec![com::STMT_EXECUTE];
    ex.extend_from_slice(&id.to_le_bytes());
    ex.push(1); // CURSOR_TYPE_READ_ONLY
    ex.extend_from_slice(&1u32.to_le_bytes());
    let meta = r.command(&ex);
    let last = meta.last().unwrap();
    let st = sluice_proto::basic::terminator_status(last, true).expect("status after metadata");
    assert_ne!(st & status::CURSOR_EXISTS, 0, "cursor opened");
    let mut rows = 0;
    loop {
        let mut f = vec![com::STMT_FETCH];
        f.extend_from_slice(&id.to_le_bytes());
        f.extend_from_slice(&2u32.to_le_bytes());
        let got = r.command(&f);
        rows += got.len() - 1;
        let st = sluice_proto::basic::terminator_status(got.last().unwrap(), true).unwrap();
        if st & status::LAST_ROW_SENT != 0 {
            break;
        }
        assert!(rows <= 5);
    }
    assert_eq!(rows, 5);
    let mut reset = vec![com::STMT_RESET];
    reset.extend_from_slice(&id.to_le_bytes());
    assert_eq!(r.command(&reset)[0][0], 0);
}

#[test]
fn load_data_local_infile_with_the_mariadb_cli() {
    let s = shared_sluice();
    let file = sluice_testkit::mariadb::work_root().join(format!("infile-{}.csv", std::process::id()));
    let mut text = String::new();
    for i in 0..50_000 {
        text.push_str(&format!("{i},row number {i}\n"));
    }
    std::fs::write(&file, &text).unwrap();
    let sql = format!(
        "CREATE DATABASE IF NOT EXISTS relay_infile; USE relay_infile; DROP TABLE IF EXISTS t; \
         CREATE TABLE t (id INT, v VARCHAR(64)); \
         LOAD DATA LOCAL INFILE '{}' INTO TABLE t FIELDS TERMINATED BY ','; \
         SELECT COUNT(*), SUM(id) FROM t;",
        file.display()
    );
    let out = std::process::Command::new("mariadb")
        .args(["-h127.0.0.1", &format!("-P{}", s.port()), "-uapp", "-papppw", "--local-infile=1", "-N", "-e", &sql])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("50000\t{}", (0..50_000u64).sum::<u64>()));
}

#[test]
fn mariadb_cli_through_tcp_and_unix_socket() {
    let db = shared_db();
    let sock = sluice_testkit::mariadb::work_root().join(format!("sluice-{}.sock", std::process::id()));
    let s = start_sluice(&[db], &["--listen", sock.to_str().unwrap()]);
    // The first listener is TCP (port 0 chosen by the kernel); the second is the socket.
    for target in [vec![format!("-P{}", s.port()), "-h127.0.0.1".to_string()], vec![format!("-S{}", sock.display())]] {
        let out = std::process::Command::new("mariadb")
            .args(&target)
            .args(["-uapp", "-papppw", "-N", "-e", "SELECT 40 + 2; SELECT VERSION()"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("42\n"), "{text}");
        assert!(text.contains("MariaDB"), "{text}");
    }
}

#[tokio::test]
async fn greeting_repeats_the_real_server_version() {
    let s = shared_sluice();
    let mut direct = connect(&shared_db().addr(), "app", "apppw").await;
    let mut via = app(s).await;
    assert_eq!(direct.server_version(), via.server_version());
    let a: Option<String> = direct.query_first("SELECT VERSION()").await.unwrap();
    let b: Option<String> = via.query_first("SELECT VERSION()").await.unwrap();
    assert_eq!(a, b);
}

#[tokio::test]
async fn kill_query_from_a_second_connection() {
    let s = shared_sluice();
    let victim = app(s).await;
    let mut killer = app(s).await;
    let victim_id = victim.id();
    let sleeper = run_in_background(victim, "SELECT SLEEP(60)");
    // Wait until the victim's query is running on its backend thread.
    let sessions = loop {
        let (_, body) = admin_get(s, "/sessions", None);
        let v = json(&body);
        let busy = v.as_array().unwrap().iter().any(|x| x["id"] == victim_id && x["busy"] == true);
        if busy {
            break v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(sessions.as_array().unwrap().iter().any(|x| x["id"] == victim_id));
    // Wait for the query to reach the server, then kill it by the id the client was given.
    wait_running(&mut killer, "SELECT SLEEP(60)").await;
    killer.query_drop(format!("KILL QUERY {victim_id}")).await.unwrap();
    let (r, mut victim) = sleeper.await.unwrap();
    let e = r.expect_err("the query was interrupted");
    assert!(e.to_string().contains("1317"), "ER_QUERY_INTERRUPTED expected: {e}");
    // The victim's session survives KILL QUERY.
    let one: Option<i32> = victim.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    // An id that is not a sluice session is unknown, as on a server.
    let e = killer.query_drop("KILL 4000000").await.unwrap_err();
    assert!(e.to_string().contains("1094"), "{e}");
    // KILL CONNECTION ends the victim's session.
    killer.query_drop(format!("KILL {victim_id}")).await.unwrap();
    assert!(victim.query_drop("SELECT 1").await.is_err());
}

#[tokio::test]
async fn session_state_is_visible_in_the_admin_api() {
    let s = shared_sluice();
    let mut c = app(s).await;
    c.query_drop("CREATE DATABASE IF NOT EXISTS relay_state").await.unwrap();
    c.query_drop("USE relay_state").await.unwrap();
    c.query_drop("SET time_zone = '+02:00'").await.unwrap();
    c.query_drop("BEGIN").await.unwrap();
    let _stmt = c.prep("SELECT ? + 1").await.unwrap();
    let id = c.id();
    // The state is published right after the response is written: poll for it.
    let me_now = || {
        let v = json(&admin_get(s, "/sessions", None).1);
        v.as_array().unwrap().iter().find(|x| x["id"] == id).expect("session listed").clone()
    };
    wait_for("the prepared statement is published", || me_now()["state"]["prepared"].as_object().is_some_and(|p| p.len() == 1));
    let me = me_now();
    assert_eq!(me["state"]["user"], "app");
    assert_eq!(me["state"]["schema"], "relay_state");
    assert_eq!(me["state"]["variables"]["time_zone"], "+02:00");
    assert_eq!(me["state"]["prepared"].as_object().unwrap().len(), 1);
    let pins: Vec<&str> = me["pins"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert!(pins.contains(&"transaction"), "{pins:?}");
    assert_eq!(me["safe_point"], false);
    c.query_drop("COMMIT").await.unwrap();
    wait_for("the session is at a safe point after COMMIT", || me_now()["safe_point"] == true);
}

/// A query over the compressed protocol (zlib or zstd) with a result larger than one frame.
fn compressed_round_trip(alg: sluice_proto::compress::Algorithm, cap: u32) {
    use sluice_proto::compress::{FRAME_HEADER, FrameHeader, compress, decompress};
    let s = shared_sluice();
    let mut r = Raw::login_caps(&s.listen, "app", "apppw", None, sluice_testkit::raw::CLIENT_CAPS | cap);
    let mut query = vec![com::QUERY];
    query.extend_from_slice(b"SELECT REPEAT('abc', 100000) UNION ALL SELECT 'x'");
    let mut packet = Vec::new();
    sluice_proto::packet::frame(&mut packet, &query, 0);
    let mut framed = Vec::new();
    compress(alg, &packet, 0, &mut framed);
    r.write_raw(&framed).unwrap();
    // Read compressed frames until the plain stream holds the whole response.
    let mut plain = Vec::new();
    let mut frames = 0;
    loop {
        let mut h = [0u8; FRAME_HEADER];
        std::io::Read::read_exact(&mut r.s, &mut h).unwrap();
        let fh = FrameHeader::parse(&h).unwrap();
        let mut body = vec![0u8; fh.compressed_len];
        std::io::Read::read_exact(&mut r.s, &mut body).unwrap();
        decompress(alg, &fh, &body, &mut plain).unwrap();
        frames += 1;
        // Done when the plain stream ends with the OK-as-EOF of the result.
        let mut t = sluice_proto::response::ResponseTracker::new(true, false);
        t.start(sluice_proto::response::Expect::Results, 0);
        let scan = t.scan(&plain, &mut sluice_proto::response::NoSink).unwrap();
        if scan.state == sluice_proto::response::State::Done {
            assert_eq!(scan.consumed, plain.len());
            break;
        }
    }
    assert!(frames >= 1);
    let text = String::from_utf8_lossy(&plain);
    assert!(text.contains(&"abc".repeat(1000)), "the row arrived");
}

#[test]
fn compressed_protocol_zlib_and_zstd() {
    use sluice_proto::compress::Algorithm;
    use sluice_proto::consts::cap;
    compressed_round_trip(Algorithm::Zlib, cap::COMPRESS);
    compressed_round_trip(Algorithm::Zstd { level: 3 }, cap::ZSTD_COMPRESSION);
}

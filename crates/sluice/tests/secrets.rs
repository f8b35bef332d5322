//! A corpus of secret-bearing statements, sent in every protocol form a client has (text,
//! multi-statement, COM_STMT_PREPARE and its executes, MariaDB's "last prepared" execute, long
//! data, bulk execute, SQL PREPARE/EXECUTE USING, EXECUTE IMMEDIATE, statements prepared before
//! the capture began): none of its secrets reaches the capture files, the digests, `/sessions`,
//! the SQL admin's tables or the log.

mod common;

use common::*;
use sluice::capture::files;
use sluice::capture::record::Record;
use sluice_proto::consts::{cap, com};
use sluice_testkit::raw::Raw;

/// Every secret of the corpus starts with this: one search finds them all.
const MARK: &str = "corpus-secret";

/// A record with its byte strings as text.
fn record_text(r: &Record) -> String {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match r {
        Record::Command { payload, .. } => text(payload),
        Record::Begin { begin, .. } => {
            let prepared: Vec<String> = begin.prepared.iter().map(|(_, sql, types)| text(sql) + &text(types)).collect();
            format!("{begin:?} {prepared:?}")
        }
        other => format!("{other:?}"),
    }
}

/// COM_STMT_EXECUTE of statement `id` with one string parameter.
fn execute(id: u32, value: &str) -> Vec<u8> {
    let mut p = vec![com::STMT_EXECUTE];
    p.extend_from_slice(&id.to_le_bytes());
    p.push(0); // no cursor
    p.extend_from_slice(&1u32.to_le_bytes());
    p.push(0); // null bitmap
    p.push(1); // types follow
    p.extend_from_slice(&[0xfe, 0x00]);
    p.push(value.len() as u8);
    p.extend_from_slice(value.as_bytes());
    p
}

#[test]
fn no_secret_of_the_corpus_reaches_captures_digests_sessions_or_logs() {
    let db = shared_db();
    let s = TestConfig::new()
        .admin("sql_listen = \"127.0.0.1:0\"\n[[admin.sql_users]]\nname = \"ops\"\npassword = \"opspw\"\n")
        .app_users()
        .dbs(&[db])
        .table("digests", "enabled = true\n")
        .start();
    let caps = cap::PROTOCOL_41 | cap::SECURE_CONNECTION | cap::PLUGIN_AUTH | cap::MULTI_STATEMENTS | cap::MULTI_RESULTS;
    let mut c = Raw::login_caps(&s.listen, "app", "apppw", Some("test"), caps);
    c.query("CREATE USER IF NOT EXISTS sec_u IDENTIFIED BY 'plain-before'");
    // Prepared before the capture: in the state record the capture begins the session with.
    c.prepare(&format!("CREATE USER IF NOT EXISTS sec_v IDENTIFIED BY '{MARK}-01'"));
    c.query(&format!("PREPARE before_sp FROM 'ALTER USER sec_u IDENTIFIED BY ''{MARK}-02'''"));

    let (code, text) = admin_post_json(&s, "/capture/start", &serde_json::json!({ "name": "secrets" }));
    assert_eq!(code, 201, "{text}");
    let dir = std::path::PathBuf::from(json(&text)["dir"].as_str().unwrap());

    for sql in [
        format!("ALTER USER sec_u IDENTIFIED BY '{MARK}-03'"),
        format!("SELECT 1; ALTER USER sec_u IDENTIFIED BY '{MARK}-04'"),
        "PREPARE sp FROM 'SELECT PASSWORD(?)'".into(),
        format!("EXECUTE sp USING '{MARK}-05'"),
        format!("EXECUTE IMMEDIATE 'ALTER USER sec_u IDENTIFIED BY ''{MARK}-06'''"),
        format!(
            "CREATE SERVER IF NOT EXISTS sec_srv FOREIGN DATA WRAPPER mysql OPTIONS (HOST '127.0.0.1', USER 'x', PASSWORD '{MARK}-07')"
        ),
        format!("SELECT PASSWORD('{MARK}-08')"),
        format!("SET PASSWORD FOR sec_u = PASSWORD('{MARK}-09')"),
        format!("GRANT SELECT ON test.* TO sec_u IDENTIFIED BY '{MARK}-10'"),
        "EXECUTE before_sp".into(),
    ] {
        c.query(&sql);
    }
    // The binary protocol: an execute, MariaDB's execute of the last prepared statement, long
    // data, a bulk execute.
    let (id, _, _) = c.prepare("SELECT PASSWORD(?)");
    c.command(&execute(id, &format!("{MARK}-11")));
    c.command(&execute(u32::MAX, &format!("{MARK}-12")));
    let mut long = vec![com::STMT_SEND_LONG_DATA];
    long.extend_from_slice(&id.to_le_bytes());
    long.extend_from_slice(&0u16.to_le_bytes());
    long.extend_from_slice(format!("{MARK}-13").as_bytes());
    c.command(&long);
    c.command(&execute(id, ""));
    let mut bulk = vec![com::STMT_BULK_EXECUTE];
    bulk.extend_from_slice(&id.to_le_bytes());
    bulk.extend_from_slice(&128u16.to_le_bytes()); // types follow
    bulk.extend_from_slice(&[0xfe, 0x00]);
    bulk.push(0); // no indicator
    bulk.push(16);
    bulk.extend_from_slice(format!("{MARK}-14").as_bytes());
    bulk.extend_from_slice(b"xx");
    c.command(&bulk);
    let (code, text) = admin_post_json(&s, "/capture/stop", &serde_json::json!({}));
    assert_eq!(code, 200, "{text}");

    // Every place an operator or a file could see them.
    let mut seen = Vec::new();
    for p in files::list(&dir).unwrap() {
        for r in files::read_file(&p, None).unwrap() {
            seen.push(format!("capture: {}", record_text(&r)));
        }
    }
    for path in ["/sessions", "/digests"] {
        seen.push(format!("{path}: {}", admin_get(&s, path, None).1));
    }
    let port: u16 = sql_admin_addr(&s).rsplit_once(':').unwrap().1.parse().unwrap();
    for table in ["sessions", "digests"] {
        seen.push(format!("sql admin {table}: {}", cli(port, "ops", "opspw", &[], &format!("SELECT * FROM {table}")).unwrap()));
    }
    seen.push(format!("log: {}", s.log_text()));
    let all = seen.join("\n");
    // (The capture did record the commands: their redacted forms are there.)
    assert!(all.contains("ALTER USER sec_u IDENTIFIED BY ?") && all.contains("EXECUTE sp USING ?"), "the corpus was not captured: {all}");
    let leaks: Vec<&str> = seen.iter().filter(|l| l.contains(MARK)).map(|l| &l[..l.len().min(300)]).collect();
    assert!(leaks.is_empty(), "secrets seen:\n{}", leaks.join("\n"));
    c.query("DROP USER IF EXISTS sec_u, sec_v");
    c.query("DROP SERVER IF EXISTS sec_srv");
}

/// What an operator or a file could show of a sluice's traffic: every record of the capture in
/// `dir` (decompressed) and its files as they are, `/sessions`, `/digests`, the SQL admin's
/// sessions and digests, and the log; a line each.
fn everything_shown(s: &SluiceProc, dir: &std::path::Path) -> Vec<String> {
    let mut seen = Vec::new();
    for p in files::list(dir).unwrap() {
        for r in files::read_file(&p, None).unwrap() {
            seen.push(format!("capture: {}", record_text(&r)));
        }
    }
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        seen.push(format!("file {}: {}", path.display(), String::from_utf8_lossy(&std::fs::read(&path).unwrap())));
    }
    for path in ["/sessions", "/digests"] {
        seen.push(format!("{path}: {}", admin_get(s, path, None).1));
    }
    let port: u16 = sql_admin_addr(s).rsplit_once(':').unwrap().1.parse().unwrap();
    for table in ["sessions", "digests"] {
        seen.push(format!("sql admin {table}: {}", cli(port, "ops", "opspw", &[], &format!("SELECT * FROM {table}")).unwrap()));
    }
    seen.push(format!("log: {}", s.log_text()));
    seen
}

/// The generated corpus (`sluice_proto::secret::corpus`: every word that may carry a secret
/// beside one, in every position the lexer knows, and the account, replication and key
/// statements), sent to a real server by sessions in the default sql_mode, with ANSI_QUOTES
/// and with NO_BACKSLASH_ESCAPES, each holding an SQL PREPARE and a COM_STMT_PREPARE of a
/// secret made before the capture began: no byte of a secret anywhere an operator or a file
/// could show it.
#[test]
fn the_generated_corpus_leaves_no_secret_in_any_mode() {
    // (Its own server: the corpus makes accounts, a server entry and a replication source.)
    let db = sluice_testkit::mariadb::MariaDb::start();
    let s = TestConfig::new()
        .admin("sql_listen = \"127.0.0.1:0\"\n[[admin.sql_users]]\nname = \"ops\"\npassword = \"opspw\"\n")
        .app_users()
        .dbs(&[&db])
        .table("digests", "enabled = true\n")
        .start();
    let mut sessions: Vec<Raw> = ["", ",ANSI_QUOTES", ",NO_BACKSLASH_ESCAPES"]
        .iter()
        .enumerate()
        .map(|(i, mode)| {
            let mut c = Raw::login(&s.listen, "app", "apppw", Some("test"));
            assert_eq!(c.query(&format!("SET SESSION sql_mode = CONCAT(@@sql_mode, '{mode}')"))[0][0], 0);
            c.query(&format!("PREPARE early_{i} FROM '(SELECT PASSWORD(''{MARK}-early-sql''))'"));
            c.prepare(&format!("(SELECT AES_ENCRYPT('x', '{MARK}-early-binary'))"));
            c
        })
        .collect();
    let (code, text) = admin_post_json(&s, "/capture/start", &serde_json::json!({ "name": "generated" }));
    assert_eq!(code, 201, "{text}");
    let dir = std::path::PathBuf::from(json(&text)["dir"].as_str().unwrap());
    let corpus = sluice_proto::secret::corpus(&format!("{MARK}-generated"));
    for c in &mut sessions {
        for sql in &corpus {
            c.query(sql);
        }
    }
    // (Seen while the sessions still hold what they prepared.)
    let mut seen = everything_shown(&s, &dir);
    let (code, text) = admin_post_json(&s, "/capture/stop", &serde_json::json!({}));
    assert_eq!(code, 200, "{text}");
    seen.extend(everything_shown(&s, &dir));
    let all = seen.join("\n");
    assert!(all.contains("EXECUTE IMMEDIATE ?") && all.contains("early_2"), "the corpus was not captured: {}", &all[..all.len().min(3000)]);
    let leaks: Vec<&str> = seen.iter().flat_map(|l| l.split(MARK).skip(1)).map(|l| &l[..l.len().min(200)]).collect();
    assert!(leaks.is_empty(), "{} secrets seen, after:\n{}", leaks.len(), leaks.join("\n"));
    for c in &mut sessions {
        c.query("DROP USER IF EXISTS sec_u");
    }
}

/// The monitor user's password comes from a file (or the environment), never the command line
/// that every local user reads in the process list.
#[test]
fn the_monitor_password_stays_off_the_command_line() {
    let db = shared_db();
    let file = sluice_testkit::mariadb::work_root().join(format!("monitor-pw-{}-{}", std::process::id(), sluice_testkit::unique_id()));
    std::fs::write(&file, "monitorpw\n").unwrap();
    let s = start_sluice(&[db], &["--monitor", "monitor", "--monitor-password-file", file.to_str().unwrap()]);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", s.pid())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("monitorpw"));
    // The checks log in with it: they read the backend's replication state.
    wait_for("the monitor reads the backend", || {
        let b = json(&admin_get(&s, "/backends", None).1);
        b[0]["replication"]["read_only"].is_boolean()
    });
    assert!(!s.log_text().contains("monitorpw"));
}

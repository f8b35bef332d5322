//! Traffic capture against a real server: started and stopped through the admin API, it records
//! the state of sessions opened before it, every command as the client sent it and a summary of
//! its response (errors, rows and their checksums), never a password; a writer that cannot keep
//! up loses records, counted, and never slows or fails a client.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice::capture::files;
use sluice::capture::record::{Record, Summary, flag};
use sluice_proto::consts::com;

fn scratch(name: &str) -> std::path::PathBuf {
    sluice_testkit::mariadb::work_root().join(format!("capture-{name}-{}-{}", std::process::id(), sluice_testkit::unique_id()))
}

/// Starts a capture; its status, and its folder.
fn start_capture(s: &SluiceProc, body: serde_json::Value) -> (serde_json::Value, std::path::PathBuf) {
    let (code, text) = admin_post_json(s, "/capture/start", &body);
    assert_eq!(code, 201, "{text}");
    let status = json(&text);
    let dir = std::path::PathBuf::from(status["dir"].as_str().expect("the capture's folder"));
    (status, dir)
}

fn stop_capture(s: &SluiceProc) -> serde_json::Value {
    let (code, text) = admin_post(s, "/capture/stop");
    assert_eq!(code, 200, "{text}");
    json(&text)
}

fn records(dir: &std::path::Path) -> Vec<Record> {
    files::list(dir).unwrap().iter().flat_map(|p| files::read_file(p, None).unwrap()).collect()
}

/// The results of session `id`'s commands, by number, with the command's payload.
fn commands_of(all: &[Record], id: u64) -> Vec<(Vec<u8>, u8, Option<Summary>)> {
    let mut out: Vec<(u64, Vec<u8>, u8, Option<Summary>)> = Vec::new();
    for r in all {
        match r {
            Record::Command { session, number, payload, flags, .. } if *session == id => out.push((*number, payload.clone(), *flags, None)),
            Record::Result { session, number, summary } if *session == id => {
                let c = out.iter_mut().find(|c| c.0 == *number).expect("a result follows its command");
                c.3 = Some(*summary);
            }
            _ => {}
        }
    }
    for (i, c) in out.iter().enumerate() {
        assert_eq!(c.0, i as u64 + 1, "session {id}: commands are numbered from 1 without a gap");
    }
    out.into_iter().map(|(_, p, f, s)| (p, f, s)).collect()
}

fn query(text: &str) -> Vec<u8> {
    let mut p = vec![com::QUERY];
    p.extend_from_slice(text.as_bytes());
    p
}

async fn session_id(c: &mut mysql_async::Conn, s: &SluiceProc) -> u64 {
    // The newest session of sluice's registry is this connection's (it is the only one connecting).
    let _ = c.query_drop("DO 1").await;
    let sessions = json(&admin_get(s, "/sessions", None).1);
    sessions.as_array().unwrap().iter().map(|x| x["id"].as_u64().unwrap()).max().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_records_sessions_commands_and_results_and_no_password() {
    let db = shared_db();
    let s = start_sluice(&[db], &[]);
    let mut setup = app(&s).await;
    fresh_db(&mut setup, "capture1").await;
    setup.query_drop("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))").await.unwrap();
    let values: Vec<String> = (1..=100).map(|i| format!("({i}, 'v{i}')")).collect();
    setup.query_drop(format!("INSERT INTO t VALUES {}", values.join(","))).await.unwrap();
    setup.disconnect().await.unwrap();

    // Open before the capture: one with state that works during it, one that stays idle.
    let mut before = app(&s).await;
    before.query_drop("USE capture1").await.unwrap();
    let before_id = session_id(&mut before, &s).await;
    before.query_drop("SET @mark = 'kept'").await.unwrap();
    let stmt = before.prep("SELECT ? + 1").await.unwrap();
    let idle = app(&s).await;

    let (started, dir) = start_capture(&s, serde_json::json!({ "name": "records" }));
    assert_eq!(started["state"], "running");
    assert_eq!(dir.canonicalize().unwrap(), s.dir.join("captures/records").canonicalize().unwrap());
    let (code, text) = admin_post_json(&s, "/capture/start", &serde_json::json!({ "name": "second" }));
    assert_eq!(code, 409, "one capture at a time: {text}");

    let n: i64 = before.exec_first(&stmt, (41,)).await.unwrap().unwrap();
    assert_eq!(n, 42);
    before.query_drop("SELECT id, v FROM t ORDER BY id").await.unwrap();
    before.query_drop("SELECT id, v FROM t ORDER BY id DESC").await.unwrap();

    let mut during = app(&s).await;
    let during_id = session_id(&mut during, &s).await;
    during.query_drop("SELECT * FROM capture1.nope").await.expect_err("no such table");
    during.query_drop("CREATE USER IF NOT EXISTS capture_user IDENTIFIED BY 'sekrit-pw-123'").await.unwrap();
    during.query_drop("DROP USER capture_user").await.unwrap();
    // A prepared statement that may carry a password: its executes are kept without parameters.
    let hashed: Option<String> = during.exec_first("SELECT PASSWORD(?)", ("sekrit-pw-456",)).await.unwrap();
    assert!(hashed.is_some());
    during.query_drop("SELECT SLEEP(0.05)").await.unwrap();
    during.disconnect().await.unwrap();
    wait_for("the session ended", || json(&admin_get(&s, "/sessions", None).1).as_array().unwrap().len() == 2);

    let done = stop_capture(&s);
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["dropped_records"], 0, "{done}");
    let all = records(&dir);
    assert_eq!(done["records"].as_u64().unwrap(), all.len() as u64, "{done}");
    assert!(dir.join("meta.json").exists());

    // The session opened before: its state first, then its commands with their results.
    let Some(Record::Begin { begin, .. }) = all.iter().find(|r| matches!(r, Record::Begin { session, .. } if *session == before_id)) else {
        panic!("no state for session {before_id}: {all:?}")
    };
    assert_eq!((begin.user.as_str(), begin.schema.as_deref()), ("app", Some("capture1")));
    assert!(begin.prepared.iter().any(|(_, sql, _)| sql == b"SELECT ? + 1"), "{begin:?}");
    let cmds = commands_of(&all, before_id);
    let kinds: Vec<u8> = cmds.iter().map(|c| c.0[0]).collect();
    assert_eq!(kinds[0], com::STMT_EXECUTE, "{kinds:?}");
    let one_row = cmds[0].2.expect("a result");
    assert_eq!((one_row.error, one_row.rows), (0, 1));
    let (up, down) = (cmds[1].2.unwrap(), cmds[2].2.unwrap());
    assert_eq!(cmds[1].0, query("SELECT id, v FROM t ORDER BY id"));
    assert_eq!((up.rows, down.rows), (100, 100));
    assert_eq!(up.unordered, down.unordered, "the same rows in another order have the same unordered sum");
    assert_ne!(up.ordered, down.ordered, "but not the same ordered sum");
    assert_ne!(up.unordered, one_row.unordered);

    // The session opened during the capture: its error, and the password nowhere.
    let cmds = commands_of(&all, during_id);
    let err = cmds.iter().find(|c| c.0 == query("SELECT * FROM capture1.nope")).and_then(|c| c.2).unwrap();
    assert_eq!(err.error, 1146);
    let create = cmds.iter().find(|c| c.1 & flag::REDACTED != 0).expect("the CREATE USER is redacted");
    assert_eq!(create.0, query("CREATE USER IF NOT EXISTS capture_user IDENTIFIED BY ?"));
    assert_eq!(create.2.unwrap().error, 0);
    let execute = cmds.iter().find(|c| c.0[0] == com::STMT_EXECUTE).expect("the execute");
    assert_eq!((execute.0.len(), execute.1 & flag::REDACTED), (5, flag::REDACTED), "an execute of a statement that may carry a password");
    assert_eq!(execute.2.unwrap().rows, 1);
    // Latency: from the command's forwarding to the end of its response (the server slept 50 ms).
    let sleep = cmds.iter().find(|c| c.0 == query("SELECT SLEEP(0.05)")).and_then(|c| c.2).unwrap();
    assert!(sleep.latency_us >= 50_000, "{sleep:?}");
    let times: Vec<u64> = all
        .iter()
        .filter_map(|r| match r {
            Record::Command { session, at_us, .. } if *session == during_id => Some(*at_us),
            _ => None,
        })
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "a session's commands in the order of their times: {times:?}");
    for r in &all {
        assert!(!format!("{r:?}").contains("sekrit"), "a password reached the capture: {r:?}");
    }
    assert!(all.iter().any(|r| matches!(r, Record::End { session, .. } if *session == during_id)));

    // The idle session was never seen.
    let seen: std::collections::BTreeSet<u64> = all.iter().map(Record::session).collect();
    assert_eq!(seen.len(), 2, "only the sessions that ran commands: {seen:?}");

    // The inspector reads it all.
    let out = std::process::Command::new(bin()).args(["capture", "inspect"]).arg(&dir).args(["--dump", "100"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("2 sessions") && text.contains("  query: ") && text.contains("error 1146"), "{text}");
    assert!(text.contains("(redacted)"), "{text}");
    drop((before, idle));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_cannot_keep_up_loses_records_counted_and_clients_see_nothing() {
    let db = shared_db();
    let s = start_sluice(&[db], &[]);
    let (_, dir) = start_capture(&s, serde_json::json!({ "name": "slow", "writer_delay": "100ms" }));
    let mut c = app(&s).await;
    let big = format!("SELECT LENGTH('{}')", "x".repeat(64 << 10));
    for _ in 0..400 {
        let n: i64 = c.query_first(&big).await.unwrap().unwrap();
        assert_eq!(n, 64 << 10);
    }
    let status = json(&admin_get(&s, "/capture", None).1);
    assert_eq!(status["state"], "running", "{status}");
    let done = stop_capture(&s);
    let dropped = done["dropped_records"].as_u64().unwrap();
    assert!(dropped > 0, "{done}");
    assert_eq!(metric(&s, "sluice_capture_dropped_records_total"), dropped);
    // What was kept is whole and readable; commands are numbered, so the gaps show.
    let kept = records(&dir);
    assert_eq!(kept.len() as u64, done["records"].as_u64().unwrap() - dropped, "{done}");
    c.disconnect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_ends_by_itself_after_its_duration_and_takes_only_its_users() {
    let db = shared_db();
    let s = start_sluice(&[db], &[]);
    let (_, dir) = start_capture(&s, serde_json::json!({ "name": "filtered", "duration": "3s", "users": ["other"] }));
    let mut a = app(&s).await;
    let mut o = connect(&s.listen, "other", "otherpw").await;
    a.query_drop("DO 1").await.unwrap();
    o.query_drop("DO 2").await.unwrap();
    wait_for("the capture ended", || json(&admin_get(&s, "/capture", None).1)["state"] == "done");
    o.query_drop("DO 3").await.unwrap();
    let all = records(&dir);
    let users: Vec<String> =
        all.iter().filter_map(|r| if let Record::Begin { begin, .. } = r { Some(begin.user.clone()) } else { None }).collect();
    assert_eq!(users, ["other"]);
    // (The driver's own set-up queries of the new connection are there too.)
    let dos: Vec<&[u8]> = all
        .iter()
        .filter_map(|r| if let Record::Command { payload, .. } = r { Some(&payload[..]) } else { None })
        .filter(|p| p.starts_with(&query("DO ")))
        .collect();
    assert_eq!(dos, [&query("DO 2")[..]], "only its user's, and nothing after its end");
    // A folder that exists is refused: sluice makes each capture's.
    let (code, text) = admin_post_json(&s, "/capture/start", &serde_json::json!({ "name": "filtered" }));
    assert_eq!(code, 409, "{text}");
    assert!(text.contains("exists already"), "{text}");
    a.disconnect().await.unwrap();
    o.disconnect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_capture_is_unreadable_without_its_key_and_whole_with_it() {
    let db = shared_db();
    let s = start_sluice(&[db], &[]);
    let keys = scratch("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (key, wrong) = (keys.join("key"), keys.join("wrong"));
    std::fs::write(&key, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n").unwrap();
    std::fs::write(&wrong, [7u8; 32]).unwrap();
    let (_, dir) = start_capture(&s, serde_json::json!({ "name": "sealed", "key_file": key }));
    let mut c = app(&s).await;
    c.query_drop("SELECT 'plain-marker-in-the-clear'").await.unwrap();
    c.disconnect().await.unwrap();
    let done = stop_capture(&s);
    assert_eq!(done["encrypted"], true, "{done}");

    let paths = files::list(&dir).unwrap();
    assert!(!paths.is_empty());
    for p in &paths {
        let raw = std::fs::read(p).unwrap();
        assert!(!raw.windows(12).any(|w| w == b"plain-marker"), "the text is in the clear in {}", p.display());
        let e = files::read_file(p, None).unwrap_err().to_string();
        assert!(e.contains("encrypted"), "{e}");
        let e = files::read_file(p, Some(&files::load_key(&wrong).unwrap())).unwrap_err().to_string();
        assert!(e.contains("does not open"), "{e}");
    }
    let k = files::load_key(&key).unwrap();
    let all: Vec<Record> = paths.iter().flat_map(|p| files::read_file(p, Some(&k)).unwrap()).collect();
    assert!(all.iter().any(|r| matches!(r, Record::Command { payload, .. } if *payload == query("SELECT 'plain-marker-in-the-clear'"))));

    let inspect =
        |extra: &[&std::ffi::OsStr]| std::process::Command::new(bin()).args(["capture", "inspect"]).arg(&dir).args(extra).output().unwrap();
    assert!(!inspect(&[]).status.success(), "no key, no records");
    let out = inspect(&["--key-file".as_ref(), key.as_os_str(), "--dump".as_ref(), "50".as_ref()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("encrypted") && text.contains("plain-marker-in-the-clear"), "{text}");

    // Replayed with its key: the same results.
    let report = dir.with_extension("report");
    let out = std::process::Command::new(bin())
        .args(["replay", "--input"])
        .arg(&dir)
        .args(["--target", &db.addr(), "--user", "app", "--password", "apppw", "--key-file"])
        .arg(&key)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let r = json(&std::fs::read_to_string(report.join("report.json")).unwrap());
    assert_eq!((r["differing"].as_u64(), r["same"].as_u64().is_some_and(|n| n >= 1)), (Some(0), true), "{r:#}");
}

/// A consistent start holds sessions' statements at its gate: how long it may is bounded
/// (`8760h` used to be taken, and a session's `SELECT 1` waited until the capture stopped).
#[test]
fn a_gate_timeout_past_the_bound_is_refused() {
    let s = TestConfig::new().backend(&shared_db().addr()).start();
    let body = serde_json::json!({ "name": "gate", "consistent": true, "gate_timeout": "8760h" });
    let (code, text) = admin_post_json(&s, "/capture/start", &body);
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("gate_timeout"), "{text}");
    let (_, status) = admin_get(&s, "/capture", None);
    assert!(!status.contains("\"running\""), "nothing started: {status}");
}

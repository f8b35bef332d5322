//! The session's `sql_mode` decides where a string ends (`NO_BACKSLASH_ESCAPES`, `ANSI_QUOTES`):
//! sluice's lexer follows it, so that the statements it sees are those the server runs. The
//! lexer is checked against the server's own verdict on random texts in every mode; then the
//! tricks that used to get past sluice under NO_BACKSLASH_ESCAPES (a raw KILL of a backend
//! thread, a password in the capture and the digests) are tried in users mode, where sluice
//! follows the mode, and in passthrough, where it does not know it and refuses what reads two
//! ways.

mod common;

use common::*;
use mysql_async::prelude::*;
use sluice_proto::lexer::{Lexer, Mode};

/// A small deterministic generator (xorshift): the same texts at every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Pieces random texts are made of: quotes, backslashes, `;`, comments and whole statements.
const PIECES: &[&str] = &[
    "SELECT 'a'",
    "SELECT 'a\\'",
    "SELECT \"b\\\"\"",
    "'",
    "\\",
    "\"",
    ";",
    " ",
    "SELECT 1",
    "-- ",
    "\n",
    "x",
    ",'\\';",
    "SELECT '\\\\'",
    "#",
];

fn random_text(rng: &mut Rng) -> String {
    let n = 2 + rng.next() % 6;
    let mut s = String::from("SELECT 0");
    for _ in 0..n {
        s.push_str(PIECES[(rng.next() % PIECES.len() as u64) as usize]);
    }
    s
}

/// The statements the server ran of `text` (one result each), or None when it refused one:
/// read packet by packet (an OK, or a result set: column count, definitions, EOF, rows, EOF).
fn server_statements(c: &mut Raw, text: &str) -> Option<usize> {
    let packets = c.query(text);
    let (mut n, mut i) = (0, 0);
    while i < packets.len() {
        let p = &packets[i];
        match <[u8]>::first(p)? {
            0xff => return None,
            0x00 => i += 1,
            _ => {
                let columns = sluice_proto::packet::Reader::new(p).lenenc("column count").ok()? as usize;
                i += 1 + columns + 1;
                while packets.get(i).is_some_and(|r: &Vec<u8>| !(<[u8]>::first(r) == Some(&0xfe) && r.len() < 9)) {
                    i += 1;
                }
                i += 1;
            }
        }
        n += 1;
    }
    Some(n)
}

/// The statements the server runs of `text` as sluice's lexer sees it in `mode`: the parts
/// between top-level `;` that are not blank (a part that is only a comment is a statement to
/// the server, an empty one).
fn segments(text: &str, mode: Mode) -> usize {
    let sql = text.as_bytes();
    let mut ends: Vec<usize> = Lexer::with_mode(sql, mode).filter(|t| t.is_punct(sql, b';')).map(|t| t.at.start).collect();
    ends.push(sql.len());
    let mut from = 0;
    let mut n = 0;
    for end in ends {
        n += usize::from(sql[from..end].iter().any(|b| !b.is_ascii_whitespace()));
        from = (end + 1).min(sql.len());
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lexer_splits_statements_as_the_server_does_in_every_mode() {
    use sluice_proto::consts::cap;
    use sluice_testkit::raw::Raw;
    let db = shared_db();
    let caps = cap::PROTOCOL_41 | cap::SECURE_CONNECTION | cap::PLUGIN_AUTH | cap::MULTI_STATEMENTS | cap::MULTI_RESULTS;
    let mut c = Raw::login_caps(&db.addr(), "app", "apppw", None, caps);
    let mut rng = Rng(0x5eed_1e55_0123_4567);
    for sql_mode in ["", "NO_BACKSLASH_ESCAPES", "ANSI_QUOTES", "NO_BACKSLASH_ESCAPES,ANSI_QUOTES", "ANSI"] {
        c.query(&format!("SET sql_mode = '{sql_mode}'"));
        let mode = Mode::from_sql_mode(sql_mode.as_bytes());
        let (mut compared, mut differing) = (0, Vec::new());
        for _ in 0..600 {
            let text = random_text(&mut rng);
            let Some(ran) = server_statements(&mut c, &text) else { continue };
            compared += 1;
            let seen = segments(&text, mode);
            if seen != ran {
                differing.push(format!("{text:?}: sluice {seen}, server {ran}"));
            }
        }
        assert!(compared >= 100, "{sql_mode:?}: only {compared} texts the server took whole");
        assert!(differing.is_empty(), "sql_mode {sql_mode:?}: {} of {compared} differ:\n{}", differing.len(), differing.join("\n"));
    }
}

/// The backend thread id of the session whose sluice id is `id`.
fn backend_thread(s: &SluiceProc, id: u64) -> u64 {
    let sessions = json(&admin_get(s, "/sessions", None).1);
    sessions.as_array().unwrap().iter().find(|x| x["id"] == id).unwrap()["backend_thread_id"].as_u64().unwrap()
}

/// The id of the newest session (the one just opened: no other connects meanwhile).
async fn newest_session(s: &SluiceProc, c: &mut mysql_async::Conn) -> u64 {
    c.query_drop("DO 1").await.unwrap();
    let sessions = json(&admin_get(s, "/sessions", None).1);
    sessions.as_array().unwrap().iter().map(|x| x["id"].as_u64().unwrap()).max().unwrap()
}

/// Under NO_BACKSLASH_ESCAPES, `SELECT 'a\'; KILL n -- '` is two statements to the server: a
/// KILL that sluice must see, map (n is a sluice id) and never let through raw (n would be
/// taken for a backend thread's id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_hidden_by_the_sql_mode_is_seen_or_refused() {
    let db = shared_db();
    for users in [true, false] {
        let s = if users { TestConfig::new().app_users().dbs(&[db]).start() } else { start_sluice(&[db], &[]) };
        let mut victim = app(&s).await;
        let victim_id = newest_session(&s, &mut victim).await;
        let thread = backend_thread(&s, victim_id);
        let mut attacker = app(&s).await;
        attacker.query_drop("SET sql_mode = 'NO_BACKSLASH_ESCAPES'").await.unwrap();
        let trick = format!("SELECT 'a\\'; KILL {thread} -- '");
        let e = attacker.query_drop(&trick).await.expect_err("the KILL is not let through raw");
        let text = e.to_string();
        if users {
            // Seen as a KILL of sluice's session `thread`, which is not there (or is not the victim).
            assert!(text.contains("1094") || text.contains("Unknown thread"), "users mode: {text}");
        } else {
            assert!(text.contains("1235") && text.contains("NO_BACKSLASH_ESCAPES"), "passthrough: {text}");
        }
        assert_eq!(victim.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1), "the victim's backend connection lives");
        drop(attacker);
        victim.disconnect().await.unwrap();
    }
}

/// Under NO_BACKSLASH_ESCAPES, `SELECT 'a\', PASSWORD('x')` calls PASSWORD: its argument must
/// reach neither the capture nor the digests, whether sluice follows the mode (users mode) or
/// does not know it (passthrough).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_hidden_by_the_sql_mode_is_redacted() {
    let db = shared_db();
    for users in [true, false] {
        let base = TestConfig::new().dbs(&[db]).table("digests", "enabled = true\n");
        let s = if users { base.app_users().start() } else { base.start() };
        let (code, text) = admin_post_json(&s, "/capture/start", &serde_json::json!({ "name": "modes" }));
        assert_eq!(code, 201, "{text}");
        let dir = std::path::PathBuf::from(json(&text)["dir"].as_str().unwrap());
        let mut c = app(&s).await;
        c.query_drop("SET sql_mode = 'NO_BACKSLASH_ESCAPES'").await.unwrap();
        let _: Vec<(String, String)> = c.query("SELECT 'a\\', PASSWORD('hidden-by-mode-1')").await.unwrap();
        c.disconnect().await.unwrap();
        let (code, _) = admin_post_json(&s, "/capture/stop", &serde_json::json!({}));
        assert_eq!(code, 200);
        let mut seen = String::new();
        for p in sluice::capture::files::list(&dir).unwrap() {
            for r in sluice::capture::files::read_file(&p, None).unwrap() {
                if let sluice::capture::record::Record::Command { payload, .. } = r {
                    seen.push_str(&String::from_utf8_lossy(&payload));
                    seen.push('\n');
                }
            }
        }
        seen.push_str(&admin_get(&s, "/digests", None).1);
        // (Redacted in every reading: with backslash escapes all after `'a\` is a literal.)
        assert!(seen.lines().any(|l| l.ends_with("SELECT ?")), "the statement was captured: {seen}");
        assert!(!seen.contains("hidden-by-mode"), "users mode {users}: {seen}");
    }
}

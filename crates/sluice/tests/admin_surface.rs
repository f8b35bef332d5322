//! The admin API as a hostile web page or a careless operator would meet it: requests a browser
//! can be made to send from another site are refused (a foreign `Host`, another `Origin`, a
//! mutation that is not JSON); `/health` is open, the rest needs the token when one is set; the
//! dashboard's page runs only its own code under a strict policy; names are validated
//! everywhere they come from.

mod common;

use common::*;

/// One raw HTTP/1.1 exchange: status and body.
fn http(s: &SluiceProc, head: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut t = std::net::TcpStream::connect(s.admin.as_ref().unwrap()).unwrap();
    write!(t, "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    t.read_to_string(&mut out).unwrap();
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out)
}

fn draining(s: &SluiceProc, name: &str) -> bool {
    let list = json(&admin_get(s, "/backends", None).1);
    list.as_array().unwrap().iter().find(|b| b["name"] == name).unwrap()["draining"].as_bool().unwrap()
}

#[test]
fn requests_another_site_can_make_a_browser_send_are_refused() {
    let db = shared_db();
    let s = TestConfig::new().admin("hosts = [\"sluice.internal\"]\n").backend_with(&db.addr(), "name = \"a\"\n").start();
    let addr = s.admin.clone().unwrap();
    // A form's cross-site POST (no preflight): text/plain, with the page's Origin.
    let (code, out) = http(&s, &format!("POST /backends/a/drain HTTP/1.1\r\nHost: {addr}\r\nContent-Type: text/plain\r\n"), "x");
    assert_eq!(code, 415, "{out}");
    let (code, out) = http(
        &s,
        &format!("POST /backends/a/drain HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://evil.example\r\nContent-Type: application/json\r\n"),
        "{}",
    );
    assert_eq!(code, 403, "{out}");
    let (code, out) = http(
        &s,
        &format!("POST /backends/a/drain HTTP/1.1\r\nHost: {addr}\r\nSec-Fetch-Site: cross-site\r\nContent-Type: application/json\r\n"),
        "{}",
    );
    assert_eq!(code, 403, "{out}");
    assert!(!draining(&s, "a"), "nothing was drained");
    // DNS rebinding: a name of another site that resolves to sluice's address.
    let (code, out) = http(&s, "GET /config HTTP/1.1\r\nHost: rebound.evil.example:6034\r\n", "");
    assert_eq!(code, 421, "{out}");
    assert!(!out.contains("backends"), "{out}");
    for host in [addr.clone(), "localhost:6034".into(), "sluice.internal:6034".into(), "[::1]:6034".into()] {
        let (code, out) = http(&s, &format!("GET /config HTTP/1.1\r\nHost: {host}\r\n"), "");
        assert_eq!(code, 200, "{host}: {out}");
    }
    // The API's own page (same origin, JSON) drains.
    let (code, out) = http(
        &s,
        &format!("POST /backends/a/drain HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nContent-Type: application/json\r\n"),
        "{}",
    );
    assert_eq!(code, 202, "{out}");
    assert!(draining(&s, "a"));
}

#[test]
fn health_is_open_and_the_dashboard_runs_only_its_own_code() {
    let db = shared_db();
    let s = TestConfig::new().admin("token = \"t0ken-value\"\n").dbs(&[db]).start();
    let addr = s.admin.clone().unwrap();
    assert_eq!(admin_get(&s, "/health", None).0, 200);
    assert_eq!(admin_get(&s, "/sessions", None).0, 401);
    let (code, page) = http(&s, &format!("GET / HTTP/1.1\r\nHost: {addr}\r\n"), "");
    assert_eq!(code, 200);
    let head = page.to_ascii_lowercase();
    assert!(head.contains("content-security-policy: default-src 'self'") && head.contains("frame-ancestors 'none'"), "{page}");
    assert!(head.contains("x-content-type-options: nosniff"), "{page}");
    assert!(!head.contains("<script>") && !head.contains("<style>") && !head.contains("onclick"), "no inline code: {page}");
    for asset in ["/dashboard.js", "/dashboard.css"] {
        let (code, out) = http(&s, &format!("GET {asset} HTTP/1.1\r\nHost: {addr}\r\n"), "");
        assert_eq!(code, 200, "{out}");
        assert!(!out.contains("innerHTML") && !out.contains("t0ken-value"), "{out}");
    }
}

#[test]
fn names_are_validated_wherever_they_come_from() {
    let db = shared_db();
    let s = TestConfig::new().dbs(&[db]).start();
    let long = "n".repeat(65);
    for name in ["", " ", "a b", "a'b", "a\u{202e}b", "tab\there", long.as_str(), "<img>"] {
        let (code, out) = admin_post_json(&s, "/backends", &serde_json::json!({ "address": db.addr(), "name": name }));
        assert_eq!(code, 400, "{name:?}: {out}");
    }
    let huge = "x".repeat(1 << 20);
    let (code, _) = admin_post_json(&s, "/backends", &serde_json::json!({ "address": db.addr(), "name": huge }));
    assert!(code == 400 || code == 413, "a 1 MB name: {code}");
    let (code, out) = admin_post_json(&s, "/backends", &serde_json::json!({ "address": db.addr(), "name": "ok.name-1:x_y" }));
    assert_eq!(code, 201, "{out}");
    assert!(metric_sum(&s, "sluice_backend_up{") <= 2);
    // The same rule in the file: `check-config` refuses it, naming the key and the backend's line.
    let path = config_path("bad-name");
    std::fs::write(&path, format!("[[backends]]\naddress = \"{}\"\nname = \"a b\"\n", db.addr())).unwrap();
    let out = std::process::Command::new(bin()).args(["check-config"]).arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("backends.name") && err.contains(".toml:2:"), "{err}");
}

/// A backend that is sluice itself: refused at start and from the API when it is one of its
/// listeners, and at run time when a login comes from sluice's own backend connection (here, a
/// second name of its Unix socket that no path comparison can see through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_is_sluice_itself_is_refused() {
    let db = shared_db();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let path = config_path("loop");
    std::fs::write(&path, format!("[[listeners]]\naddress = \"127.0.0.1:{port}\"\n[[backends]]\naddress = \"127.0.0.1:{port}\"\n"))
        .unwrap();
    let out = std::process::Command::new(bin()).arg("--config").arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("sluice's own listener"), "{err}");

    let sock = sluice_testkit::mariadb::work_root().join(format!("loop-{}-{}.sock", std::process::id(), sluice_testkit::unique_id()));
    let s = TestConfig::new()
        .listener(&format!("[[listeners]]\naddress = \"{}\"\n", sock.display()))
        .backend_with(&db.addr(), "name = \"real\"\n")
        .start();
    for own in [s.listen.clone(), s.admin.clone().unwrap(), format!("unix:{}", sock.display())] {
        let (code, out) = admin_post_json(&s, "/backends", &serde_json::json!({ "address": own, "name": "me" }));
        assert_eq!(code, 400, "{own}: {out}");
        assert!(out.contains("own listener"), "{out}");
    }
    let alias = sock.with_extension("alias");
    std::fs::hard_link(&sock, &alias).unwrap();
    let (code, out) =
        admin_post_json(&s, "/backends", &serde_json::json!({ "address": format!("unix:{}", alias.display()), "name": "alias" }));
    assert_eq!(code, 201, "{out}");
    let (code, out) = admin_post(&s, "/backends/real/drain");
    assert_eq!(code, 202, "{out}");
    let e = mysql_async::Conn::new(opts(&s.listen, "app", "apppw")).await.expect_err("a login through the loop");
    assert!(e.to_string().contains("a loop"), "{e}");
    assert!(s.log_shows("refusing a login from sluice's own backend connection"));
    let sessions = json(&admin_get(&s, "/sessions", None).1);
    assert!(sessions.as_array().unwrap().len() <= 2, "no sessions pile up: {sessions}");
}

//! Hot reload: the file is read again on `POST /config/reload` and on SIGHUP; backends, users,
//! limits and TLS certificates change while sessions go on; a bad file, or one that changes
//! what cannot change while sluice runs, is refused and the configuration in force stays.

mod common;

use common::*;
use mysql_async::prelude::*;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn reload(s: &SluiceProc) -> (u16, serde_json::Value) {
    let (code, text) = admin_post(s, "/config/reload");
    (code, json(&text))
}

fn backend_names(s: &SluiceProc) -> Vec<(String, u64)> {
    let list = json(&admin_get(s, "/backends", None).1);
    list.as_array().unwrap().iter().map(|b| (b["name"].as_str().unwrap().to_string(), b["weight"].as_u64().unwrap())).collect()
}

fn session_backend(s: &SluiceProc, user: &str) -> Vec<String> {
    let list = json(&admin_get(s, "/sessions", None).1);
    list.as_array()
        .unwrap()
        .iter()
        .filter(|x| x["state"]["user"] == user)
        .map(|x| x["backend"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn named(name: &str, addr: &str, weight: u32) -> String {
    format!("[[backends]]\nname = \"{name}\"\naddress = \"{addr}\"\nweight = {weight}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_reweights_and_removes_backends_while_sessions_go_on() {
    let db = shared_db();
    let path = config_path("backends");
    let base = TestConfig::new().app_users().proxy("drain_timeout = \"30s\"\n").text();
    std::fs::write(&path, base.clone() + &named("a", &db.addr(), 1)).unwrap();
    let s = start_sluice_file(&path);
    let mut c = connect(&s.listen, "other", "otherpw").await;
    assert_eq!(c.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));
    assert_eq!(session_backend(&s, "other"), ["a"]);

    std::fs::write(&path, base.clone() + &named("a", &db.addr(), 1) + &named("b", &db.addr(), 3)).unwrap();
    let (code, out) = reload(&s);
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["backends_added"], serde_json::json!(["b"]), "{out}");
    assert_eq!(backend_names(&s), [("a".to_string(), 1), ("b".to_string(), 3)]);

    std::fs::write(&path, base.clone() + &named("b", &db.addr(), 2)).unwrap();
    let (code, out) = reload(&s);
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["backends_removed"], serde_json::json!(["a"]), "{out}");
    assert_eq!(out["weights_changed"], serde_json::json!(["b"]), "{out}");
    // The session on the backend taken out moves, and goes on.
    wait_for("backend a removed", || backend_names(&s) == [("b".to_string(), 2)]);
    assert_eq!(c.query_first::<u32, _>("SELECT 2").await.unwrap(), Some(2));
    assert_eq!(session_backend(&s, "other"), ["b"]);
    assert_eq!(metric(&s, "sluice_config_reloads_total"), 2);
    c.disconnect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_change_on_reload_and_sessions_logged_in_keep_going() {
    let db = shared_db();
    let late = format!("late{}", sluice_testkit::unique_id());
    db.sql(&format!("CREATE USER IF NOT EXISTS '{late}'@'%' IDENTIFIED BY 'latepw'; GRANT ALL ON test.* TO '{late}'@'%'"));
    let path = config_path("users");
    let cfg = TestConfig::new().dbs(&[db]);
    std::fs::write(&path, cfg.clone().app_users().text()).unwrap();
    let s = start_sluice_file(&path);
    let (_, shown) = admin_get(&s, "/config", None);
    assert!(shown.contains("\"password\":\"********\"") && !shown.contains("apppw") && !shown.contains("otherpw"), "{shown}");
    let mut app = connect(&s.listen, "app", "apppw").await;
    let mut other = connect(&s.listen, "other", "otherpw").await;

    // app limited to one connection (it has one), other removed, a new user.
    let next = cfg.clone().user("app", "password = \"apppw\"\nmax_connections = 1\n").user(&late, "password = \"latepw\"\n");
    std::fs::write(&path, next.text()).unwrap();
    let (code, out) = reload(&s);
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["users_added"], serde_json::json!([late]), "{out}");
    assert_eq!(out["users_changed"], serde_json::json!(["app"]), "{out}");
    assert_eq!(out["users_removed"], serde_json::json!(["other"]), "{out}");
    assert_eq!(other.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1), "a removed user's session goes on");
    assert_eq!(app.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));
    let refused = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "other", "otherpw"))).await;
    let e = refused.expect_err("a removed user cannot log in").to_string();
    assert!(e.contains("1045"), "{e}");
    let over = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "app", "apppw"))).await;
    assert!(over.is_err(), "app's new limit counts the session it has");
    let mut l = connect(&s.listen, &late, "latepw").await;
    assert_eq!(l.query_first::<u32, _>("SELECT 3").await.unwrap(), Some(3));
    for c in [app, other, l] {
        c.disconnect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_or_a_fixed_setting_is_refused_and_sighup_reloads() {
    let db = shared_db();
    let path = config_path("refused");
    let cfg = TestConfig::new().dbs(&[db]).app_users();
    std::fs::write(&path, cfg.text()).unwrap();
    let s = start_sluice_file(&path);
    let mut c = app(&s).await;

    // A value of the wrong type: the error names the file, the line and the key.
    let bad = cfg.clone().proxy("max_connections = \"many\"\n").text();
    let line = bad.lines().position(|l| l.contains("\"many\"")).unwrap() + 1;
    std::fs::write(&path, &bad).unwrap();
    let (code, out) = reload(&s);
    assert_eq!(code, 400, "{out}");
    let error = out["error"].as_str().unwrap();
    assert!(error.contains(&format!("{}:{line}:", path.display())) && error.contains("max_connections"), "{error}");

    // What cannot change while sluice runs is named.
    std::fs::write(&path, cfg.clone().proxy("workers = 7\n").text()).unwrap();
    let (code, out) = reload(&s);
    assert_eq!(code, 400, "{out}");
    assert!(out["error"].as_str().unwrap().contains("proxy.workers"), "{out}");
    let shown = json(&admin_get(&s, "/config", None).1);
    assert_eq!(shown["reloads"], 0, "nothing was applied: {shown}");
    assert_eq!(c.query_first::<u32, _>("SELECT 1").await.unwrap(), Some(1));

    // SIGHUP reads the file again.
    std::fs::write(&path, cfg.clone().proxy("max_connections = 321\n").text()).unwrap();
    s.signal("HUP");
    wait_for("SIGHUP reload", || json(&admin_get(&s, "/config", None).1)["config"]["proxy"]["max_connections"] == 321);
    assert_eq!(metric(&s, "sluice_config_reloads_total"), 1);
    assert_eq!(c.query_first::<u32, _>("SELECT 2").await.unwrap(), Some(2));
    c.disconnect().await.unwrap();
}

/// The `mariadb` client over TLS that trusts only `ca` (and checks the name): Ok when sluice
/// presents that certificate.
fn verified(s: &SluiceProc, ca: &std::path::Path) -> Result<String, String> {
    let ca = format!("--ssl-ca={}", ca.display());
    cli(s.port(), "app", "apppw", &["--ssl", &ca, "--ssl-verify-server-cert"], "SELECT 1")
}

fn fingerprint(s: &SluiceProc) -> String {
    json(&admin_get(s, "/config", None).1)["tls_certificate_sha256"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_files_are_read_again_when_they_change_and_on_reload() {
    let db = shared_db();
    let (first, first_key) = self_signed_cert();
    let (second, second_key) = self_signed_cert();
    let (third, third_key) = self_signed_cert();
    let (cert, key) = (config_path("cert"), config_path("key"));
    std::fs::copy(&first, &cert).unwrap();
    std::fs::copy(&first_key, &key).unwrap();
    let path = config_path("tls");
    let cfg = |c: &std::path::Path, k: &std::path::Path| {
        TestConfig::new().dbs(&[db]).app_users().table("tls", &format!("cert = \"{}\"\nkey = \"{}\"\n", c.display(), k.display())).text()
    };
    std::fs::write(&path, cfg(&cert, &key)).unwrap();
    let s = start_sluice_file(&path);
    let before = fingerprint(&s);
    verified(&s, &first).expect("the first certificate");
    assert!(verified(&s, &second).is_err());

    // The files change on disk: new handshakes get the new certificate.
    std::fs::copy(&second_key, &key).unwrap();
    std::fs::copy(&second, &cert).unwrap();
    wait_for("the changed files read", || fingerprint(&s) != before);
    verified(&s, &second).expect("the second certificate");
    assert!(verified(&s, &first).is_err());

    // A reload that names other files.
    std::fs::write(&path, cfg(&third, &third_key)).unwrap();
    let (code, out) = reload(&s);
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["tls_certificate_changed"], true, "{out}");
    verified(&s, &third).expect("the third certificate");
}

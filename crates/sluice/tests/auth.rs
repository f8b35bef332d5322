//! Authentication in both modes, for each plugin, with right and wrong passwords; TLS; limits
//! on users; the admin token.

mod common;

use common::*;
use mysql_async::prelude::*;

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn passthrough_relays_every_plugin_and_the_backend_errors_unchanged() {
    let db = shared_db();
    let s = shared_sluice();
    let direct = port_of(&db.addr());
    let via = s.port();
    for (user, pass) in [("app", "apppw"), ("ed", "edpw"), ("nopw", "")] {
        let a = cli(direct, user, pass, &[], "SELECT CURRENT_USER()").expect("direct login");
        let b = cli(via, user, pass, &[], "SELECT CURRENT_USER()").unwrap_or_else(|e| panic!("{user} via sluice: {e}"));
        assert_eq!(a, b);
    }
    for (user, pass) in [("app", "nope"), ("ed", "nope"), ("nopw", "something"), ("nosuchuser", "x"), ("app", "")] {
        let a = cli(direct, user, pass, &[], "SELECT 1").expect_err("direct refuses");
        let b = cli(via, user, pass, &[], "SELECT 1").expect_err("sluice refuses");
        assert!(b.contains("1045"), "{b}");
        // The backend's message reaches the client unchanged (host part included).
        assert_eq!(a, b, "{user}");
    }
    // A client that starts with caching_sha2_password is switched by the backend.
    let r = cli(via, "app", "apppw", &["--default-auth=caching_sha2_password"], "SELECT 1").unwrap();
    assert_eq!(r, "1");
}

fn users_config(db: &MariaDb, extra: &str) -> String {
    let hash = db.sql("SELECT PASSWORD('otherpw')");
    TestConfig::new()
        .dbs(&[db])
        .user("app", "password = \"apppw\"\n")
        .user("other", &format!("password_hash = \"{}\"\nmax_connections = 2\n", hash.trim()))
        .user("nopw", extra)
        .text()
}

#[tokio::test]
async fn users_mode_checks_passwords_itself() {
    let db = shared_db();
    let s = start_sluice_config(&users_config(db, ""));
    let p = s.port();
    assert_eq!(cli(p, "app", "apppw", &[], "SELECT CURRENT_USER()").unwrap(), "app@%");
    assert_eq!(cli(p, "other", "otherpw", &[], "SELECT CURRENT_USER()").unwrap(), "other@%");
    assert_eq!(cli(p, "nopw", "", &[], "SELECT CURRENT_USER()").unwrap(), "nopw@%");
    assert_eq!(cli(p, "app", "apppw", &["--default-auth=caching_sha2_password"], "SELECT 1").unwrap(), "1");
    assert_eq!(cli(p, "other", "otherpw", &["--default-auth=caching_sha2_password"], "SELECT 1").unwrap(), "1");
    assert_eq!(cli(p, "app", "apppw", &["--default-auth=client_ed25519"], "SELECT 1").unwrap(), "1");
    for (user, pass, extra) in [
        ("app", "wrong", &[][..]),
        ("app", "", &[][..]),
        ("other", "wrong", &[][..]),
        ("other", "", &[][..]),
        ("nopw", "x", &[][..]),
        ("ghost", "x", &[][..]),
        ("ghost", "", &[][..]),
        ("app", "wrong", &["--default-auth=caching_sha2_password"][..]),
        ("other", "wrong", &["--default-auth=caching_sha2_password"][..]),
        // A user known to the backend but not to sluice gets nowhere.
        ("ed", "edpw", &[][..]),
    ] {
        let e = cli(p, user, pass, extra, "SELECT 1").expect_err("refused");
        assert!(e.contains("1045") && e.contains("Access denied"), "{user}/{pass}: {e}");
    }
    // mysql_async (native password) too, and per-user connection limits.
    let mut a = connect(&s.listen, "other", "otherpw").await;
    let b = connect(&s.listen, "other", "otherpw").await;
    let third = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "other", "otherpw"))).await;
    let e = third.expect_err("third connection refused");
    assert!(e.to_string().contains("1203"), "{e}");
    let one: Option<i32> = a.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    b.disconnect().await.unwrap();
    // The slot is free again once a session ends.
    wait_for("user slot released", || admin_get(&s, "/sessions", None).1.matches("\"user\":\"other\"").count() == 1);
    let mut c = connect(&s.listen, "other", "otherpw").await;
    c.ping().await.unwrap();
    let (_, metrics) = admin_get(&s, "/metrics", None);
    assert!(metrics.contains("sluice_rejected_connections_total{reason=\"max_user_connections\"} 1"), "{metrics}");
    assert!(!s.log_text().contains("otherpw") && !s.log_text().contains("apppw"), "secrets in the log");
}

#[tokio::test]
async fn tls_from_clients_and_require_tls() {
    let db = shared_db();
    let (cert, key) = self_signed_cert();
    let cfg = users_config(db, "require_tls = true\n") + &format!("[tls]\ncert = \"{}\"\nkey = \"{}\"\n", cert.display(), key.display());
    let s = start_sluice_config(&cfg);
    let ssl = mysql_async::SslOpts::default().with_danger_accept_invalid_certs(true);
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "app", "apppw").ssl_opts(ssl.clone()))).await.unwrap();
    let big: Option<u64> = c.query_first("SELECT LENGTH(REPEAT('x', 5000000))").await.unwrap();
    assert_eq!(big, Some(5_000_000));
    let id = c.id();
    let (_, body) = admin_get(&s, "/sessions", None);
    let v = json(&body);
    let me = v.as_array().unwrap().iter().find(|x| x["id"] == id).unwrap().clone();
    assert_eq!(me["tls"], true);
    // The CLI over TLS, with compression on top.
    assert_eq!(cli(s.port(), "app", "apppw", &["--ssl", "--compress"], "SELECT 40+2").unwrap(), "42");
    // nopw must use TLS.
    let e = cli(s.port(), "nopw", "", &["--skip-ssl"], "SELECT 1").expect_err("TLS required");
    assert!(e.contains("3159"), "{e}");
    assert_eq!(cli(s.port(), "nopw", "", &["--ssl"], "SELECT 1").unwrap(), "1");
    c.disconnect().await.unwrap();
}

#[test]
fn admin_api_needs_its_token() {
    let db = shared_db();
    let s = TestConfig::new().admin("token = \"s3cret-token\"\n").dbs(&[db]).start();
    // (/health is open to whoever reaches the port, as docs/SECURITY.md says.)
    assert_eq!(admin_get(&s, "/health", None).0, 200, "/health without token");
    for path in ["/metrics", "/sessions", "/backends", "/config", "/capture"] {
        assert_eq!(admin_get(&s, path, None).0, 401, "{path} without token");
        assert_eq!(admin_get(&s, path, Some("wrong")).0, 401, "{path} with a wrong token");
        assert_eq!(admin_get(&s, path, Some("s3cret-token")).0, 200, "{path} with the token");
    }
    assert!(!s.log_text().contains("s3cret-token"));
}

#[tokio::test]
async fn users_mode_change_user() {
    let db = shared_db();
    let s = start_sluice_config(&users_config(db, ""));
    let mut c = app(&s).await;
    c.change_user(mysql_async::ChangeUserOpts::default().with_user(Some("other".into())).with_pass(Some("otherpw".into()))).await.unwrap();
    let u: Option<String> = c.query_first("SELECT CURRENT_USER()").await.unwrap();
    assert_eq!(u.as_deref(), Some("other@%"));
    let (_, body) = admin_get(&s, "/sessions", None);
    assert!(body.contains("\"user\":\"other\""), "{body}");
    let bad = c.change_user(mysql_async::ChangeUserOpts::default().with_user(Some("app".into())).with_pass(Some("wrong".into()))).await;
    let e = bad.expect_err("wrong password refused");
    assert!(e.to_string().contains("1045"), "{e}");
    let ghost = c.change_user(mysql_async::ChangeUserOpts::default().with_user(Some("ghost".into())).with_pass(Some("x".into()))).await;
    assert!(ghost.is_err());
}

#[test]
fn caching_sha2_fast_path_and_full_authentication() {
    let db = shared_db();
    let (cert, key) = self_signed_cert();
    let cfg = users_config(db, "")
        + &format!("[tls]\ncert = \"{}\"\nkey = \"{}\"\n[proxy]\nauth_plugin = \"caching_sha2_password\"\n", cert.display(), key.display());
    let s = start_sluice_config(&cfg);
    let p = s.port();
    // app has a clear password: the fast path. other is stored as a native hash: full
    // authentication, with the clear password over TLS or RSA-encrypted without it.
    for tls in ["--ssl", "--skip-ssl"] {
        for (user, pass) in [("app", "apppw"), ("other", "otherpw")] {
            let r = cli(p, user, pass, &[tls, "--default-auth=caching_sha2_password"], "SELECT CURRENT_USER()");
            assert_eq!(r.unwrap_or_else(|e| panic!("{user} {tls}: {e}")), format!("{user}@%"));
            let e = cli(p, user, "wrong", &[tls, "--default-auth=caching_sha2_password"], "SELECT 1").expect_err("refused");
            assert!(e.contains("1045"), "{user} {tls}: {e}");
        }
    }
    // Clients that prefer mysql_native_password are switched.
    assert_eq!(cli(p, "other", "otherpw", &["--default-auth=mysql_native_password"], "SELECT 1").unwrap(), "1");
}

#[test]
fn tls_hello_in_the_same_segment_as_the_ssl_request() {
    use sluice_proto::consts::cap;
    use std::io::{Read, Write};
    let db = shared_db();
    let (cert, key) = self_signed_cert();
    let s = TestConfig::new()
        .without_admin()
        .dbs(&[db])
        .table("tls", &format!("cert = \"{}\"\nkey = \"{}\"\n", cert.display(), key.display()))
        .start();
    let mut r = Raw::connect(&s.listen);
    r.read_packet().unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(sluice::net::tls::NoVerify))
        .with_no_client_auth();
    let mut tls = rustls::ClientConnection::new(std::sync::Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    // The SSL request and the TLS ClientHello leave in one write, as some drivers send them.
    let caps = sluice_testkit::raw::CLIENT_CAPS | cap::SSL;
    let mut req = Vec::new();
    sluice_proto::handshake::write_ssl_request(&mut req, caps, 0, 1 << 24, 45);
    let mut bytes = Vec::new();
    sluice_proto::packet::frame(&mut bytes, &req, 1);
    tls.write_tls(&mut bytes).unwrap();
    r.s.write_all(&bytes).unwrap();
    let mut stream = rustls::StreamOwned::new(tls, r.s.try_clone().unwrap());
    // Finish the handshake and log in over TLS as a passthrough client would.
    let hr = sluice_proto::handshake::HandshakeResponse {
        capabilities: caps,
        max_packet: 1 << 24,
        collation: 45,
        user: b"nopw".to_vec(),
        auth_plugin: Some(b"mysql_native_password".to_vec()),
        ..Default::default()
    };
    let mut out = Vec::new();
    hr.write(&mut out);
    let mut framed = Vec::new();
    sluice_proto::packet::frame(&mut framed, &out, 2);
    stream.write_all(&framed).unwrap();
    // The backend asks for its own scramble (auth switch); nopw answers with nothing.
    let mut h = [0u8; 4];
    stream.read_exact(&mut h).unwrap();
    let mut p = vec![0u8; u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize];
    stream.read_exact(&mut p).unwrap();
    assert_eq!(p[0], 0xfe, "auth switch: {}", String::from_utf8_lossy(&p));
    let mut empty = Vec::new();
    sluice_proto::packet::frame(&mut empty, &[], h[3] + 1);
    stream.write_all(&empty).unwrap();
    stream.read_exact(&mut h).unwrap();
    let mut p = vec![0u8; u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize];
    stream.read_exact(&mut p).unwrap();
    assert_eq!(p[0], 0x00, "logged in over TLS: {}", String::from_utf8_lossy(&p));
}

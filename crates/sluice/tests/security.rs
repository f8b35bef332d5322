//! The security defaults of docs/SECURITY.md: no login without the right password through any
//! plugin path (auth-switch tricks, replayed or malformed replies, clear text over plain TCP),
//! and listeners on loopback unless configured otherwise.

mod common;

use clap::Parser;
use common::*;
use sluice_proto::auth;
use sluice_proto::handshake::{Greeting, HandshakeResponse};
use sluice_testkit::raw::{CLIENT_CAPS, Raw};

fn users_sluice() -> SluiceProc {
    let db = shared_db();
    let hash = db.sql("SELECT PASSWORD('otherpw')");
    TestConfig::new()
        .without_admin()
        .dbs(&[db])
        .user("app", "password = \"apppw\"\n")
        .user("other", &format!("password_hash = \"{}\"\n", hash.trim()))
        .start()
}

/// Computes a client's answer from the scramble it was given.
type Reply = dyn Fn(&[u8]) -> Vec<u8>;
/// A login attempt: what it is, the plugin named, the first reply, the answers that follow.
type Case = (&'static str, &'static [u8], Box<Reply>, Vec<Box<Reply>>);

/// One login attempt: a handshake response naming `plugin` with `first`, then `more` as the
/// answers to whatever the server asks next (auth switch, more data). True when logged in.
fn logs_in(listen: &str, user: &str, plugin: &[u8], first: impl Fn(&[u8]) -> Vec<u8>, more: &[&Reply]) -> bool {
    let mut r = Raw::connect(listen);
    let (_, g) = r.read_packet().expect("greeting");
    let g = Greeting::parse(&g).expect("parse greeting");
    let hr = HandshakeResponse {
        capabilities: CLIENT_CAPS & g.capabilities,
        max_packet: 1 << 24,
        collation: 45,
        user: user.as_bytes().to_vec(),
        auth_response: first(&g.scramble),
        auth_plugin: Some(plugin.to_vec()),
        ..Default::default()
    };
    let mut out = Vec::new();
    hr.write(&mut out);
    r.write_packet(1, &out).unwrap();
    let mut scramble = g.scramble.clone();
    let mut answers = more.iter();
    loop {
        let Ok((seq, p)) = r.read_packet() else { return false };
        match p.first() {
            Some(0x00) => return true,
            Some(0xff) => {
                assert_eq!(err_code(&p), Some(1045), "refusals are access denied: {}", String::from_utf8_lossy(&p));
                return false;
            }
            Some(0xfe) => {
                let sw = sluice_proto::handshake::AuthSwitch::parse(&p).expect("auth switch");
                scramble = sw.data.to_vec();
            }
            // caching_sha2: fast auth OK (the OK follows) or "perform full authentication".
            Some(0x01) if p.get(1) == Some(&3) => continue,
            Some(0x01) => {}
            _ => return false,
        }
        let reply = answers.next().map(|f| f(&scramble)).unwrap_or_default();
        if r.write_packet(seq.wrapping_add(1), &reply).is_err() {
            return false;
        }
    }
}

fn native(pw: &'static str) -> impl Fn(&[u8]) -> Vec<u8> {
    move |s: &[u8]| auth::native_reply_from_stage1(s, &auth::native_stage1(pw.as_bytes())).to_vec()
}

fn bytes(b: &'static [u8]) -> impl Fn(&[u8]) -> Vec<u8> {
    move |_: &[u8]| b.to_vec()
}

#[test]
fn no_login_without_the_password_through_any_plugin_path() {
    let s = users_sluice();
    let l = &s.listen;
    // The controls: the right password gets in, directly and after an auth switch.
    for (user, pw) in [("app", "apppw"), ("other", "otherpw")] {
        assert!(logs_in(l, user, auth::NATIVE, native(pw), &[]), "{user}: the right password logs in");
        assert!(logs_in(l, user, b"no_such_plugin", bytes(b"x"), &[&native(pw)]), "{user}: after an auth switch");
    }
    // A user with a clear password (app), one with only a hash (other), and an unknown one.
    for (user, pw) in [("app", "apppw"), ("other", "otherpw"), ("ghost", "apppw")] {
        let stolen = native(pw)(&[7u8; 20]);
        let stolen: &'static [u8] = Box::leak(stolen.into_boxed_slice());
        let clear: &'static [u8] = Box::leak(format!("{pw}\0").into_bytes().into_boxed_slice());
        let cases: Vec<Case> = vec![
            ("empty reply", auth::NATIVE, Box::new(bytes(b"")), vec![]),
            ("wrong password", auth::NATIVE, Box::new(native("nope")), vec![]),
            ("twenty zero bytes", auth::NATIVE, Box::new(bytes(&[0; 20])), vec![]),
            ("a reply for another scramble (replay)", auth::NATIVE, Box::new(bytes(stolen)), vec![]),
            ("19 bytes of the right reply", auth::NATIVE, Box::new(move |s: &[u8]| native(pw)(s)[..19].to_vec()), vec![]),
            ("21 bytes", auth::NATIVE, Box::new(move |s: &[u8]| [native(pw)(s), vec![0]].concat()), vec![]),
            (
                "empty reply, then empty again after the switch",
                b"no_such_plugin",
                Box::new(bytes(b"")),
                vec![Box::new(bytes(b"")), Box::new(bytes(b""))],
            ),
            ("the clear password over plain TCP", b"mysql_clear_password", Box::new(bytes(clear)), vec![Box::new(bytes(clear))]),
            ("sluice's own passthrough plugin name", b"sluice_passthrough", Box::new(bytes(b"")), vec![Box::new(bytes(b""))]),
            ("ed25519 noise", b"client_ed25519", Box::new(bytes(&[9; 64])), vec![Box::new(bytes(&[9; 64]))]),
            (
                "caching_sha2: a wrong scramble, then the clear password over plain TCP",
                auth::CACHING_SHA2,
                Box::new(bytes(&[1; 32])),
                vec![Box::new(bytes(clear)), Box::new(bytes(clear))],
            ),
            (
                "caching_sha2 with a wrong password, then a public key request and noise",
                auth::CACHING_SHA2,
                Box::new(|s: &[u8]| auth::sha2_reply(s, b"nope").to_vec()),
                vec![Box::new(bytes(&[2])), Box::new(bytes(&[5; 256]))],
            ),
        ];
        for (what, plugin, first, more) in &cases {
            let more: Vec<&Reply> = more.iter().map(|f| f.as_ref()).collect();
            assert!(!logs_in(l, user, plugin, first.as_ref(), &more), "{user}: {what} must not log in");
        }
    }
    // After all that, sluice still serves.
    assert!(logs_in(l, "app", auth::NATIVE, native("apppw"), &[]));
}

#[test]
fn listeners_default_to_loopback() {
    let db = shared_db();
    // The quick-start flags without --listen.
    let cli = sluice::cli::Cli::try_parse_from(["sluice", "--backend", "127.0.0.1:3306"]).unwrap();
    let cfg = cli.config().unwrap();
    assert_eq!(cfg.listeners.len(), 1);
    assert_eq!(cfg.listeners[0].address.get_ref(), "127.0.0.1:6033");
    assert!(cfg.admin.listen.is_none(), "the admin API is off unless asked for");
    // A configuration file without listeners gets the same default.
    let path = sluice_testkit::mariadb::work_root().join(format!("nolisten-{}.toml", std::process::id()));
    std::fs::write(&path, format!("[[backends]]\naddress = \"{}\"\n", db.addr())).unwrap();
    let cli = sluice::cli::Cli::try_parse_from(["sluice", "--config", path.to_str().unwrap()]).unwrap();
    assert_eq!(cli.config().unwrap().listeners[0].address.get_ref(), "127.0.0.1:6033");
}

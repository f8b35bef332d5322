//! Backends that accept a connection and then go silent in a login exchange after the
//! client's login (COM_CHANGE_USER, the set-up after COM_RESET_CONNECTION), and the per-user
//! connection count across a login that handshake_timeout cuts short; clients that stop in the
//! middle of a request.

mod common;

use std::io::ErrorKind;

use common::*;
use mysql_async::prelude::*;
use sluice_proto::auth;
use sluice_proto::consts::{cap, com};
use sluice_proto::handshake::ChangeUser;
use sluice_testkit::fault::{Action, Dir, Fault, FaultProxy, Trigger};
use sluice_testkit::raw::CLIENT_CAPS;

/// The plugin name sluice puts in every COM_CHANGE_USER it sends a backend.
const SWITCH_PLUGIN: &[u8] = b"sluice_passthrough";

fn config(backend: &str, users: bool, proxy: &str) -> String {
    let c = TestConfig::new().backend(backend).proxy(&format!("pool_idle_max = 0\n{proxy}\n"));
    let c = if users { c.user("app", "password = \"apppw\"\nmax_connections = 1\n").user("other", "password = \"otherpw\"\n") } else { c };
    c.text()
}

/// Stalls what the backend sends once sluice has sent `pattern` to it.
fn stall_after(shim: &FaultProxy, pattern: &[u8]) {
    shim.arm(Fault::new(Trigger::Pattern(Dir::ToServer, pattern.to_vec()), Dir::ToClient, 0, Action::Stall));
}

/// The client's next read ends (an ERR, or the connection closed) rather than waiting on: the
/// raw client's own 30 s read timeout is what a hang would show as.
fn answered(r: &mut Raw, what: &str) {
    match r.read_packet() {
        Ok((_, p)) => assert_eq!(p.as_slice().first(), Some(&0xff), "{what}: {}", String::from_utf8_lossy(&p)),
        Err(e) => assert!(!matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{what}: sluice hung ({e})"),
    }
}

fn change_user(r: &mut Raw, user: &str, password: &str) {
    let scramble = r.greeting.as_ref().expect("greeting").scramble.clone();
    let cu = ChangeUser {
        user: user.as_bytes().to_vec(),
        auth_response: auth::native_reply_from_stage1(&scramble, &auth::native_stage1(password.as_bytes())).to_vec(),
        database: Vec::new(),
        collation: Some(45),
        auth_plugin: Some(auth::NATIVE.to_vec()),
        attributes: None,
    };
    let mut p = Vec::new();
    cu.write(&mut p);
    r.write_packet(0, &p).expect("send COM_CHANGE_USER");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_cut_short_by_handshake_timeout_gives_its_user_slot_back() {
    let shim = FaultProxy::start(&shared_db().addr());
    let s = start_sluice_config(&config(&shim.addr(), true, "handshake_timeout = \"1s\"\nconnect_timeout = \"30s\""));
    // The backend goes silent after sluice's handshake response for user app.
    stall_after(&shim, b"app\0");
    let e = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "app", "apppw"))).await.expect_err("login cut short");
    assert!(shim.fired() == 1, "the stall was hit: {e}");
    // app may hold one connection: the slot of the login that timed out was given back.
    let mut c = app(&s).await;
    let one: Option<i32> = c.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    let e = mysql_async::Conn::new(mysql_async::Opts::from(opts(&s.listen, "app", "apppw"))).await.expect_err("the limit still holds");
    assert!(e.to_string().contains("1203"), "{e}");
}

/// A COM_CHANGE_USER whose backend side goes silent ends the session within `proxy`'s bound.
fn silent_during_change_user(users: bool, proxy: &str, user: &str, password: &str) {
    let shim = FaultProxy::start(&shared_db().addr());
    let s = start_sluice_config(&config(&shim.addr(), users, proxy));
    let mut r = Raw::login(&s.listen, user, password, None);
    stall_after(&shim, SWITCH_PLUGIN);
    change_user(&mut r, user, password);
    answered(&mut r, if users { "users-mode COM_CHANGE_USER" } else { "passthrough COM_CHANGE_USER" });
    assert_eq!(shim.fired(), 1);
}

#[test]
fn a_silent_backend_during_com_change_user_ends_the_session_passthrough() {
    silent_during_change_user(false, "handshake_timeout = \"1s\"", "app", "apppw");
}

#[test]
fn a_silent_backend_during_com_change_user_ends_the_session_users_mode() {
    silent_during_change_user(true, "connect_timeout = \"1s\"", "other", "otherpw");
}

#[test]
fn a_silent_backend_after_com_reset_connection_does_not_hang_the_session() {
    let shim = FaultProxy::start(&shared_db().addr());
    let s = start_sluice_config(&config(&shim.addr(), true, "connect_timeout = \"1s\"\nresponse_timeout = \"2s\""));
    let mut r = Raw::login(&s.listen, "other", "otherpw", None);
    // After the reset sluice asks the backend to track variables again; it never answers.
    stall_after(&shim, b"session_track_system_variables");
    let reset = r.command(&[com::RESET_CONNECTION]);
    assert_eq!(reset[0].as_slice().first(), Some(&0), "the reset itself succeeded");
    r.write_packet(0, b"\x03SELECT 1").expect("send query");
    answered(&mut r, "query after the stalled set-up");
    assert_eq!(shim.fired(), 1);
}

/// A client that stops in the middle of a request is disconnected once `client_read_timeout`
/// passed (1159 in the log), whether it stops in the part sluice reads before it plans the
/// command or in the rest, which it forwards as it comes; and the backend connection it held
/// goes to no one else with half a request in it: with multiplexing over one connection, the
/// next client is served.
fn stalled_mid_request(users: bool, proxy: &str) {
    let c = TestConfig::new().proxy(&format!("workers = 1\nclient_read_timeout = \"1s\"\n{proxy}")).dbs(&[shared_db()]);
    let s = if users { c.app_users() } else { c }.start();
    // (length of the COM_QUERY, bytes of it sent): in the first megabyte, and past it.
    for (i, (len, sent)) in [(100usize, 20usize), (2 << 20, 3 << 19)].into_iter().enumerate() {
        let mut r = Raw::login(&s.listen, "app", "apppw", None);
        let mut partial = vec![len as u8, (len >> 8) as u8, (len >> 16) as u8, 0, com::QUERY];
        partial.extend_from_slice(b"SELECT 1 /* ");
        partial.resize(4 + sent, b'x');
        r.write_raw(&partial).expect("send part of a request");
        // Closed as the server closes it at net_read_timeout (the raw client's own read
        // timeout, 30 s, is what a hang shows as).
        assert!(r.is_closed(), "request {len}: the connection is closed");
        wait_for("the cut logged", || s.log_text().matches("code=1159").count() == i + 1);
        let mut other = Raw::login(&s.listen, "app", "apppw", None);
        assert_eq!(other.row("SELECT 41 + 1"), vec![Some("42".to_string())], "after request {len}");
    }
    // A compressed client that sends half a frame.
    let mut r = Raw::login_caps(&s.listen, "app", "apppw", None, CLIENT_CAPS | cap::COMPRESS);
    let mut frame = Vec::new();
    sluice_proto::compress::compress(sluice_proto::compress::Algorithm::Zlib, b"\x09\0\0\0\x03SELECT 1", 0, &mut frame);
    r.write_raw(&frame[..frame.len() / 2]).expect("send half a frame");
    assert!(r.is_closed(), "half a frame: the connection is closed");
    wait_for("the cut logged", || s.log_text().matches("code=1159").count() == 3);
}

#[test]
fn a_client_that_stalls_in_the_middle_of_a_request_is_cut_off_passthrough() {
    stalled_mid_request(false, "");
}

#[test]
fn a_client_that_stalls_in_the_middle_of_a_request_is_cut_off_multiplexed() {
    stalled_mid_request(true, "multiplex = true\nmax_backend_connections = 1\n");
}

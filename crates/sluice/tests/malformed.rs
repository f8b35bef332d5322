//! Malformed client traffic sent as raw bytes: each gets a clean error or close, and sluice
//! keeps serving everyone else.

mod common;

use common::*;
use sluice_proto::consts::com;

/// After each abuse, a normal client still works and sluice is still running.
fn still_serving(s: &SluiceProc) {
    assert_eq!(cli(s.port(), "app", "apppw", &[], "SELECT 1").unwrap(), "1");
}

#[test]
fn garbage_before_the_handshake() {
    let s = shared_sluice();
    for garbage in [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &[0u8; 64][..], &[0xff; 7][..], &[0x05, 0, 0, 1, 1, 2][..]] {
        let mut r = Raw::connect(&s.listen);
        r.write_raw(garbage).unwrap();
        // Whatever the greeting and answer, the connection ends.
        assert!(r.is_closed(), "garbage {garbage:?} ends the connection");
        still_serving(s);
    }
}

#[test]
fn truncated_and_lying_handshake_responses() {
    let s = shared_sluice();
    // A header announcing 200 bytes, then 10 bytes and a close.
    let mut r = Raw::connect(&s.listen);
    r.read_packet().unwrap();
    r.write_raw(&[200, 0, 0, 1]).unwrap();
    r.write_raw(&[0x0d; 10]).unwrap();
    r.s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(r.is_closed());
    // A response whose auth length runs past the end of the packet.
    let mut r = Raw::connect(&s.listen);
    r.read_packet().unwrap();
    let mut p = Vec::new();
    p.extend_from_slice(&(sluice_testkit::raw::CLIENT_CAPS & !sluice_proto::consts::cap::PLUGIN_AUTH_LENENC_DATA).to_le_bytes());
    p.extend_from_slice(&(1u32 << 24).to_le_bytes());
    p.push(45);
    p.extend_from_slice(&[0; 23]);
    p.extend_from_slice(b"app\0");
    p.push(200); // auth response length
    p.extend_from_slice(&[1, 2, 3]);
    r.write_packet(1, &p).unwrap();
    assert!(r.is_closed());
    // A packet announcing 16 MiB during login.
    let mut r = Raw::connect(&s.listen);
    r.read_packet().unwrap();
    r.write_raw(&[0xff, 0xff, 0xff, 1, 0, 0]).unwrap();
    assert!(r.is_closed());
    still_serving(s);
}

#[test]
fn wrong_sequence_id_and_empty_commands() {
    let s = shared_sluice();
    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    let mut p = vec![com::QUERY];
    p.extend_from_slice(b"SELECT 1");
    r.write_packet(5, &p).unwrap();
    let (_, e) = r.read_packet().unwrap();
    assert_eq!(err_code(&e), Some(1156), "out-of-order packet refused");
    assert!(r.is_closed());

    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    r.write_raw(&[0, 0, 0, 0]).unwrap();
    let (_, e) = r.read_packet().unwrap();
    assert!(err_code(&e).is_some());
    assert!(r.is_closed());
    still_serving(s);
}

#[test]
fn truncated_command_then_close() {
    let s = shared_sluice();
    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    // Announce 1000 bytes of query, send 20, and leave.
    r.write_raw(&[0xe8, 0x03, 0, 0, com::QUERY]).unwrap();
    r.write_raw(b"SELECT 1 /* trunc").unwrap();
    r.s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(r.is_closed());
    // The backend connection of that session is gone too: no session is left behind.
    wait_for("session removed", || {
        let (_, body) = admin_get(s, "/sessions", None);
        !json(&body).as_array().unwrap().iter().any(|x| x["busy"] == true)
    });
    still_serving(s);
}

#[test]
fn unknown_statement_ids_and_commands_get_server_errors() {
    let s = shared_sluice();
    let mut r = Raw::login(&s.listen, "app", "apppw", None);
    let mut ex = vec![com::STMT_EXECUTE];
    ex.extend_from_slice(&999u32.to_le_bytes());
    ex.extend_from_slice(&[0, 1, 0, 0, 0]);
    let e = r.command(&ex);
    assert_eq!(err_code(&e[0]), Some(1243), "unknown statement handler");
    let e = r.command(&[0x60, 1, 2, 3]);
    assert_eq!(err_code(&e[0]), Some(1047), "unknown command");
    assert!(r.query("SELECT 1").iter().all(|p| err_code(p).is_none()));
    still_serving(s);
}

#[test]
fn compressed_frame_that_lies_about_its_size() {
    let s = shared_sluice();
    let mut r = Raw::login_caps(&s.listen, "app", "apppw", None, sluice_testkit::raw::CLIENT_CAPS | sluice_proto::consts::cap::COMPRESS);
    // A zlib frame claiming 10 bytes uncompressed that inflates to 10 MiB.
    let payload = vec![b'a'; 10 << 20];
    let mut framed = Vec::new();
    sluice_proto::compress::compress(sluice_proto::compress::Algorithm::Zlib, &payload, 0, &mut framed);
    framed[4..7].copy_from_slice(&[10, 0, 0]);
    r.write_raw(&framed[..framed.len().min(1 << 20)]).unwrap();
    assert!(r.is_closed());
    still_serving(s);
}

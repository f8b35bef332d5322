//! A minimal, fast MySQL responder for the benchmarks' proxy-bound mode: it accepts any login,
//! answers every COM_QUERY with the same one-row result and everything else with OK, so that
//! the proxy in front of it is the bottleneck. One thread per connection, blocking I/O.
//!
//! With `--mode endless` a query's result set never ends; with `--mode garbage` a query gets
//! 64 KiB of noise. Both are backends that misbehave, for the abuse tests.
//!
//! Usage: sluice-responder [--listen 127.0.0.1:PORT] [--mode normal|endless|garbage]
//! (prints the bound address)

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use sluice_proto::basic::{eof_payload, ok_payload};
use sluice_proto::consts::{cap, com, status};
use sluice_proto::handshake::{Greeting, HandshakeResponse};
use sluice_proto::packet::{Header, frame, put_lenenc, put_lenenc_bytes};

fn read_packet(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<u8> {
    let mut h = [0u8; 4];
    s.read_exact(&mut h)?;
    let h = Header::parse(&h).ok_or_else(|| std::io::Error::other("header"))?;
    buf.resize(h.len, 0);
    s.read_exact(buf)?;
    Ok(h.seq)
}

/// The start of the fixed result set (column count, column definition, EOF unless deprecated)
/// and the sequence id of the first row.
fn result_head(deprecate_eof: bool) -> (Vec<u8>, u8) {
    let mut out = Vec::new();
    let mut seq = 1;
    seq = frame(&mut out, &[1], seq);
    let mut col = Vec::new();
    for s in [&b"def"[..], b"", b"", b"", b"c", b""] {
        put_lenenc_bytes(&mut col, s);
    }
    col.extend_from_slice(&[0x0c, 0x21, 0, 120, 0, 0, 0, 0xfd, 0, 0, 0, 0, 0]);
    seq = frame(&mut out, &col, seq);
    if !deprecate_eof {
        let mut eof = Vec::new();
        eof_payload(&mut eof, 0, status::AUTOCOMMIT);
        seq = frame(&mut out, &eof, seq);
    }
    (out, seq)
}

/// Appends one row of 64 bytes; returns the next sequence id.
fn row(out: &mut Vec<u8>, seq: u8) -> u8 {
    let mut row = Vec::with_capacity(65);
    put_lenenc(&mut row, 64);
    row.extend_from_slice(&[b'x'; 64]);
    frame(out, &row, seq)
}

/// The bytes of the fixed one-row result set.
fn result_set(deprecate_eof: bool) -> Vec<u8> {
    let (mut out, seq) = result_head(deprecate_eof);
    let seq = row(&mut out, seq);
    let mut end = Vec::new();
    if deprecate_eof {
        ok_payload(&mut end, 0xfe, 0, 0, status::AUTOCOMMIT, 0);
    } else {
        eof_payload(&mut end, 0, status::AUTOCOMMIT);
    }
    frame(&mut out, &end, seq);
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Normal,
    Endless,
    Garbage,
}

/// A result set whose rows never end (until the reader goes away).
fn endless(s: &mut TcpStream, deprecate_eof: bool) -> std::io::Result<()> {
    let (mut chunk, mut seq) = result_head(deprecate_eof);
    loop {
        while chunk.len() < 64 * 1024 {
            seq = row(&mut chunk, seq);
        }
        s.write_all(&chunk)?;
        chunk.clear();
    }
}

/// 64 KiB of xorshift noise.
fn garbage(s: &mut TcpStream, seed: u32) -> std::io::Result<()> {
    let mut x = seed | 1;
    let noise: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    s.write_all(&noise)
}

fn serve(mut s: TcpStream, id: u32, mode: Mode) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let caps = cap::SLUICE_SUPPORTED & !cap::SESSION_TRACK;
    let g = Greeting {
        server_version: b"5.5.5-10.11.0-sluice-responder".to_vec(),
        connection_id: id,
        scramble: b"abcdefghijklmnopqrst".to_vec(),
        capabilities: caps,
        mariadb_capabilities: 0,
        collation: 45,
        status: status::AUTOCOMMIT,
        auth_plugin: b"mysql_native_password".to_vec(),
    };
    let mut out = Vec::new();
    let mut p = Vec::new();
    g.write(&mut p);
    frame(&mut out, &p, 0);
    s.write_all(&out)?;
    let mut buf = Vec::with_capacity(16 * 1024);
    let seq = read_packet(&mut s, &mut buf)?;
    let hr = HandshakeResponse::parse(&buf).map_err(std::io::Error::other)?;
    let mut ok = Vec::new();
    ok_payload(&mut ok, 0, 0, 0, status::AUTOCOMMIT, 0);
    let mut reply = Vec::new();
    let mut seq = seq.wrapping_add(1);
    if hr.auth_plugin.as_deref().is_some_and(|p| p != b"mysql_native_password") {
        // Any other plugin: switch to native, accept whatever comes back.
        let mut sw = Vec::new();
        sluice_proto::handshake::write_auth_switch(&mut sw, b"mysql_native_password", &g.scramble);
        frame(&mut reply, &sw, seq);
        s.write_all(&reply)?;
        seq = read_packet(&mut s, &mut buf)?.wrapping_add(1);
        reply.clear();
    }
    frame(&mut reply, &ok, seq);
    s.write_all(&reply)?;
    let rows = result_set(hr.capabilities & caps & cap::DEPRECATE_EOF != 0);
    let mut ok_packet = Vec::new();
    frame(&mut ok_packet, &ok, 1);
    loop {
        read_packet(&mut s, &mut buf)?;
        match buf.first() {
            Some(&com::QUIT) | None => return Ok(()),
            Some(&com::QUERY) if mode == Mode::Endless => return endless(&mut s, hr.capabilities & caps & cap::DEPRECATE_EOF != 0),
            Some(&com::QUERY) if mode == Mode::Garbage => garbage(&mut s, id)?,
            Some(&com::QUERY) => s.write_all(&rows)?,
            Some(&com::STMT_CLOSE) | Some(&com::STMT_SEND_LONG_DATA) => {}
            Some(_) => s.write_all(&ok_packet)?,
        }
    }
}

fn main() {
    let mut listen = "127.0.0.1:0".to_string();
    let mut mode = Mode::Normal;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().expect("--listen ADDR"),
            "--mode" => {
                mode = match args.next().as_deref() {
                    Some("normal") => Mode::Normal,
                    Some("endless") => Mode::Endless,
                    Some("garbage") => Mode::Garbage,
                    other => panic!("unknown mode {other:?}"),
                }
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let l = TcpListener::bind(&listen).expect("bind");
    println!("{}", l.local_addr().expect("address"));
    let mut id = 0u32;
    for s in l.incoming().flatten() {
        id = id.wrapping_add(1);
        let conn_id = id;
        std::thread::spawn(move || {
            let _ = serve(s, conn_id, mode);
        });
    }
}

//! Records the seed corpora of the fuzz targets (`fuzz/corpus/`) from real traffic: the
//! `mariadb` command-line client talks to a real MariaDB through a recording relay, and the two
//! byte streams are cut into the inputs each target takes. Run it when the protocol code
//! changes what it reads, and commit the result:
//!
//!     cargo test -p sluice --test corpus -- --ignored
//!
//! (It is ignored in the ordinary run because it writes into the source tree.)

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

use common::*;
use sluice_proto::consts::{cap, com};
use sluice_proto::packet::{HEADER, Header};
use sluice_proto::response::{Expect, NoSink, ResponseTracker, State};

/// Relays one connection between a client and `backend`; the handle yields what each side
/// sent (client to server, server to client) once both have closed.
/// The bytes a relay saw: client to server, server to client.
type Recorded = (Vec<u8>, Vec<u8>);

fn recording_relay(backend: String) -> (u16, std::thread::JoinHandle<Recorded>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = TcpStream::connect(&backend).unwrap();
        let pipe = |mut from: TcpStream, mut to: TcpStream| {
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut buf = [0u8; 65536];
                while let Ok(n) = from.read(&mut buf) {
                    if n == 0 || to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
                seen
            })
        };
        let up = pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
        let down = pipe(server, client);
        (up.join().unwrap(), down.join().unwrap())
    });
    (port, handle)
}

/// Splits a stream into packets (header included).
fn packets(stream: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = stream;
    while let Some(h) = Header::parse(rest) {
        let end = (HEADER + h.len).min(rest.len());
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

fn write_corpus(dir: &Path, name: &str, data: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), data).unwrap();
}

const SESSION: &str = "SELECT 1; SELECT 'a', NULL, '' UNION SELECT 'b', 2, 3; \
    CREATE DATABASE IF NOT EXISTS corpus; USE corpus; DROP TABLE IF EXISTS t; \
    CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20)); INSERT INTO t VALUES (1, 'x'), (2, 'y'); \
    UPDATE t SET v = 'z' WHERE id = 1; SET @u = 1; SET time_zone = '+01:00'; \
    SELECT * FROM t; SELECT * FROM no_such_table; BEGIN; DELETE FROM t WHERE id = 2; COMMIT; \
    KILL QUERY 999999; SHOW WARNINGS; SELECT REPEAT('q', 3000);";

#[test]
#[ignore]
fn record_seed_corpora() {
    let db = MariaDb::start();
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for (tag, extra) in [("plain", vec![]), ("compress", vec!["--compress"])] {
        let (port, recording) = recording_relay(db.addr());
        let mut args = vec!["-h127.0.0.1".to_string(), format!("-P{port}"), "-uapp".into(), "-papppw".into(), "--skip-ssl".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["-e".to_string(), SESSION.to_string()]);
        let _ = std::process::Command::new("mariadb").args(&args).output().unwrap();
        let (up, down) = recording.join().unwrap();
        if tag == "compress" {
            // After the login the streams are compressed frames.
            write_corpus(&out.join("compressed"), "mariadb-cli-to-server", &up);
            write_corpus(&out.join("compressed"), "mariadb-server-to-cli", &down);
            continue;
        }
        let ups = packets(&up);
        let downs = packets(&down);
        // Login: greeting, handshake response, auth packets.
        write_corpus(&out.join("server_packet"), "greeting", &downs[0][HEADER..]);
        write_corpus(&out.join("client_handshake"), "handshake-response", &ups[0][HEADER..]);
        let caps = u32::from_le_bytes(ups[0][HEADER..HEADER + 4].try_into().unwrap());
        let deprecate_eof = caps & cap::DEPRECATE_EOF != 0;
        let track = caps & cap::SESSION_TRACK != 0;
        // Find where the login ends (the first OK from the server) in both streams.
        let login_down = downs.iter().position(|p| p.get(HEADER) == Some(&0)).unwrap() + 1;
        let login_up = ups.iter().take_while(|p| p[3] != 0).count();
        for (i, p) in downs[1..login_down].iter().enumerate() {
            write_corpus(&out.join("server_packet"), &format!("login-{i}"), &p[HEADER..]);
        }
        // Commands: each client command and the server's response to it.
        let mut down_rest: &[u8] = &down[downs[..login_down].iter().map(|p| p.len()).sum::<usize>()..];
        for (i, cmd) in ups[login_up..].iter().enumerate() {
            write_corpus(&out.join("request_stream"), &format!("command-{i:02}"), cmd);
            if cmd.get(HEADER) == Some(&com::QUERY) {
                write_corpus(&out.join("sql"), &format!("query-{i:02}"), &cmd[HEADER + 1..]);
            }
            let expect = match cmd.get(HEADER) {
                Some(&com::QUIT) => break,
                Some(&com::FIELD_LIST) => Expect::FieldList,
                Some(&com::STATISTICS) => Expect::Single,
                _ => Expect::Results,
            };
            let mut t = ResponseTracker::new(deprecate_eof, track);
            t.start(expect, 0);
            let scan = t.scan(down_rest, &mut NoSink).unwrap();
            assert_eq!(scan.state, State::Done, "response {i} followed to its end");
            let mode = [Expect::Results, Expect::Prepare, Expect::Rows, Expect::FieldList, Expect::Single]
                .iter()
                .position(|e| *e == expect)
                .unwrap() as u8
                | if deprecate_eof { 8 } else { 0 }
                | if track { 16 } else { 0 }
                | 32
                | 64;
            let mut input = vec![mode, 61];
            input.extend_from_slice(&down_rest[..scan.consumed]);
            write_corpus(&out.join("response_stream"), &format!("response-{i:02}"), &input);
            for (j, p) in packets(&down_rest[..scan.consumed]).iter().enumerate() {
                if matches!(p.get(HEADER), Some(0x00 | 0xfe | 0xff)) {
                    write_corpus(&out.join("server_packet"), &format!("response-{i:02}-{j}"), &p[HEADER..]);
                }
            }
            down_rest = &down_rest[scan.consumed..];
        }
    }
}

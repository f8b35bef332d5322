//! Abuse: thousands of stalled logins, a client reading a huge result very slowly, connect and
//! disconnect loops, compression bombs, and backends that send garbage or never end a result.
//! For each one sluice stays up, serves others, and its sessions, descriptors and memory come
//! back to their baseline afterwards.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use sluice_proto::consts::{cap, com};
use sluice_testkit::raw::CLIENT_CAPS;

/// Memory sluice may keep after an abuse ends (allocator caches, grown but idle buffers).
const RSS_SLACK_KB: u64 = 8 * 1024;

fn rss_kb(s: &SluiceProc) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.pid())).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

fn sessions(s: &SluiceProc) -> usize {
    json(&admin_get(s, "/sessions", None).1).as_array().map_or(0, |a| a.len())
}

fn config(backend: &str, extra: &str) -> String {
    TestConfig::new().table("health", "interval = \"1h\"\n").proxy(&format!("{extra}\n")).backend(backend).text()
}

/// What sluice looks like at rest: descriptors and memory, after one session came and went.
struct Baseline {
    fds: usize,
    rss_kb: u64,
    /// Backend connections kept for reuse (each holds a descriptor).
    pooled: usize,
}

fn baseline(s: &SluiceProc) -> Baseline {
    assert!(ping(s));
    wait_for("no sessions", || sessions(s) == 0);
    Baseline { fds: fd_count(s), rss_kb: rss_kb(s), pooled: pooled(s) }
}

/// Idle backend connections sluice keeps for reuse now (bounded by pool_idle_max per worker).
fn pooled(s: &SluiceProc) -> usize {
    metric_sum(s, "sluice_backend_pool_idle{") as usize
}

/// Sessions gone, descriptors back, memory back within the slack, and a new login works.
fn assert_back_to(s: &SluiceProc, b: &Baseline, what: &str) {
    wait_for(&format!("{what}: sessions gone"), || sessions(s) == 0);
    // (The baseline may include the admin API connection that was closing when it was taken.)
    if !try_wait_for(|| fd_count(s) <= b.fds + pooled(s).saturating_sub(b.pooled)) {
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", s.pid()))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok().map(|l| l.display().to_string()))
            .collect();
        panic!("{what}: {} descriptors, baseline {}: {fds:?}", fds.len(), b.fds);
    }
    wait_for(&format!("{what}: no backend sessions"), || backend_sessions_zero(s));
    let rss_back = try_wait_for(|| rss_kb(s) <= b.rss_kb + RSS_SLACK_KB);
    assert!(rss_back, "{what}: RSS {} KB, baseline {} KB", rss_kb(s), b.rss_kb);
    eprintln!("{what}: RSS back to {} KB (baseline {} KB)", rss_kb(s), b.rss_kb);
    assert!(ping(s), "{what}: sluice still serves");
}

/// Logs in and pings (the misbehaving fake servers answer anything but queries properly).
fn ping(s: &SluiceProc) -> bool {
    let mut r = sluice_testkit::raw::Raw::login(&s.listen, "app", "apppw", None);
    r.write_packet(0, &[com::PING]).is_ok() && r.read_packet().is_ok_and(|(_, p)| p.first() == Some(&0))
}

fn backend_sessions_zero(s: &SluiceProc) -> bool {
    let (_, m) = admin_get(s, "/metrics", None);
    m.lines().filter(|l| l.starts_with("sluice_backend_sessions{")).all(|l| l.ends_with(" 0"))
}

#[test]
fn thousands_of_stalled_logins_do_not_stop_new_ones() {
    let limit = sluice_testkit::raise_fd_limit();
    let n = 3000.min((limit as usize / 2).saturating_sub(200));
    assert!(n >= 500, "open files limit {limit} is too low for this test");
    let db = shared_db();
    let s = start_sluice_config(&config(&db.addr(), "handshake_timeout = \"10s\""));
    let b = baseline(&s);
    // Half connect and say nothing; half read the greeting and send half a handshake response.
    let mut stalled = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = TcpStream::connect(&s.listen).expect("connect");
        if i % 2 == 1 {
            let mut g = [0u8; 4];
            c.read_exact(&mut g).expect("greeting header");
            c.write_all(&[100, 0, 0, 1, 0x0d, 0xa2]).expect("partial response");
        }
        stalled.push(c);
    }
    wait_for("every stalled client is counted", || metric(&s, "sluice_client_connections ") as usize >= n);
    let held_rss = rss_kb(&s);
    // New clients log in and work while the stalled ones are held.
    for _ in 0..5 {
        let mut r = sluice_testkit::raw::Raw::login(&s.listen, "app", "apppw", None);
        assert!(r.query("SELECT 1").iter().all(|p| err_code(p).is_none()));
    }
    assert!(metric(&s, "sluice_client_connections ") as usize >= n, "the stalled clients were still held during the logins");
    eprintln!("{n} stalled logins held: RSS {held_rss} KB (baseline {} KB)", b.rss_kb);
    // handshake_timeout frees every one of them.
    for c in stalled.iter_mut().step_by(97) {
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
    wait_for("every stalled login timed out", || {
        metric(&s, "sluice_rejected_connections_total{reason=\"handshake_timeout\"} ") as usize == n
    });
    drop(stalled);
    assert_back_to(&s, &b, "stalled logins");
}

#[test]
fn a_slow_reader_of_a_huge_result_is_held_back_not_buffered() {
    let db = shared_db();
    let s = start_sluice_config(&config(&db.addr(), ""));
    let b = baseline(&s);
    let mut r = sluice_testkit::raw::Raw::login(&s.listen, "app", "apppw", None);
    // 200 MB of rows, read at a trickle.
    let mut q = vec![com::QUERY];
    q.extend_from_slice(b"SELECT REPEAT('x', 1000) FROM mysql.seq_1_to_200000");
    r.write_packet(0, &q).unwrap();
    let mut read = 0usize;
    let mut peak = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    for i in 0..400 {
        read += r.s.read(&mut buf).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        if i % 20 == 0 {
            peak = peak.max(rss_kb(&s));
        }
    }
    eprintln!("slow reader: read {read} bytes of 200 MB; sluice RSS peak {peak} KB, baseline {} KB", b.rss_kb);
    // Held back: the server is still sending (blocked writing to sluice, which reads only as
    // fast as the client does). Had sluice read the whole result, the query would have ended.
    let running = db.sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT REPEAT(''x'', 1000)%'");
    assert_eq!(running.trim(), "1", "the backend finished sending: sluice read the result ahead of a client that read {read} bytes");
    assert!(peak <= b.rss_kb + RSS_SLACK_KB, "sluice buffered the result: RSS peak {peak} KB, baseline {} KB", b.rss_kb);
    drop(r);
    assert_back_to(&s, &b, "slow reader");
}

#[test]
fn connect_and_disconnect_loops_leak_nothing() {
    let db = shared_db();
    let s = start_sluice_config(&config(&db.addr(), ""));
    let b = baseline(&s);
    let threads_before: u64 = db
        .sql("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'THREADS_CONNECTED'")
        .trim()
        .parse()
        .unwrap();
    let mut after_round = Vec::new();
    for _ in 0..2 {
        std::thread::scope(|scope| {
            for t in 0..4 {
                let listen = s.listen.clone();
                scope.spawn(move || {
                    for i in 0..150 {
                        match (i + t) % 4 {
                            // Connect and leave at once.
                            0 => drop(TcpStream::connect(&listen).unwrap()),
                            // Read the greeting, leave.
                            1 => {
                                let mut c = TcpStream::connect(&listen).unwrap();
                                let mut g = [0u8; 4];
                                let _ = c.read_exact(&mut g);
                            }
                            // Log in, leave without COM_QUIT.
                            2 => drop(sluice_testkit::raw::Raw::login(&listen, "app", "apppw", None)),
                            // Log in, run a query, quit properly.
                            _ => {
                                let mut r = sluice_testkit::raw::Raw::login(&listen, "app", "apppw", None);
                                r.query("SELECT 1");
                                let _ = r.write_packet(0, &[com::QUIT]);
                            }
                        }
                    }
                });
            }
        });
        assert_back_to(&s, &b, "connect/disconnect loop");
        after_round.push(rss_kb(&s));
    }
    eprintln!("connect/disconnect: RSS after each round {after_round:?} KB, baseline {} KB", b.rss_kb);
    wait_for("the backend has no connection left over", || {
        let now: u64 = db
            .sql("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'THREADS_CONNECTED'")
            .trim()
            .parse()
            .unwrap();
        now <= threads_before + pooled(&s).saturating_sub(b.pooled) as u64
    });
}

#[test]
fn compression_bombs_are_refused() {
    let db = shared_db();
    let s = start_sluice_config(&config(&db.addr(), "max_packet_size = 8388608"));
    let b = baseline(&s);
    let mut r = sluice_testkit::raw::Raw::login_caps(&s.listen, "app", "apppw", None, CLIENT_CAPS | cap::COMPRESS);
    // Frames that are honest about their size, each inflating 16 MiB of zeros: a COM_QUERY of
    // 160 MiB, far above max_packet_size.
    let mut plain = Vec::with_capacity(16 << 20);
    plain.extend_from_slice(&[0xff, 0xff, 0xff, 0, com::QUERY]);
    plain.resize((16 << 20) - 1, b' ');
    let mut seq = 0u8;
    let mut sent_all = true;
    for _ in 0..10 {
        let mut framed = Vec::new();
        seq = sluice_proto::compress::compress(sluice_proto::compress::Algorithm::Zlib, &plain, seq, &mut framed);
        if r.write_raw(&framed).is_err() {
            sent_all = false;
            break;
        }
    }
    let _ = sent_all;
    // sluice answers 1153 (compressed) and closes, or closes outright.
    assert!(r.is_closed(), "the bomb's connection is closed");
    assert_back_to(&s, &b, "compression bomb");
    assert!(metric(&s, "sluice_rejected_connections_total{reason=\"packet_too_large\"} ") >= 1);
}

/// The harness's fake server, started in a misbehaving mode.
struct Responder(std::process::Child, String);

impl Responder {
    fn start(mode: &str) -> Responder {
        let bin = responder_bin();
        let mut c = std::process::Command::new(bin)
            .args(["--mode", mode])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start sluice-responder");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(c.stdout.take().unwrap()), &mut line).unwrap();
        Responder(c, line.trim().to_string())
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// sluice-responder sits next to the sluice binary; built on demand when a single package is tested.
fn responder_bin() -> PathBuf {
    let p = bin().with_file_name("sluice-responder");
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = std::process::Command::new(cargo).args(["build", "-p", "sluice-testkit", "--bin", "sluice-responder"]).status();
        assert!(ok.is_ok_and(|s| s.success()) && p.exists(), "cannot build sluice-responder");
    }
    p
}

#[test]
fn a_backend_that_sends_garbage() {
    let fake = Responder::start("garbage");
    let s = start_sluice_config(&config(&fake.1, "response_timeout = \"2s\""));
    let b = baseline(&s);
    for _ in 0..20 {
        let mut r = sluice_testkit::raw::Raw::login(&s.listen, "app", "apppw", None);
        r.write_packet(0, b"\x03SELECT 1").unwrap();
        assert!(r.is_closed(), "a garbage answer ends the session");
    }
    assert_back_to(&s, &b, "garbage backend");
    assert!(metric(&s, "sluice_errors_total{side=\"backend\"} ") >= 20);
}

#[test]
fn a_result_set_that_never_ends() {
    let fake = Responder::start("endless");
    let s = start_sluice_config(&config(&fake.1, ""));
    let b = baseline(&s);
    let mut peak = 0;
    for _ in 0..3 {
        let mut r = sluice_testkit::raw::Raw::login(&s.listen, "app", "apppw", None);
        r.write_packet(0, b"\x03SELECT 1").unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0;
        while read < 100 << 20 {
            read += r.s.read(&mut buf).unwrap();
        }
        peak = u64::max(peak, rss_kb(&s));
        // The client gives up; sluice must let go of the backend too.
        drop(r);
        wait_for("the endless session ends", || sessions(&s) == 0);
    }
    assert!(peak <= b.rss_kb + RSS_SLACK_KB, "RSS peak {peak} KB while relaying 100 MB, baseline {} KB", b.rss_kb);
    assert_back_to(&s, &b, "endless result");
}

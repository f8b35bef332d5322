//! Starts local MariaDB servers for `scripts/run.sh` and the benchmarks, prints one
//! `HOST:PORT` line per server to stdout, and keeps them running until it is killed (the
//! servers die with it).
//!
//! Usage: sluice-mariadb [--count N] [--replicas N] [--dir DIR] [--server-option OPTION ...]
//!
//! With `--replicas N`, the servers are a primary (the first line) and N replicas that follow it
//! with GTID replication, read-only. `--server-option` (repeated) gives the servers options
//! beyond the tests' (`--count` only; the benchmarks' larger buffer pool and redo log).

use std::io::Write;

fn main() {
    let mut count = 2usize;
    let mut replicas = None;
    let mut options = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--count" => count = args.next().and_then(|v| v.parse().ok()).expect("--count N"),
            "--replicas" => replicas = Some(args.next().and_then(|v| v.parse().ok()).expect("--replicas N")),
            "--server-option" => options.push(args.next().expect("--server-option OPTION")),
            "--dir" => {
                // Absolute: the servers are started from other working directories.
                let dir = std::path::absolute(args.next().expect("--dir DIR")).expect("--dir: a usable path");
                // SAFETY: no other thread exists yet, so nothing reads the environment concurrently.
                unsafe { std::env::set_var("SLUICE_TESTKIT_DIR", dir) };
            }
            "-h" | "--help" => {
                println!("usage: sluice-mariadb [--count N] [--replicas N] [--dir DIR] [--server-option OPTION ...]");
                return;
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let servers: Vec<_> = match replicas {
        Some(n) => sluice_testkit::Topology::start(n).servers,
        None => (0..count).map(|_| sluice_testkit::MariaDb::start_with(&options)).collect(),
    };
    let mut out = std::io::stdout();
    for s in &servers {
        let _ = writeln!(out, "{}", s.addr());
    }
    let _ = out.flush();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

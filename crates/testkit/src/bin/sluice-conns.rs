//! Connection load for the benchmarks.
//!
//!   sluice-conns hold  ADDR USER PASS N          log in N connections and keep them open
//!   sluice-conns churn ADDR USER PASS RATE SECS  open, log in and close RATE connections/s
//!
//! Prints one line when done (hold: once all are open) and keeps holding until killed.

use std::time::{Duration, Instant};

use sluice_testkit::raw::Raw;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, user, pass) = (&args[1], &args[2], &args[3]);
    match args[0].as_str() {
        "hold" => {
            let n: usize = args[4].parse().expect("N");
            let held: Vec<Raw> = (0..n).map(|_| Raw::login(addr, user, pass, None)).collect();
            println!("held {}", held.len());
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        "churn" => {
            let rate: u64 = args[4].parse().expect("RATE");
            let secs: u64 = args[5].parse().expect("SECS");
            let start = Instant::now();
            let (mut done, mut failed) = (0u64, 0u64);
            while start.elapsed() < Duration::from_secs(secs) {
                // Keep to the schedule: connection k is due at k / rate seconds.
                let due = Duration::from_nanos(done * 1_000_000_000 / rate.max(1));
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                match std::panic::catch_unwind(|| {
                    let mut r = Raw::login(addr, user, pass, None);
                    let _ = r.write_packet(0, &[sluice_proto::consts::com::QUIT]);
                }) {
                    Ok(()) => {}
                    Err(_) => failed += 1,
                }
                done += 1;
            }
            println!("churned {done} connections in {:.1} s, {failed} failed", start.elapsed().as_secs_f64());
        }
        other => panic!("unknown mode {other}"),
    }
}

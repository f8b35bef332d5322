//! What following a result set's rows costs: the response tracker walks a result set of N rows
//! (binary rows of one length, or of lengths that vary), freshly copied into its buffer as a
//! socket read leaves it, after the caches were filled with other data. Prints the median time
//! per row over many walks.
//!
//!   cargo run --release -p sluice-proto --example row_walk -- [ROWS] [vary]

use std::time::Instant;

use sluice_proto::packet::frame;
use sluice_proto::response::{Expect, NoSink, ResponseTracker};

/// A result set of one column and `rows` binary rows (a VARCHAR of 121 bytes, or of 110 to 129
/// bytes when `vary`), ended by an OK packet marked 0xfe.
fn result_set(rows: usize, vary: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut seq = frame(&mut out, &[1], 1);
    seq = frame(&mut out, b"\x03def\x00\x00\x00\x01c\x00\x0c\x21\x00\x0b\x00\x00\x00\xfd\x00\x00\x00\x00\x00", seq);
    for i in 0..rows {
        let len = if vary { 110 + (i * 7) % 20 } else { 121 };
        let mut row = vec![0u8, 0, len as u8];
        row.resize(3 + len, b'7');
        seq = frame(&mut out, &row, seq);
    }
    frame(&mut out, &[0xfe, 0, 0, 2, 0, 0, 0], seq);
    out
}

fn main() {
    let rows: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let vary = std::env::args().nth(2).is_some_and(|a| a == "vary");
    let stream = result_set(rows, vary);
    let mut other = vec![0u8; 4 << 20];
    let mut times = Vec::with_capacity(2000);
    for _ in 0..times.capacity() {
        // Other data through the caches, then the response copied in as a read copies it.
        for b in other.iter_mut().step_by(64) {
            *b = b.wrapping_add(1);
        }
        let buf = stream.clone();
        let start = Instant::now();
        let mut t = ResponseTracker::new(true, true);
        t.start(Expect::Results, 0);
        let scan = t.scan(&buf, &mut NoSink).expect("a well-formed result set");
        times.push(start.elapsed().as_secs_f64());
        assert_eq!(scan.consumed, stream.len());
        std::hint::black_box(&other);
    }
    times.sort_by(f64::total_cmp);
    let per_row = times[times.len() / 2] / rows.max(1) as f64 * 1e9;
    println!("{rows} rows{}: {per_row:.2} ns per row", if vary { " of varying lengths" } else { " of one length" });
}

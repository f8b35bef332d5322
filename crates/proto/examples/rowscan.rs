//! Instruction counts of the response tracker on a 1000-row result set, for callgrind:
//! `valgrind --tool=callgrind target/release/examples/rowscan`.
use sluice_proto::response::{Expect, NoSink, ResponseTracker, State};

fn packet(out: &mut Vec<u8>, seq: u8, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_le_bytes()[..3]);
    out.push(seq);
    out.extend_from_slice(payload);
}

fn main() {
    let rows: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let loops: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let mut buf = Vec::new();
    packet(&mut buf, 1, &[1]);
    let mut def = vec![3];
    def.extend_from_slice(b"def");
    def.extend_from_slice(&[0; 30]);
    packet(&mut buf, 2, &def);
    let mut row = vec![120u8];
    row.extend_from_slice(&[b'7'; 120]);
    for i in 0..rows {
        packet(&mut buf, (3 + i) as u8, &row);
    }
    packet(&mut buf, (3 + rows) as u8, &[0xfe, 0, 0, 2, 0, 0, 0]);
    let mut total = 0;
    for _ in 0..loops {
        let mut t = ResponseTracker::new(true, true);
        t.start(Expect::Results, 0);
        let s = t.scan(std::hint::black_box(&buf), &mut NoSink).expect("well-formed");
        assert_eq!(s.state, State::Done);
        total += s.consumed;
    }
    println!("{total}");
}

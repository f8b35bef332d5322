//! Instruction counts of the KILL look-up every COM_QUERY goes through, on sysbench's queries,
//! for callgrind: `valgrind --tool=callgrind target/release/examples/killscan [loops [multi]]`;
//! divide the program's count by loops and by the number of queries (6).
use sluice_proto::sql::find_kills;

const QUERIES: [&[u8]; 6] = [
    b"SELECT c FROM sbtest1 WHERE id=5023",
    b"SELECT c FROM sbtest1 WHERE id BETWEEN 4999 AND 5098",
    b"SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN 4999 AND 5098",
    b"SELECT c FROM sbtest1 WHERE id BETWEEN 4999 AND 5098 ORDER BY c",
    b"SELECT DISTINCT c FROM sbtest1 WHERE id BETWEEN 4999 AND 5098 ORDER BY c",
    b"UPDATE sbtest1 SET k=k+1 WHERE id=5023",
];

fn main() {
    let loops: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    // With "multi": as for a connection that runs multi-statements.
    let multi = std::env::args().nth(2).as_deref() == Some("multi");
    let mut found = 0;
    for _ in 0..loops {
        for q in QUERIES {
            found += usize::from(find_kills(std::hint::black_box(q), multi).is_some());
        }
    }
    assert_eq!(found, 0);
}

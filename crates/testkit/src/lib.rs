//! Test harness shared by sluice's integration tests and benchmarks: real MariaDB servers on
//! loopback ports with their own data directories, and a sluice process under test.

pub mod fault;
pub mod mariadb;
pub mod raw;
pub mod sluice;

pub use mariadb::MariaDb;
pub use sluice::SluiceProc;

/// A process-unique number for naming files.
pub fn unique_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

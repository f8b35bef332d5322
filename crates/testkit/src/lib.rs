//! Test harness shared by sluice's integration tests and benchmarks: real MariaDB servers on
//! loopback ports with their own data directories (alone, or a primary and replicas), real
//! TiDB servers (`tidb.rs`), and a sluice process under test.

pub mod fault;
pub mod mariadb;
pub mod raw;
pub mod replication;
pub mod sluice;
pub mod sysbench;
pub mod tidb;

pub use mariadb::MariaDb;
pub use replication::Topology;
pub use sluice::SluiceProc;
pub use tidb::TiDb;

/// A process-unique number for naming files.
pub fn unique_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Raises this process's soft limit on open files to the hard limit (tests that hold thousands
/// of connections); returns the limit now in force.
pub fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 0;
        }
        let want = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
            l.rlim_cur = l.rlim_max;
        }
    }
    l.rlim_cur
}

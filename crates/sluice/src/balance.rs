//! Choosing a backend for a new session.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::backend::{Backend, Backends};
use crate::config::Policy;

/// Balancer state shared by all workers.
pub struct Balancer {
    policy: Policy,
    rr: AtomicUsize,
    rng: AtomicU64,
}

impl Balancer {
    pub fn new(policy: Policy) -> Balancer {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        Balancer { policy, rr: AtomicUsize::new(0), rng: AtomicU64::new(seed | 1) }
    }

    fn random(&self) -> u64 {
        // xorshift64*, advanced with a CAS-free fetch_add of a Weyl constant: good enough to spread load.
        let mut x = self.rng.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Picks an up backend not in `exclude`, or None when there is none.
    pub fn pick(&self, backends: &Backends, exclude: &[usize]) -> Option<Arc<Backend>> {
        let usable = |b: &&Arc<Backend>| b.is_up() && !exclude.contains(&b.index);
        let n = backends.list.len();
        if n == 0 {
            return None;
        }
        match self.policy {
            Policy::LeastConnections => {
                // Lowest sessions/weight; ties go round-robin so that an idle pool spreads evenly.
                let start = self.rr.fetch_add(1, Ordering::Relaxed);
                let mut best: Option<&Arc<Backend>> = None;
                for i in 0..n {
                    let b = &backends.list[(start + i) % n];
                    if !usable(&b) {
                        continue;
                    }
                    let load = |b: &Backend| b.sessions.load(Ordering::Relaxed) as u64 * 1_000_000 / b.weight as u64;
                    if best.is_none_or(|x| load(b) < load(x)) {
                        best = Some(b);
                    }
                }
                best.cloned()
            }
            Policy::RoundRobin => {
                let start = self.rr.fetch_add(1, Ordering::Relaxed);
                (0..n).map(|i| &backends.list[(start + i) % n]).find(|b| usable(b)).cloned()
            }
            Policy::WeightedRandom => {
                let total: u64 = backends.list.iter().filter(|b| usable(b)).map(|b| b.weight as u64).sum();
                if total == 0 {
                    return None;
                }
                let mut r = self.random() % total;
                for b in backends.list.iter().filter(|b| usable(b)) {
                    if r < b.weight as u64 {
                        return Some(b.clone());
                    }
                    r -= b.weight as u64;
                }
                None
            }
        }
    }
}

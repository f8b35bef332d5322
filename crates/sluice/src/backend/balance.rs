//! Choosing a backend: for a new session (and a move), the primary; for a read of the
//! read/write split, a replica fit for reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{Backend, Backends};
use crate::config::{Policy, Role};

/// Which backends a choice is among.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Those serving as the primary: where sessions and writes go. When none is usable, any
    /// usable backend (a session may still read there; a write gets the server's error),
    /// unless failover is on: then none.
    Primary,
    /// Replicas fit for reads ([`Backend::fit_for_reads`]).
    Reads,
    /// Usable backends among these (bits by index: the first 64), as a query rule names them.
    Among(u64),
}

/// Balancer state shared by all workers.
const POLICIES: [Policy; 4] = [Policy::LeastConnections, Policy::RoundRobin, Policy::WeightedRandom, Policy::LeastLatency];

pub struct Balancer {
    /// The [`Policy`] in force, as its index in [`POLICIES`] (a reload changes it).
    policy: std::sync::atomic::AtomicU8,
    rr: AtomicUsize,
    rng: AtomicU64,
}

impl Balancer {
    pub fn new(policy: Policy) -> Balancer {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        let b = Balancer { policy: Default::default(), rr: AtomicUsize::new(0), rng: AtomicU64::new(seed | 1) };
        b.set_policy(policy);
        b
    }

    pub fn policy(&self) -> Policy {
        POLICIES[usize::from(self.policy.load(Ordering::Relaxed))]
    }

    pub fn set_policy(&self, p: Policy) {
        let i = POLICIES.iter().position(|x| *x == p).unwrap_or(0);
        self.policy.store(i as u8, Ordering::Relaxed);
    }

    fn random(&self) -> u64 {
        // xorshift64*, advanced with a CAS-free fetch_add of a Weyl constant: good enough to spread load.
        let mut x = self.rng.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Picks a backend of the kind `want` names, not in `exclude`, or None when there is none.
    pub fn pick(&self, backends: &Backends, exclude: &[usize], want: Want) -> Option<Arc<Backend>> {
        match want {
            Want::Primary => self
                .pick_among(backends, |b| b.is_usable() && b.serves_as() == Role::Primary && !exclude.contains(&b.index))
                .or_else(|| {
                    let any = !backends.topology.is_strict();
                    any.then(|| self.pick_among(backends, |b| b.is_usable() && !exclude.contains(&b.index))).flatten()
                }),
            Want::Reads => self.pick_among(backends, |b| b.fit_for_reads() && !exclude.contains(&b.index)),
            Want::Among(mask) => {
                self.pick_among(backends, |b| b.is_usable() && b.index < 64 && mask >> b.index & 1 == 1 && !exclude.contains(&b.index))
            }
        }
    }

    /// Picks one of the backends `fits` accepts, by the policy.
    fn pick_among(&self, backends: &Backends, fits: impl Fn(&Backend) -> bool) -> Option<Arc<Backend>> {
        let usable = |b: &&Arc<Backend>| fits(b);
        let list = backends.list();
        let n = list.len();
        if n == 0 {
            return None;
        }
        match self.policy() {
            policy @ (Policy::LeastConnections | Policy::LeastLatency) => {
                // Lowest sessions/weight; ties go round-robin so that an idle pool spreads evenly.
                let start = self.rr.fetch_add(1, Ordering::Relaxed);
                let mut best: Option<&Arc<Backend>> = None;
                for i in 0..n {
                    let b = &list[(start + i) % n];
                    if !usable(&b) {
                        continue;
                    }
                    let load = |b: &Backend| b.sessions.load(Ordering::Relaxed) as u64 * 1_000_000_000 / b.balance_weight(policy).max(1);
                    if best.is_none_or(|x| load(b) < load(x)) {
                        best = Some(b);
                    }
                }
                best.cloned()
            }
            Policy::RoundRobin => {
                // The k-th usable backend, so that a backend that is out does not double the share
                // of the one after it.
                let count = list.iter().filter(|b| usable(b)).count();
                if count == 0 {
                    return None;
                }
                let k = self.rr.fetch_add(1, Ordering::Relaxed) % count;
                list.iter().filter(|b| usable(b)).nth(k).cloned()
            }
            Policy::WeightedRandom => {
                let total: u64 = list.iter().filter(|b| usable(b)).map(|b| b.weight() as u64).sum();
                if total == 0 {
                    return None;
                }
                let mut r = self.random() % total;
                for b in list.iter().filter(|b| usable(b)) {
                    if r < b.weight() as u64 {
                        return Some(b.clone());
                    }
                    r -= b.weight() as u64;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Replication;
    use crate::config::Config;

    fn backends(weights: &[u32]) -> Backends {
        let text: String = weights
            .iter()
            .enumerate()
            .map(|(i, w)| format!("[[backends]]\naddress = \"127.0.0.1:{}\"\nweight = {w}\n", 3300 + i))
            .collect();
        let cfg = Config::parse(&text).expect("config");
        let names: Vec<String> = cfg.backends.iter().map(|b| b.address.get_ref().clone()).collect();
        let m = crate::metrics::Metrics::new(&names);
        Backends::new(
            cfg.backends
                .iter()
                .enumerate()
                .map(|(i, b)| Backend::from_config(i, b, m.backends[i].clone(), &cfg.proxy, 1).unwrap())
                .collect(),
            cfg.proxy.balance,
        )
    }

    #[test]
    fn least_connections_prefers_the_emptiest_and_skips_down_and_excluded() {
        let bs = backends(&[1, 1, 1]);
        let lb = Balancer::new(Policy::LeastConnections);
        let _a = bs.list()[0].bind();
        let _b = bs.list()[0].bind();
        let _c = bs.list()[1].bind();
        assert_eq!(lb.pick(&bs, &[], Want::Primary).unwrap().index, 2);
        bs.list()[2].set_up(false);
        assert_eq!(lb.pick(&bs, &[], Want::Primary).unwrap().index, 1);
        assert_eq!(lb.pick(&bs, &[1], Want::Primary).unwrap().index, 0);
        assert!(lb.pick(&bs, &[0, 1], Want::Primary).is_none());
    }

    #[test]
    fn sessions_go_to_primaries_and_reads_to_replicas_fit_for_them() {
        let bs = backends(&[1, 1, 1]);
        let lb = Balancer::new(Policy::RoundRobin);
        let replica = Replication { read_only: Some(true), ..Default::default() };
        let status =
            |behind| sluice_proto::replication::ReplicaStatus { running: true, seconds_behind: Some(behind), ..Default::default() };
        let lag = std::time::Duration::from_secs(10);
        bs.list()[1].observed(Replication { replica: Some(status(0)), ..replica.clone() }, lag);
        bs.list()[2].observed(Replication { replica: Some(status(11)), ..replica.clone() }, lag);
        assert!((0..6).all(|_| lb.pick(&bs, &[], Want::Primary).unwrap().index == 0));
        // The replica 11 s behind serves no reads; the other does.
        assert!((0..6).all(|_| lb.pick(&bs, &[], Want::Reads).unwrap().index == 1));
        assert!(bs.list()[2].replication.lock().reads_out.as_deref().is_some_and(|w| w.contains("11 s behind")));
        bs.list()[2].observed(Replication { replica: Some(status(3)), ..replica.clone() }, lag);
        let reads: Vec<usize> = (0..6).map(|_| lb.pick(&bs, &[], Want::Reads).unwrap().index).collect();
        assert!(reads.contains(&1) && reads.contains(&2) && !reads.contains(&0), "{reads:?}");
        // A stopped replica serves none; with no primary up, sessions go where they can.
        bs.list()[1].observed(Replication { replica: Some(sluice_proto::replication::ReplicaStatus::default()), ..replica.clone() }, lag);
        assert!((0..6).all(|_| lb.pick(&bs, &[], Want::Reads).unwrap().index == 2));
        bs.list()[0].set_up(false);
        assert!(lb.pick(&bs, &[], Want::Primary).is_some_and(|b| b.index != 0));
    }

    #[test]
    fn least_latency_gives_a_slower_backend_fewer_sessions() {
        let bs = backends(&[1, 1]);
        let lb = Balancer::new(Policy::LeastLatency);
        bs.list()[0].load.add_rtt(std::time::Duration::from_micros(100));
        bs.list()[1].load.add_rtt(std::time::Duration::from_micros(300));
        bs.refresh_load();
        let mut held = Vec::new();
        for _ in 0..40 {
            held.push(lb.pick(&bs, &[], Want::Primary).unwrap().bind());
        }
        let on = |i: usize| held.iter().filter(|g| g.index == i).count();
        // Weights 1000 and 333 per mille: three sessions to one.
        assert_eq!((on(0), on(1)), (30, 10));
    }

    #[test]
    fn round_robin_cycles_over_up_backends() {
        let bs = backends(&[1, 1, 1]);
        let lb = Balancer::new(Policy::RoundRobin);
        bs.list()[1].set_up(false);
        let picks: Vec<usize> = (0..6).map(|_| lb.pick(&bs, &[], Want::Primary).unwrap().index).collect();
        assert_eq!(picks.iter().filter(|&&i| i == 0).count(), picks.iter().filter(|&&i| i == 2).count());
        assert!(!picks.contains(&1));
    }

    #[test]
    fn weighted_random_follows_weights() {
        let bs = backends(&[1, 3]);
        let lb = Balancer::new(Policy::WeightedRandom);
        let heavy = (0..4000).filter(|_| lb.pick(&bs, &[], Want::Primary).unwrap().index == 1).count();
        // Expected 3000 of 4000; the bound is far from what chance produces.
        assert!((2600..3400).contains(&heavy), "{heavy}");
        assert!(lb.pick(&bs, &[0, 1], Want::Primary).is_none());
    }
}

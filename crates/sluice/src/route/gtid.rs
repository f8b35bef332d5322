//! The latest GTID of each replication domain that any session wrote through this sluice, for
//! `causal_reads = "global"`: a read sent to a replica first waits there for all of them, so it
//! sees every write that completed through sluice before it began, whoever made it.

use parking_lot::Mutex;

#[derive(Default)]
pub struct LatestWrites {
    inner: Mutex<Latest>,
}

#[derive(Default)]
struct Latest {
    /// (domain, server, sequence number), one per domain.
    domains: Vec<(u32, u32, u64)>,
    /// The same as a GTID list (`0-1-42,1-2-7`).
    text: String,
}

/// Reads a GTID (`domain-server-sequence`).
fn parse(gtid: &str) -> Option<(u32, u32, u64)> {
    let mut it = gtid.trim().splitn(3, '-');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

impl LatestWrites {
    /// Records what a session's write reported (`last_gtid`: a GTID or a list of them).
    pub fn note(&self, list: &str) {
        let mut l = self.inner.lock();
        let mut changed = false;
        for g in list.split(',').filter_map(parse) {
            match l.domains.iter_mut().find(|d| d.0 == g.0) {
                Some(d) if d.2 >= g.2 => {}
                Some(d) => {
                    *d = g;
                    changed = true;
                }
                None => {
                    l.domains.push(g);
                    changed = true;
                }
            }
        }
        if changed {
            let text = l.domains.iter().map(|(d, s, n)| format!("{d}-{s}-{n}")).collect::<Vec<_>>().join(",");
            l.text = text;
        }
    }

    /// Copies the latest position into `out`; whether it differed from what `out` held.
    pub fn refresh(&self, out: &mut String) -> bool {
        let l = self.inner.lock();
        if *out == l.text {
            return false;
        }
        out.clone_from(&l.text);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_of_each_domain() {
        let w = LatestWrites::default();
        let mut seen = String::new();
        assert!(!w.refresh(&mut seen));
        w.note("0-1-5");
        w.note("0-1-3");
        w.note("1-2-7,0-1-9");
        w.note("garbage");
        assert!(w.refresh(&mut seen));
        assert_eq!(seen, "0-1-9,1-2-7");
        assert!(!w.refresh(&mut seen));
    }
}

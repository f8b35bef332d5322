//! GTID positions as MariaDB writes them (`@@gtid_binlog_pos`, `Gtid_IO_Pos`): for each
//! replication domain, the last transaction's `domain-server-sequence`, comma-separated
//! (`0-1-42,1-2-7`). How two positions compare decides which replica a failover promotes and
//! whether a returning server may replicate from the new primary.

use std::fmt;

/// One GTID: the replication domain, the server that wrote the transaction, and its sequence
/// number in the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

/// A GTID position: the last GTID of each domain (sorted by domain, one per domain).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Position {
    gtids: Vec<Gtid>,
}

/// Transactions one position holds that another does not, in one domain: sequence numbers
/// `from..=to`, the last written by `server`. `from == to` with the same sequence number in
/// both is a conflict: two servers wrote that transaction differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beyond {
    pub domain: u32,
    pub server: u32,
    pub from: u64,
    pub to: u64,
}

impl Beyond {
    /// How many transactions.
    pub fn count(&self) -> u64 {
        self.to - self.from + 1
    }
}

impl fmt::Display for Beyond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.from == self.to {
            write!(f, "{}-{}-{}", self.domain, self.server, self.to)
        } else {
            write!(f, "{}-*-{}..{}-{}-{}", self.domain, self.from, self.domain, self.server, self.to)
        }
    }
}

impl Position {
    /// Reads a position; an empty text is the empty position (no transaction yet). None when
    /// a GTID is malformed or a domain appears twice.
    pub fn parse(text: &str) -> Option<Position> {
        let mut gtids = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.splitn(3, '-');
            let g = Gtid { domain: it.next()?.parse().ok()?, server: it.next()?.parse().ok()?, seq: it.next()?.parse().ok()? };
            gtids.push(g);
        }
        gtids.sort_by_key(|g| g.domain);
        if gtids.windows(2).any(|w| w[0].domain == w[1].domain) {
            return None;
        }
        Some(Position { gtids })
    }

    pub fn is_empty(&self) -> bool {
        self.gtids.is_empty()
    }

    /// The last GTID of `domain`, if any transaction of it is here.
    pub fn get(&self, domain: u32) -> Option<Gtid> {
        self.gtids.iter().find(|g| g.domain == domain).copied()
    }

    /// The sum of the sequence numbers: larger for a position that holds more (comparable
    /// only between positions of one history).
    pub fn total(&self) -> u64 {
        self.gtids.iter().map(|g| g.seq).fold(0, u64::saturating_add)
    }

    /// What this position holds that `other` does not, domain by domain (empty: `other`
    /// covers it).
    pub fn beyond(&self, other: &Position) -> Vec<Beyond> {
        let mut out = Vec::new();
        for g in &self.gtids {
            let theirs = other.get(g.domain);
            let seen = theirs.map_or(0, |t| t.seq);
            if g.seq > seen {
                out.push(Beyond { domain: g.domain, server: g.server, from: seen + 1, to: g.seq });
            } else if theirs.is_some_and(|t| t.seq == g.seq && t.server != g.server) {
                out.push(Beyond { domain: g.domain, server: g.server, from: g.seq, to: g.seq });
            }
        }
        out
    }

    /// The part of this position in `domain` alone.
    pub fn only(&self, domain: u32) -> Position {
        Position { gtids: self.get(domain).into_iter().collect() }
    }

    /// The GTIDs, one per domain.
    pub fn gtids(&self) -> &[Gtid] {
        &self.gtids
    }

    /// Whether this position holds everything `other` does: in each of `other`'s domains the
    /// same transaction or a later one.
    pub fn covers(&self, other: &Position) -> bool {
        other.beyond(self).is_empty()
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.gtids.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}-{}-{}", g.domain, g.server, g.seq)?;
        }
        Ok(())
    }
}

/// A list of what one position holds beyond another, for messages: "0-1-43..0-1-45 (3
/// transactions)".
pub fn describe(beyond: &[Beyond]) -> String {
    let n: u64 = beyond.iter().map(Beyond::count).sum();
    let list = beyond.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ");
    format!("{list} ({n} transaction{})", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Position {
        Position::parse(s).unwrap()
    }

    #[test]
    fn positions_parse_and_print() {
        assert_eq!(p("").to_string(), "");
        assert_eq!(p("1-2-7, 0-1-42").to_string(), "0-1-42,1-2-7");
        assert_eq!(p("0-1-42").get(0), Some(Gtid { domain: 0, server: 1, seq: 42 }));
        assert_eq!(Position::parse("0-1"), None);
        assert_eq!(Position::parse("0-1-x"), None);
        assert_eq!(Position::parse("0-1-2,0-2-3"), None, "a domain twice");
        assert_eq!(p("0-1-42,1-2-7").total(), 49);
    }

    #[test]
    fn one_position_covers_another_domain_by_domain() {
        assert!(p("0-1-42").covers(&p("0-1-40")));
        assert!(p("0-2-42").covers(&p("0-1-40")), "a later transaction of another server");
        assert!(p("0-1-42").covers(&p("")));
        assert!(!p("0-1-40").covers(&p("0-1-42")));
        assert!(!p("0-1-42").covers(&p("0-1-42,1-1-1")), "a domain it lacks");
        assert!(!p("0-1-42").covers(&p("0-2-42")), "the same number written by another server");
        assert!(p("0-1-42,1-1-5").covers(&p("0-1-42")));
    }

    #[test]
    fn what_one_holds_beyond_another_is_named() {
        let b = p("0-1-45,1-3-2").beyond(&p("0-2-42"));
        assert_eq!(b, [Beyond { domain: 0, server: 1, from: 43, to: 45 }, Beyond { domain: 1, server: 3, from: 1, to: 2 }]);
        assert_eq!(describe(&b), "0-*-43..0-1-45, 1-*-1..1-3-2 (5 transactions)");
        let conflict = p("0-1-42").beyond(&p("0-2-42"));
        assert_eq!(describe(&conflict), "0-1-42 (1 transaction)");
        assert!(p("0-1-40").beyond(&p("0-1-42")).is_empty());
    }
}

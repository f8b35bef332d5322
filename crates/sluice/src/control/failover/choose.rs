//! Which replica a failover promotes, or why none may be: pure, from what each replica said
//! just before.

use sluice_proto::gtid::{Beyond, Position, describe};

/// A replica as a failover sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub name: String,
    /// Why it may not be promoted (`candidate = false`, delayed, ...); it still counts when
    /// replicas are compared.
    pub out: Option<String>,
    pub priority: u32,
    /// `Gtid_IO_Pos`: what it has received of the lost primary's log.
    pub received: Position,
    /// `@@gtid_current_pos`: what it has applied.
    pub applied: Position,
}

/// Why a failover promotes nobody.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no replica may be promoted: {0}")]
    NoCandidate(String),
    /// The best replica lacks transactions the primary had when sluice last read it.
    #[error("{name} lacks the primary's last transactions that sluice saw: {}", describe(.missing))]
    Behind { name: String, missing: Vec<Beyond> },
    /// Another replica applied transactions the best one never received.
    #[error("replicas disagree: {other} applied what {name}, the best candidate, never received: {}", describe(.beyond))]
    Disagree { name: String, other: String, beyond: Vec<Beyond> },
}

/// The replica to promote (its index in `replicas`): of those that may be, the one that
/// received most, then applied most, then of highest priority. Refused when it lacks what the
/// primary had at `last_seen`, or when another replica (one that may not be promoted too)
/// applied what it did not receive.
pub fn choose(last_seen: &Position, replicas: &[Candidate]) -> Result<usize, Refusal> {
    let rank = |c: &Candidate| (received(c).total(), c.applied.total(), c.priority);
    let best = replicas.iter().enumerate().filter(|(_, c)| c.out.is_none()).max_by_key(|(_, c)| rank(c)).map(|(i, _)| i);
    let Some(best) = best else {
        let why = replicas.iter().map(|c| format!("{}: {}", c.name, c.out.as_deref().unwrap_or("?"))).collect::<Vec<_>>();
        return Err(Refusal::NoCandidate(if why.is_empty() { "no replica is up".into() } else { why.join("; ") }));
    };
    let b = &replicas[best];
    let has = received(b);
    let missing = last_seen.beyond(has);
    if !missing.is_empty() {
        return Err(Refusal::Behind { name: b.name.clone(), missing });
    }
    for other in replicas.iter().filter(|c| c.name != b.name) {
        let beyond = other.applied.beyond(has);
        if !beyond.is_empty() {
            return Err(Refusal::Disagree { name: b.name.clone(), other: other.name.clone(), beyond });
        }
    }
    Ok(best)
}

/// What a replica holds: what it received, or what it applied when that says more (a replica
/// whose relay log was purged, or that never received anything since it started).
fn received(c: &Candidate) -> &Position {
    if c.received.covers(&c.applied) { &c.received } else { &c.applied }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, received: &str, applied: &str) -> Candidate {
        Candidate {
            name: name.into(),
            out: None,
            priority: 0,
            received: Position::parse(received).unwrap(),
            applied: Position::parse(applied).unwrap(),
        }
    }

    fn p(s: &str) -> Position {
        Position::parse(s).unwrap()
    }

    #[test]
    fn the_replica_that_received_most_is_promoted() {
        let r = [c("a", "0-1-40", "0-1-40"), c("b", "0-1-42", "0-1-39"), c("d", "0-1-41", "0-1-41")];
        assert_eq!(choose(&p("0-1-42"), &r), Ok(1));
    }

    #[test]
    fn priority_breaks_ties_and_excluded_replicas_are_not_promoted() {
        let mut r = [c("a", "0-1-42", "0-1-42"), c("b", "0-1-42", "0-1-42")];
        r[1].priority = 5;
        assert_eq!(choose(&p("0-1-42"), &r), Ok(1));
        r[1].out = Some("candidate = false".into());
        assert_eq!(choose(&p("0-1-42"), &r), Ok(0));
        r[0].out = Some("a delayed replica".into());
        let e = choose(&p("0-1-42"), &r).unwrap_err();
        assert_eq!(e.to_string(), "no replica may be promoted: a: a delayed replica; b: candidate = false");
        assert!(matches!(choose(&p(""), &[]), Err(Refusal::NoCandidate(_))));
    }

    #[test]
    fn a_replica_lacking_the_primarys_last_transactions_is_refused() {
        let r = [c("a", "0-1-40", "0-1-40"), c("b", "0-1-41", "0-1-41")];
        let e = choose(&p("0-1-43"), &r).unwrap_err();
        assert_eq!(e.to_string(), "b lacks the primary's last transactions that sluice saw: 0-*-42..0-1-43 (2 transactions)");
    }

    #[test]
    fn replicas_that_disagree_are_refused() {
        // b applied a transaction of its own that a never saw, in another domain.
        let r = [c("a", "0-1-45", "0-1-45"), c("b", "0-1-40", "0-1-40,1-3-1")];
        let e = choose(&p("0-1-44"), &r).unwrap_err();
        assert!(matches!(&e, Refusal::Disagree { name, other, .. } if name == "a" && other == "b"), "{e}");
        // A delayed replica that received more than it applied agrees.
        let mut r = [c("a", "0-1-45", "0-1-45"), c("b", "0-1-46", "0-1-30")];
        r[1].out = Some("delayed".into());
        assert_eq!(choose(&p("0-1-45"), &r), Ok(0));
    }
}

//! Which captured commands may give another result in a faithful replay because of how the
//! server ordered commands of different sessions that overlapped in time.
//!
//! A replay keeps the order of commands that did not overlap in the capture (`Order`). When a
//! read overlapped another session's commit, the server decided which came first, and the
//! capture cannot tell which it was: the replay may see the commit or not. Such a command is
//! *order-dependent* when it overlapped a change that another session made visible (its
//! `COMMIT`, or a write outside a transaction), or when it is in a transaction whose first
//! read, which fixes what a repeatable-read transaction sees, did. A difference in an
//! order-dependent command is reported apart from the others: it says something about
//! concurrency, not about the server replayed against.

use std::collections::{BTreeMap, HashMap, HashSet};

use sluice_proto::consts::com;
use sluice_proto::digest::{Part, parts};
use sluice_proto::rw::{Class, Why, classify};

use super::Captured;

/// What a statement does to what other sessions see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    Begin,
    Commit,
    Rollback,
    /// A read (a consistent read fixes a transaction's snapshot).
    Read,
    /// May change data (visible to others at once outside a transaction).
    Write,
    Other,
}

pub(super) fn effect(sql: &[u8]) -> Effect {
    match classify(sql) {
        Class::Begin { .. } => Effect::Begin,
        Class::Read => Effect::Read,
        Class::Primary(Why::Transaction) => {
            let mut words = parts(sql).filter_map(|p| if let Part::Word(w) = p { Some(w) } else { None });
            match (words.next(), words.next()) {
                (Some(w), _) if w.eq_ignore_ascii_case(b"commit") => Effect::Commit,
                (Some(w), next) if w.eq_ignore_ascii_case(b"rollback") && !next.is_some_and(|n| n.eq_ignore_ascii_case(b"to")) => {
                    Effect::Rollback
                }
                _ => Effect::Other,
            }
        }
        Class::Primary(Why::Write | Why::SideEffect | Why::Procedure | Why::Function | Why::Multi | Why::ServerSpecific) => Effect::Write,
        _ => Effect::Other,
    }
}

impl Effect {
    /// A statement that may take locks other sessions wait for: one that is not a plain read,
    /// a BEGIN or the end of a transaction.
    fn locks(self) -> bool {
        !matches!(self, Effect::Read | Effect::Begin | Effect::Commit | Effect::Rollback)
    }
}

/// What a command does to the order a replay keeps ([`super::order::Order`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Role {
    /// It may take locks: it waits for every release that ended before it did.
    pub takes: bool,
    /// It releases locks, or makes changes visible (ends a transaction, or writes outside one):
    /// it waits for every read that began before it did.
    pub releases: bool,
    /// A plain read.
    pub reads: bool,
}

/// Each command's role.
pub(super) fn roles(s: &Captured) -> Vec<Role> {
    let mut in_transaction = s.begin.as_ref().is_some_and(|(_, b)| b.in_transaction);
    let mut out = Vec::with_capacity(s.commands.len());
    for e in effects(s) {
        let takes = e.is_some_and(Effect::locks);
        let releases = match e {
            Some(Effect::Begin) => std::mem::replace(&mut in_transaction, true),
            Some(Effect::Commit | Effect::Rollback) => {
                in_transaction = false;
                true
            }
            _ => takes && !in_transaction,
        };
        out.push(Role { takes, releases, reads: e == Some(Effect::Read) });
    }
    out
}

/// What each command of a session runs (None for a command that runs no statement).
pub(super) fn effects(s: &Captured) -> Vec<Option<Effect>> {
    let mut texts: HashMap<u32, &[u8]> = HashMap::new();
    if let Some((_, b)) = &s.begin {
        texts.extend(b.prepared.iter().map(|(id, sql, _)| (*id, &sql[..])));
    }
    let mut out = Vec::with_capacity(s.commands.len());
    for c in &s.commands {
        if let (Some(&com::STMT_PREPARE), Some(sum)) = (c.payload.first(), c.captured) {
            texts.insert(sum.stmt_id, &c.payload[1..]);
        }
        out.push(super::statement_run(&c.payload, |id| texts.get(&id).copied()).map(effect));
    }
    out
}

/// A command's captured span, and the command that fixed its transaction's snapshot.
struct Span {
    session: u64,
    number: u64,
    start: u64,
    end: u64,
    /// It made a change visible to other sessions.
    visible: bool,
    /// The transaction's first statement began here, and its first read is this command
    /// (the span's own number while the transaction has read nothing yet).
    snapshot: Option<(u64, u64)>,
}

/// What the capture says about the order of commands, kept to judge the replay's outcomes.
pub struct Plan {
    spans: Vec<Span>,
}

/// A span in the capture (µs) and in the replay (ns from its start).
#[derive(Clone, Copy)]
struct Both {
    cap: (u64, u64),
    rep: (u64, u64),
}

impl Plan {
    pub fn new(sessions: &BTreeMap<u64, Captured>) -> Plan {
        let mut spans = Vec::new();
        for s in sessions.values() {
            let mut in_transaction = s.begin.as_ref().is_some_and(|(_, b)| b.in_transaction);
            // The open transaction's first statement began here; its first read was this one.
            let (mut first, mut read) = (None, None);
            for (c, e) in s.commands.iter().zip(effects(s)) {
                let (start, end) = (c.at_us, c.end_us());
                let e = e.unwrap_or(Effect::Other);
                let snapshot = first.map(|f| (f, read.unwrap_or(c.number)));
                let mut visible = false;
                match e {
                    Effect::Begin => (in_transaction, first, read) = (true, None, None),
                    Effect::Commit | Effect::Rollback => {
                        visible = e == Effect::Commit;
                        (in_transaction, first, read) = (false, None, None);
                    }
                    _ if !in_transaction => visible = e == Effect::Write,
                    _ => {
                        first.get_or_insert(start);
                        if e == Effect::Read && read.is_none() {
                            read = Some(c.number);
                        }
                    }
                }
                spans.push(Span { session: s.id, number: c.number, start, end, visible, snapshot });
            }
        }
        Plan { spans }
    }

    /// The commands (session, number) whose result may depend on the order the server gave
    /// overlapping commands, given when each ran in the replay (`replayed`: start and end, ns
    /// from the replay's start; commands not replayed are absent). Such a command, or the
    /// first read of its transaction:
    /// - overlapped in the capture a change another session made visible; or
    /// - ran in the replay in another order than in the capture against such a change (a wait
    ///   for the order cut short: the change ran early, or the command did).
    pub fn dependent(&self, replayed: &HashMap<(u64, u64), (u64, u64)>) -> HashSet<(u64, u64)> {
        let both = |s: &Span| replayed.get(&(s.session, s.number)).map(|&rep| Both { cap: (s.start, s.end), rep });
        let changes: Vec<(u64, Both)> = self.spans.iter().filter(|s| s.visible).filter_map(|s| Some((s.session, both(s)?))).collect();
        let index = Index::new(&changes);
        let by_number: HashMap<(u64, u64), &Span> = self.spans.iter().map(|s| ((s.session, s.number), s)).collect();
        let mut out = HashSet::new();
        for s in &self.spans {
            let Some(own) = both(s) else { continue };
            // The first read of its transaction: its capture span from the transaction's
            // first statement, its replay span its own.
            let snapshot = s.snapshot.and_then(|(first, read)| {
                let r = by_number.get(&(s.session, read)).and_then(|r| both(r))?;
                Some(Both { cap: (first, r.cap.1), rep: r.rep })
            });
            if index.unsettled(own, s.session) || snapshot.is_some_and(|b| index.unsettled(b, s.session)) {
                out.insert((s.session, s.number));
            }
        }
        out
    }
}

/// The visible changes, searchable by their captured spans: each question in O(log n).
struct Index {
    /// Captured starts, ascending.
    starts: Vec<u64>,
    /// Over the changes up to each (by captured start): the latest captured end, its session,
    /// and the latest end of any other session's.
    latest_end: Vec<(u64, u64, Option<u64>)>,
    /// Over the changes from each on (by captured start): the least replay start.
    least_rep_start: Vec<u64>,
    /// Captured ends, ascending, and over the changes up to each the greatest replay end.
    ends: Vec<u64>,
    most_rep_end: Vec<u64>,
}

impl Index {
    fn new(changes: &[(u64, Both)]) -> Index {
        let mut by_start: Vec<(u64, u64, u64, u64)> = changes.iter().map(|(s, b)| (b.cap.0, b.cap.1, *s, b.rep.0)).collect();
        by_start.sort_unstable();
        let mut latest_end = Vec::with_capacity(by_start.len());
        let mut acc: Option<(u64, u64, Option<u64>)> = None;
        for &(_, end, session, _) in &by_start {
            acc = Some(match acc {
                None => (end, session, None),
                Some((e, s, other)) if s == session => (e.max(end), s, other),
                // (The latest end so far is of another session than this one's.)
                Some((e, _, _)) if end > e => (end, session, Some(e)),
                Some((e, s, other)) => (e, s, Some(other.map_or(end, |o| o.max(end)))),
            });
            latest_end.push(acc.expect("set above"));
        }
        let mut least_rep_start: Vec<u64> = by_start.iter().map(|x| x.3).collect();
        for i in (0..least_rep_start.len().saturating_sub(1)).rev() {
            least_rep_start[i] = least_rep_start[i].min(least_rep_start[i + 1]);
        }
        let mut z: Vec<(u64, u64)> = changes.iter().map(|(_, b)| (b.cap.1, b.rep.1)).collect();
        z.sort_unstable();
        let mut most_rep_end: Vec<u64> = z.iter().map(|x| x.1).collect();
        for i in 1..most_rep_end.len() {
            most_rep_end[i] = most_rep_end[i].max(most_rep_end[i - 1]);
        }
        Index {
            starts: by_start.iter().map(|x| x.0).collect(),
            latest_end,
            least_rep_start,
            ends: z.into_iter().map(|x| x.0).collect(),
            most_rep_end,
        }
    }

    /// Whether a change of another session overlapped `b` in the capture, or ran in the replay
    /// on the other side of it. (A session's own commands run one after the other in both.)
    fn unsettled(&self, b: Both, session: u64) -> bool {
        self.overlapped(b.cap.0, b.cap.1, session) || self.reordered(b)
    }

    /// A change of another session began by `end` and ended at `start` or later.
    fn overlapped(&self, start: u64, end: u64, session: u64) -> bool {
        let n = self.starts.partition_point(|&s| s <= end);
        let Some(&(latest, of, other)) = n.checked_sub(1).and_then(|i| self.latest_end.get(i)) else { return false };
        if of != session { latest >= start } else { other.is_some_and(|o| o >= start) }
    }

    /// A change that began after `b` ended in the capture began before it ended in the replay,
    /// or one that ended before `b` began in the capture ended after it began in the replay.
    fn reordered(&self, b: Both) -> bool {
        let later = self.starts.partition_point(|&s| s <= b.cap.1);
        let earlier = self.ends.partition_point(|&e| e < b.cap.0);
        self.least_rep_start.get(later).is_some_and(|&r| r < b.rep.1) || (earlier > 0 && self.most_rep_end[earlier - 1] > b.rep.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::record::{Begin, Summary};
    use crate::replay::Command;

    fn query(number: u64, at_us: u64, latency_us: u64, sql: &str) -> Command {
        let mut payload = vec![com::QUERY];
        payload.extend_from_slice(sql.as_bytes());
        let captured = Some(Summary { latency_us, ..Summary::default() });
        Command { number, at_us, flags: 0, payload, captured }
    }

    fn session(id: u64, commands: Vec<Command>) -> (u64, Captured) {
        (id, Captured { id, begin: Some((0, Box::new(Begin::default()))), commands, gap: false })
    }

    #[test]
    fn commands_that_overlapped_or_were_reordered_against_another_sessions_commit_depend_on_order() {
        let sessions: BTreeMap<u64, Captured> = [
            // A transaction whose first read overlaps session 2's commit: all of it depends.
            session(
                1,
                vec![
                    query(1, 100, 10, "BEGIN"),
                    query(2, 120, 20, "SELECT c FROM t WHERE id = 1"),
                    query(3, 300, 10, "SELECT c FROM t WHERE id = 2"),
                    query(4, 400, 10, "COMMIT"),
                    // Outside a transaction, overlapping nothing: its own.
                    query(5, 600, 10, "SELECT 1"),
                    // Overlaps session 2's autocommitted write.
                    query(6, 700, 50, "SELECT c FROM t"),
                    // Overlaps a write inside session 2's transaction: not visible, not dependent.
                    query(7, 900, 50, "SELECT c FROM t"),
                ],
            ),
            session(
                2,
                vec![
                    query(1, 50, 10, "BEGIN"),
                    query(2, 60, 10, "UPDATE t SET c = 1 WHERE id = 1"),
                    query(3, 130, 5, "COMMIT"),
                    query(4, 720, 10, "DELETE FROM t WHERE id = 3"),
                    query(5, 880, 10, "BEGIN"),
                    query(6, 910, 10, "UPDATE t SET c = 2"),
                    query(7, 990, 10, "ROLLBACK"),
                ],
            ),
            // Captured after every other command ended.
            session(3, vec![query(1, 1100, 10, "INSERT INTO t VALUES (9)")]),
        ]
        .into_iter()
        .collect();
        // Replayed at the captured times (ns), but for session 3's write, which ran early:
        // before session 2's command 7 ended.
        let mut replayed: HashMap<(u64, u64), (u64, u64)> =
            sessions.values().flat_map(|s| s.commands.iter().map(|c| ((s.id, c.number), (c.at_us * 1000, c.end_us() * 1000)))).collect();
        replayed.insert((3, 1), (995_000, 996_000));
        let got = Plan::new(&sessions).dependent(&replayed);
        // (Session 1's COMMIT is in the transaction too; session 2 overlapped nothing that
        // session 1 made visible.)
        let want: HashSet<(u64, u64)> = [(1, 2), (1, 3), (1, 4), (1, 6), (2, 7)].into_iter().collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_command_that_ran_before_a_change_it_followed_in_the_capture_depends_on_order() {
        let sessions: BTreeMap<u64, Captured> =
            [session(1, vec![query(1, 500, 10, "SELECT 1")]), session(2, vec![query(1, 100, 10, "DELETE FROM t")])].into_iter().collect();
        let plan = Plan::new(&sessions);
        let mut replayed: HashMap<(u64, u64), (u64, u64)> =
            [((1, 1), (500_000, 510_000)), ((2, 1), (100_000, 110_000))].into_iter().collect();
        assert!(plan.dependent(&replayed).is_empty());
        // The select ran early, before the delete had ended.
        replayed.insert((1, 1), (105_000, 108_000));
        assert_eq!(plan.dependent(&replayed), [(1, 1)].into_iter().collect());
    }

    #[test]
    fn a_long_change_counts_for_the_other_sessions_only() {
        let both = |cap: (u64, u64)| Both { cap, rep: (cap.0 * 1000, cap.1 * 1000) };
        let index = Index::new(&[(1, both((0, 1000))), (2, both((10, 20))), (3, both((30, 40)))]);
        assert!(!index.overlapped(500, 600, 1), "its own long change, and others' ended before");
        assert!(index.overlapped(500, 600, 2));
        assert!(index.overlapped(15, 16, 1));
        assert!(index.overlapped(35, 50, 1));
        assert!(!index.overlapped(1001, 2000, 2));
    }
}

//! The order of commands across sessions in a replay.
//!
//! - A command waits until every command that had ended when it began (in the capture) has
//!   ended in the replay: what one session saw another do, it sees again.
//! - A command that may take locks also waits for every release of locks (the end of a
//!   transaction, or a write outside one) of another session that ended before it did. When it
//!   waited in the capture for a lock another transaction held, it ended after that transaction
//!   did; so the server takes conflicting locks in the capture's order. (Without it,
//!   conflicting commands that overlapped could take their locks the other way round and
//!   commit their changes in another order, which leaves rows with other values for every
//!   later read.)
//! - A release waits for every read that began before it did to end: those reads began
//!   before the change was made visible, and did not see it. A read waits for every release
//!   that began before it did: the server makes a commit visible early in the commit (before
//!   it flushes the log), so a read that began during one most likely saw it.
//!
//! A wait is for commands that ended, or began, earlier, and a session's commands follow one
//! another, so the waits form no cycle with each other. With the server's locks they can,
//! when a lock is taken that the capture did not have, or when two ends were captured too
//! close to tell their order; the caller breaks such a cycle (`run_in_order`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::overlap::Role;
use super::{Captured, Command};

/// The order the replay keeps.
pub struct Order {
    all: Ranks,
    releases: Ranks,
    /// Reads, by their captured starts.
    reads: Ranks,
    /// Releases, by their captured starts.
    release_starts: Ranks,
    /// Waits cut short.
    cut: AtomicU64,
}

/// Commands ranked by a captured time (their end, or start); `prefix` counts the ranks done
/// from the first on.
struct Ranks {
    /// Captured times, ascending.
    ends: Vec<u64>,
    done: parking_lot::Mutex<(Vec<bool>, usize)>,
    prefix: tokio::sync::watch::Sender<usize>,
}

impl Ranks {
    fn new(mut ends: Vec<u64>) -> Ranks {
        ends.sort_unstable();
        let n = ends.len();
        Ranks { ends, done: parking_lot::Mutex::new((vec![false; n], 0)), prefix: tokio::sync::watch::Sender::new(0) }
    }

    /// Waits until every command ranked before `us` is done.
    async fn before(&self, us: u64) {
        let need = self.ends.partition_point(|&e| e < us);
        let _ = self.prefix.subscribe().wait_for(|&p| p >= need).await;
    }

    fn done(&self, us: u64) {
        let mut g = self.done.lock();
        let (done, prefix) = &mut *g;
        // The first rank of this time not taken yet (equal times are interchangeable).
        let mut at = self.ends.partition_point(|&e| e < us);
        while at < done.len() && done[at] {
            at += 1;
        }
        if at < done.len() {
            done[at] = true;
        }
        let before = *prefix;
        while *prefix < done.len() && done[*prefix] {
            *prefix += 1;
        }
        if *prefix != before {
            self.prefix.send_replace(*prefix);
        }
    }
}

impl Order {
    /// `roles`: by session, each command's role (`overlap::roles`).
    pub fn new(sessions: &BTreeMap<u64, Captured>, roles: &BTreeMap<u64, Vec<Role>>) -> Order {
        let (mut all, mut releases, mut reads, mut release_starts) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for s in sessions.values() {
            for (c, role) in s.commands.iter().zip(&roles[&s.id]) {
                all.push(c.end_us());
                if role.releases {
                    releases.push(c.end_us());
                    release_starts.push(c.at_us);
                }
                if role.reads {
                    reads.push(c.at_us);
                }
            }
        }
        Order {
            all: Ranks::new(all),
            releases: Ranks::new(releases),
            reads: Ranks::new(reads),
            release_starts: Ranks::new(release_starts),
            cut: AtomicU64::new(0),
        }
    }

    /// Waits until the order lets `c` run, or `wait` passed; false when it gave up.
    pub async fn before(&self, c: &Command, role: Role, wait: Duration) -> bool {
        let all = async {
            self.all.before(c.at_us).await;
            if role.takes {
                self.releases.before(c.end_us()).await;
            }
            if role.releases {
                self.reads.before(c.at_us).await;
            }
            if role.reads {
                self.release_starts.before(c.at_us).await;
            }
        };
        tokio::time::timeout(wait, all).await.is_ok()
    }

    /// A command that ran from `at_us` to `end_us` in the capture is done (replayed, skipped or
    /// failed).
    pub fn done(&self, (at_us, end_us): (u64, u64), role: Role) {
        self.all.done(end_us);
        if role.releases {
            self.releases.done(end_us);
            self.release_starts.done(at_us);
        }
        if role.reads {
            self.reads.done(at_us);
        }
    }

    /// A wait was cut short, and the command ran anyway.
    pub fn count_cut(&self) {
        self.cut.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cut(&self) -> u64 {
        self.cut.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::record::{Begin, Summary};

    /// A command of `at_us` that lasted `latency_us`.
    fn cmd(number: u64, at_us: u64, latency_us: u64) -> Command {
        Command { number, at_us, flags: 0, payload: vec![3], captured: Some(Summary { latency_us, ..Summary::default() }) }
    }

    const READ: Role = Role { takes: false, releases: false, reads: true };
    const WRITE: Role = Role { takes: true, releases: false, reads: false };
    const COMMIT: Role = Role { takes: false, releases: true, reads: false };

    /// An order of one command per session, with these roles.
    fn order(commands: &[(&Command, Role)]) -> Order {
        let mut sessions = BTreeMap::new();
        let mut roles = BTreeMap::new();
        for (id, (c, role)) in commands.iter().enumerate() {
            let id = id as u64;
            let s = Captured { id, begin: Some((0, Box::new(Begin::default()))), commands: vec![(*c).clone()], gap: false };
            sessions.insert(id, s);
            roles.insert(id, vec![*role]);
        }
        Order::new(&sessions, &roles)
    }

    /// Whether `c` may run now (the clock is paused: a wait that is not over at once never is).
    async fn may_run(o: &Order, c: &Command, role: Role) -> bool {
        o.before(c, role, Duration::from_millis(1)).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_waits_for_those_that_ended_before_it_began() {
        let (first, overlapping, after) = (cmd(1, 0, 100), cmd(1, 50, 100), cmd(1, 200, 10));
        let o = order(&[(&first, READ), (&overlapping, READ), (&after, READ)]);
        assert!(may_run(&o, &first, READ).await);
        assert!(may_run(&o, &overlapping, READ).await, "it began before the first ended");
        assert!(!may_run(&o, &after, READ).await);
        o.done((first.at_us, first.end_us()), READ);
        assert!(!may_run(&o, &after, READ).await, "the overlapping one ended before it began too");
        o.done((overlapping.at_us, overlapping.end_us()), READ);
        assert!(may_run(&o, &after, READ).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waits_for_a_commit_that_ended_before_it_did() {
        // The write began while the commit ran, and ended after it: it waited for its lock.
        let (commit, write) = (cmd(9, 0, 100), cmd(1, 50, 200));
        let o = order(&[(&commit, COMMIT), (&write, WRITE)]);
        assert!(!may_run(&o, &write, WRITE).await);
        assert!(may_run(&o, &write, Role::default()).await, "a command that takes no lock and reads nothing waits for nothing here");
        o.done((commit.at_us, commit.end_us()), COMMIT);
        assert!(may_run(&o, &write, WRITE).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_began_during_a_commit_waits_for_it() {
        let (commit, read) = (cmd(9, 0, 300), cmd(1, 100, 50));
        let o = order(&[(&commit, COMMIT), (&read, READ)]);
        assert!(may_run(&o, &commit, COMMIT).await, "the read began after it");
        assert!(!may_run(&o, &read, READ).await);
        o.done((commit.at_us, commit.end_us()), COMMIT);
        assert!(may_run(&o, &read, READ).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_waits_for_the_reads_that_began_before_it() {
        let (read, commit) = (cmd(1, 0, 300), cmd(9, 100, 50));
        let o = order(&[(&read, READ), (&commit, COMMIT)]);
        assert!(!may_run(&o, &commit, COMMIT).await, "the read began first, and did not see the change");
        o.done((read.at_us, read.end_us()), READ);
        assert!(may_run(&o, &commit, COMMIT).await);
    }
}

//! What sluice's failover knows of the replication topology (`crate::control::failover` acts
//! on it): which backend is the primary, the last GTID position sluice saw it at, and the
//! operations made or refused (failovers, switchovers, rejoins).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sluice_proto::gtid::Position;

/// How many operations the admin API shows.
const EVENTS_KEPT: usize = 50;

#[derive(Default)]
pub struct Topology {
    inner: Mutex<Known>,
    /// One operation at a time: a failover, a switchover or a rejoin.
    pub busy: tokio::sync::Mutex<()>,
    /// While the primary changes (a switchover, a lost primary being replaced), users-mode
    /// sessions outside a transaction hold their next command ([`Topology::wait`]).
    held: AtomicBool,
    released: tokio::sync::Notify,
    /// Failover is on: a session that needs the primary waits for one rather than taking
    /// another backend (whose writes would fail, or, for a user with SUPER, diverge).
    strict: AtomicBool,
    /// With `[cluster]`, the instance elected to act on the topology (`crate::control::cluster`).
    lead: Mutex<Lead>,
}

/// The election's state, as this instance knows it.
#[derive(Default, Clone, Debug, serde::Serialize)]
pub struct Lead {
    /// The instance that holds the failover lease (this one or another), when known.
    pub leader: Option<String>,
    /// This instance acts until then: a margin before its lease could have expired in etcd.
    #[serde(skip)]
    pub until: Option<std::time::Instant>,
}

#[derive(Default, Clone)]
struct Known {
    /// The index of the backend sluice knows as the primary.
    primary: Option<usize>,
    /// Its `@@gtid_binlog_pos` at its last successful check.
    last_seen: Position,
    /// The history the primary took over at the last promotion: what it had of its
    /// predecessor's log then. A server whose transactions of another server go past it
    /// diverged.
    history: Option<Position>,
    events: VecDeque<Event>,
    /// The last refusal's text, so that one repeated each check is logged once.
    refused: Option<String>,
}

/// An operation on the topology and how it ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// "failover", "switchover" or "rejoin".
    pub operation: &'static str,
    /// "done", "refused", "failed" or "diverged".
    pub result: &'static str,
    /// The backend it was about (the one promoted, the one rejoined).
    pub backend: Option<String>,
    pub message: String,
    /// How long it took.
    pub took_ms: u64,
}

impl Topology {
    /// Sessions hold their next command from now on.
    pub fn hold(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    /// Sessions go on.
    pub fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
    }

    pub fn set_strict(&self, on: bool) {
        self.strict.store(on, Ordering::Relaxed);
    }

    pub fn is_strict(&self) -> bool {
        self.strict.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// Waits while sessions are held, for at most `limit`.
    pub async fn wait(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let released = self.released.notified();
            if !self.is_held() || tokio::time::Instant::now() >= deadline {
                return;
            }
            // (Bounded, in case the release came between the check and the wait.)
            let _ = tokio::time::timeout(Duration::from_millis(100), released).await;
        }
    }

    /// Whether this instance holds the failover lease now (and for a margin still).
    pub fn leads(&self) -> bool {
        self.lead.lock().until.is_some_and(|u| std::time::Instant::now() < u)
    }

    pub fn lead(&self) -> Lead {
        self.lead.lock().clone()
    }

    /// What the election says: who leads, and until when this instance does (None: it does not).
    pub fn set_lead(&self, leader: Option<String>, until: Option<std::time::Instant>) {
        *self.lead.lock() = Lead { leader, until };
    }

    pub fn primary(&self) -> Option<usize> {
        self.inner.lock().primary
    }

    /// `index` is the primary from now on.
    pub fn set_primary(&self, index: usize) {
        let mut k = self.inner.lock();
        k.primary = Some(index);
        k.refused = None;
    }

    /// `index` was promoted, holding `history` of its predecessor's log.
    pub fn promoted(&self, index: usize, history: Position) {
        self.set_primary(index);
        self.inner.lock().history = Some(history);
    }

    /// What the primary held of its predecessor's log when it was promoted (None: sluice
    /// promoted none).
    pub fn history(&self) -> Option<Position> {
        self.inner.lock().history.clone()
    }

    /// The primary's position when sluice last saw it.
    pub fn last_seen(&self) -> Position {
        self.inner.lock().last_seen.clone()
    }

    pub fn saw(&self, pos: Position) {
        self.inner.lock().last_seen = pos;
    }

    /// Records an operation. A refusal said the check before is not recorded again: returns
    /// whether it was recorded (and should be logged and counted).
    pub fn record(&self, e: Event) -> bool {
        let mut k = self.inner.lock();
        if e.result == "refused" || e.result == "diverged" {
            let text = format!("{}{:?}{}", e.operation, e.backend, e.message);
            if k.refused.as_ref() == Some(&text) {
                return false;
            }
            k.refused = Some(text);
        } else {
            k.refused = None;
        }
        if k.events.len() == EVENTS_KEPT {
            k.events.pop_front();
        }
        k.events.push_back(e);
        true
    }

    /// The operations recorded, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.inner.lock().events.iter().cloned().collect()
    }
}

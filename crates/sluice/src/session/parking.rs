//! Which idle sessions are asked to park.
//!
//! A session keeps its read buffers between commands (taking them from a pool at every command
//! would cost every query), and its task is sized for its busiest moment (a command in flight),
//! about 1 KB, with its socket's registration in tokio's reactor. Once a session has been idle
//! for a whole sweep interval, it is asked to park: every session then gives its read buffers
//! back, and a multiplexed session that holds no backend connection also leaves its task and
//! waits for its client in its worker's parking lot (`frontend/idle/lot.rs`; a TLS session in a
//! small task of its own, since rustls keeps the socket). Busy sessions are never asked, so
//! parking costs the relay nothing: the sweep compares the command counts it saw on its previous
//! round with the current ones.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The mark of a count already asked about.
const ASKED: u64 = 1 << 63;
/// The mark of a count seen while a command ran.
const BUSY: u64 = 1 << 62;

/// A session's parking state, in its handle.
#[derive(Default)]
pub struct Parking {
    /// The command count seen by the last sweep, with `BUSY` when a command was running then,
    /// `ASKED` once the session was asked at it.
    mark: AtomicU64,
    /// The session was asked to park and has not looked yet.
    asked: AtomicBool,
    /// The session is parked.
    pub parked: AtomicBool,
    /// It parks whenever it can (`proxy.park_every_command`, testing).
    always: AtomicBool,
}

impl Parking {
    /// One sweep's look at a session that has run `queries` commands and is `busy` (or not):
    /// true when it should be asked to park now, which happens once per idle stretch of at
    /// least a whole sweep interval.
    pub fn observe(&self, queries: u64, busy: bool) -> bool {
        let queries = queries & !(ASKED | BUSY);
        let mark = self.mark.load(Ordering::Relaxed);
        if busy {
            self.mark.store(queries | BUSY, Ordering::Relaxed);
            return false;
        }
        if mark != queries {
            // Commands ran, or one was running: the idle stretch begins now; or it was asked.
            if mark != queries | ASKED {
                self.mark.store(queries, Ordering::Relaxed);
            }
            return false;
        }
        self.mark.store(queries | ASKED, Ordering::Relaxed);
        self.asked.store(true, Ordering::Relaxed);
        true
    }

    /// Whether the session was asked to park (the asking also wakes it).
    #[inline]
    pub fn asked(&self) -> bool {
        self.asked.load(Ordering::Relaxed)
    }

    /// The session looked at the request (and parked, or could not).
    pub fn answered(&self) {
        if !self.always.load(Ordering::Relaxed) {
            self.asked.store(false, Ordering::Relaxed);
        }
    }

    /// Makes a session that may leave its task (a multiplexed one without compression) asked
    /// at every wait when `always`.
    pub fn allow(&self, always: bool) {
        self.always.store(always, Ordering::Relaxed);
        self.asked.store(always, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_asked_once_per_idle_stretch_of_a_whole_interval() {
        let p = Parking::default();
        // The first round only notes the count; the second sees it unchanged.
        assert!(!p.observe(5, false));
        assert!(p.observe(5, false));
        assert!(p.asked());
        p.answered();
        assert!(!p.observe(5, false), "asked once at this count");
        assert!(!p.observe(5, false));
        // Commands ran: a new stretch begins.
        assert!(!p.observe(6, false));
        assert!(p.observe(6, false));
        // A busy session is not asked, even with the same count (a long statement).
        p.answered();
        assert!(!p.observe(7, true));
        assert!(!p.observe(7, true));
        assert!(!p.observe(7, false), "the stretch starts when it is seen idle");
        assert!(p.observe(7, false));
    }
}

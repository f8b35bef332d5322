//! The log of a session's open transaction ([`TrxLog`]): its text statements and a checksum
//! of each result, which transaction replay (`retry.rs`) and optimistic transactions
//! (`optimistic.rs`) run again on another connection and compare.

use std::time::{Duration, Instant};

use crate::capture::sums::RowSums;
use crate::session::StateSink;

/// What a statement's result was, as replay compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Outcome {
    pub(super) error: Option<u16>,
    pub(super) rows: u64,
    affected: u64,
    sum: u64,
}

/// The statements of the session's open transaction.
#[derive(Default)]
pub(super) struct TrxLog {
    /// The requests' payloads (COM_QUERY and its text), back to back.
    pub(super) bytes: Vec<u8>,
    /// Where each ends in `bytes`, and its result once it came.
    pub(super) entries: Vec<(usize, Option<Outcome>)>,
    /// Why the transaction cannot be replayed (None: it can).
    pub(super) broken: Option<&'static str>,
    /// The row sums of the response being relayed (kept for the next one).
    pub(super) sums: Option<Box<RowSums>>,
    /// Recoveries of the command logged last (a command is not run again forever).
    pub(super) attempts: u8,
    /// A lost connection is recovered from (`transaction_replay`); else the log serves
    /// optimistic transactions alone.
    pub(super) on_loss: bool,
    /// A statement that may change data ran in the transaction: its COMMIT matters.
    pub(super) wrote: bool,
    /// The command logged last is a COMMIT of such a transaction (its mark is due).
    pub(super) committing: bool,
    /// The mark written for the COMMIT in flight (its sequence number).
    pub(super) mark: Option<u64>,
    /// The session's row in the commit table.
    pub(super) marks: Marks,
}

/// How many times one command is run again.
pub(super) const ATTEMPTS: u8 = 3;

impl TrxLog {
    pub(super) fn new(on_loss: bool) -> TrxLog {
        TrxLog { on_loss, ..TrxLog::default() }
    }

    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.entries.clear();
        self.broken = None;
        self.wrote = false;
        self.committing = false;
        self.mark = None;
    }

    /// Notes the result of the command logged last, from the sink that followed its response
    /// (`shared`: a capture records it too, and takes the sums).
    pub(super) fn noted(&mut self, sink: &mut StateSink<'_>, shared: bool) {
        let outcome = outcome_of(sink);
        self.attempts = 0;
        self.mark = None;
        if !shared {
            self.sums = sink.sums.take();
            if let Some(s) = self.sums.as_mut() {
                s.finish(); // (back to none, for the next response)
            }
        }
        if let Some(last) = self.entries.last_mut() {
            last.1 = Some(outcome);
        }
    }

    pub(super) fn request(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.entries[i - 1].0 };
        &self.bytes[start..self.entries[i].0]
    }
}

/// What a response was, from the sink that followed it.
pub(super) fn outcome_of(sink: &mut StateSink<'_>) -> Outcome {
    let sum = sink.sums.as_mut().map_or(0, |s| s.current());
    Outcome { error: sink.error, rows: sink.rows, affected: sink.affected, sum }
}

/// After a mark could not be written, how long the session's COMMITs go unmarked (the table
/// may not be made yet, or the user lack its grants: a failed try costs a round trip).
const PAUSE: Duration = Duration::from_secs(60);

/// A session's row in the commit table.
#[derive(Default)]
pub(super) struct Marks {
    /// Its random key, drawn at the first mark.
    key: Option<[u8; 16]>,
    /// The sequence number of the last mark.
    seq: u64,
    /// Writing a mark failed: none is written before then.
    paused_until: Option<Instant>,
    /// That was said in the log (once per session).
    said: bool,
}

impl Marks {
    /// Whether the next COMMIT is marked.
    pub(super) fn on(&self) -> bool {
        self.paused_until.is_none_or(|t| Instant::now() >= t)
    }

    /// Writing a mark failed: none is written for a while. Whether to say so.
    pub(super) fn pause(&mut self) -> bool {
        self.paused_until = Some(Instant::now() + PAUSE);
        !std::mem::replace(&mut self.said, true)
    }

    /// The key and sequence number of the next mark (None when no key can be drawn).
    pub(super) fn next(&mut self) -> Option<([u8; 16], u64)> {
        if self.key.is_none() {
            let mut k = [0u8; 16];
            aws_lc_rs::rand::fill(&mut k).ok()?;
            self.key = Some(k);
        }
        self.seq += 1;
        Some((self.key?, self.seq))
    }

    /// The key and sequence number of the mark `seq`.
    pub(super) fn of(&self, seq: u64) -> Option<([u8; 16], u64)> {
        Some((self.key?, seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_each_request_apart() {
        let mut log = TrxLog::default();
        for r in [&b"\x03BEGIN"[..], b"\x03UPDATE t SET a = 1"] {
            log.bytes.extend_from_slice(r);
            log.entries.push((log.bytes.len(), None));
        }
        assert_eq!(log.request(0), b"\x03BEGIN");
        assert_eq!(log.request(1), b"\x03UPDATE t SET a = 1");
        log.clear();
        assert!(log.entries.is_empty() && log.bytes.is_empty());
    }

    #[test]
    fn a_failed_mark_pauses_marking_and_is_said_once() {
        let mut m = Marks::default();
        assert!(m.on());
        assert!(m.pause());
        assert!(!m.on());
        assert!(!m.pause(), "said once");
        m.paused_until = Some(Instant::now());
        assert!(m.on(), "on again once the pause is over");
    }
}

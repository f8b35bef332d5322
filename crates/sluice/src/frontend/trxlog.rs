//! The log of a session's open transaction ([`TrxLog`]): its text statements and a checksum
//! of each result, which transaction replay (`retry.rs`) and optimistic transactions
//! (`optimistic.rs`) run again on another connection and compare.

use crate::capture::sums::RowSums;
use crate::session::StateSink;

/// What a statement's result was, as replay compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Outcome {
    error: Option<u16>,
    rows: u64,
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
    }

    /// Notes the result of the command logged last, from the sink that followed its response
    /// (`shared`: a capture records it too, and takes the sums).
    pub(super) fn noted(&mut self, sink: &mut StateSink<'_>, shared: bool) {
        let outcome = outcome_of(sink);
        self.attempts = 0;
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
}

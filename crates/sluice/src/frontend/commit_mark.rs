//! Commit marks (`[routing] commit_table`): just before the COMMIT of a transaction that may
//! have changed data, a replaying session writes its row in the commit table (its random key,
//! the transaction's sequence number), in the transaction. The row commits with it or not at
//! all. When the COMMIT's connection is lost before its answer, the session looks the row up
//! on the primary with a locking read: one that waits for the lost transaction while a server
//! still holds it (the same primary, its connection not yet closed there), and reads what the
//! new primary applied after a failover (it applies nothing from the old one once writable).
//! Found: the transaction committed, and the client gets the COMMIT's OK. Not found: it did
//! not, and it is replayed and committed. The lookup failing: the outcome is unknown (1180).
//! A mark that cannot be written (no table yet, no grants) leaves the session's COMMITs
//! unmarked for a minute.

use std::fmt::Write;
use std::sync::Arc;

use sluice_proto::consts::err as code;
use sluice_proto::rw::{Class, Why};

use super::session::{Flow, Session};
use crate::config::RoutingConfig;
use crate::error::{Result, Side};

/// Whether a statement of this class may change data (a COMMIT after it matters).
pub(super) fn may_write(class: Class) -> bool {
    use Why::*;
    matches!(class, Class::Primary(w) if !matches!(w, Transaction | LockingRead | Into | LastInsertId | UserVariable | ServerSpecific))
}

/// What a lookup found of a lost COMMIT.
pub(super) enum Found {
    Committed,
    NotCommitted,
    /// The lookup failed: the outcome is unknown.
    Unknown(String),
}

/// A COM_QUERY payload for the mark `(key, seq)` in `table`.
fn statement(table: &str, (key, seq): ([u8; 16], u64), write: bool) -> Vec<u8> {
    let table = RoutingConfig::quote_table(table);
    let mut hex = String::with_capacity(2 * key.len());
    for b in key {
        let _ = write!(hex, "{b:02x}");
    }
    let key = hex;
    let sql = match write {
        true => format!("INSERT INTO {table} (id, seq) VALUES (0x{key}, {seq}) ON DUPLICATE KEY UPDATE seq = VALUES(seq)"),
        false => format!("SELECT 1 FROM {table} WHERE id = 0x{key} AND seq = {seq} FOR UPDATE"),
    };
    let mut payload = Vec::with_capacity(sql.len() + 1);
    payload.push(sluice_proto::consts::com::QUERY);
    payload.extend_from_slice(sql.as_bytes());
    payload
}

impl Session {
    /// Whether the command logged last is a COMMIT whose mark is due.
    #[inline]
    pub(super) fn commit_mark_due(&self) -> bool {
        self.route.replay.as_ref().is_some_and(|l| l.committing)
    }

    /// Writes the session's mark in the transaction before its COMMIT is forwarded. None: the
    /// COMMIT goes on (marked, or not when the mark could not be written); Some: the server
    /// ended the transaction while the mark was written, and the client was told so, or the
    /// connection was lost and recovered from (as the COMMIT's loss would be).
    pub(super) async fn mark_commit(&mut self) -> Result<Option<Flow>> {
        match self.write_mark().await {
            Err(e) if e.side == Side::Backend => Box::pin(self.recover(e, false)).await.map(Some),
            r => r,
        }
    }

    async fn write_mark(&mut self) -> Result<Option<Flow>> {
        let config = Arc::clone(&self.config);
        let Some(table) = config.routing.commit_table.as_deref() else { return Ok(None) };
        let log = self.route.replay.as_mut().expect("a logged COMMIT");
        log.committing = false;
        let Some(mark) = log.marks.next() else {
            log.marks.pause();
            return Ok(None);
        };
        log.mark = Some(mark.1);
        let outcome = self.run_again(&statement(table, mark, true)).await?;
        let Some(error) = outcome.error else { return Ok(None) };
        let say = self.route.replay.as_mut().is_some_and(|log| {
            log.mark = None;
            log.marks.pause()
        });
        if say {
            tracing::warn!(
                session = self.handle.id,
                table,
                error,
                "the commit table could not be written: this session's lost COMMITs stay unknown for a minute"
            );
        }
        // An error may have rolled the transaction back (a deadlock): its status says.
        self.run_again(b"\x03DO 0").await?;
        if self.state.in_transaction() {
            return Ok(None);
        }
        let msg = format!("sluice: the transaction was rolled back by the server (error {error}) before its COMMIT");
        Ok(Some(self.fail_transaction(code::LOCK_DEADLOCK, b"40001", &msg, false).await?))
    }

    /// Looks up the mark `seq` of a COMMIT whose connection was lost, on a new connection to
    /// the primary (which the session then keeps).
    pub(super) async fn look_up_commit(&mut self, seq: u64) -> Result<Found> {
        let config = Arc::clone(&self.config);
        let table = config.routing.commit_table.as_deref().unwrap_or_default();
        let Some(mark) = self.route.replay.as_ref().and_then(|l| l.marks.of(seq)) else {
            return Ok(Found::Unknown("the session has no commit mark".into()));
        };
        if let Err(e) = self.reconnect_for_replay().await {
            return Ok(Found::Unknown(format!("no primary took the session again: {}", e.message)));
        }
        let outcome = self.run_again(&statement(table, mark, false)).await?;
        Ok(match (outcome.error, outcome.rows) {
            (Some(e), _) => Found::Unknown(format!("looking up its commit mark failed with error {e}")),
            (None, 0) => Found::NotCommitted,
            (None, _) => Found::Committed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_written_and_looked_up_by_key_and_sequence() {
        let mut m = super::super::trxlog::Marks::default();
        let (key, seq) = m.next().expect("a key");
        assert_eq!(seq, 1);
        assert_eq!(m.next().map(|(k, s)| (k == key, s)), Some((true, 2)));
        let w = statement("s.c", ([0xab; 16], 7), true);
        let w = String::from_utf8(w[1..].to_vec()).unwrap();
        assert_eq!(w, format!("INSERT INTO `s`.`c` (id, seq) VALUES (0x{}, 7) ON DUPLICATE KEY UPDATE seq = VALUES(seq)", "ab".repeat(16)));
        let r = statement("s.c", ([1; 16], 7), false);
        assert!(r[1..].ends_with(b"AND seq = 7 FOR UPDATE"));
    }

    #[test]
    fn only_statements_that_may_change_data_make_a_commit_matter() {
        use sluice_proto::rw::classify;
        for (sql, want) in [
            ("UPDATE t SET a = 1", true),
            ("INSERT INTO t VALUES (1)", true),
            ("CALL p()", true),
            ("SELECT a FROM t", false),
            ("SELECT a FROM t FOR UPDATE", false),
            ("BEGIN", false),
            ("SET @a = 1", false),
        ] {
            assert_eq!(may_write(classify(sql.as_bytes())), want, "{sql}");
        }
    }
}

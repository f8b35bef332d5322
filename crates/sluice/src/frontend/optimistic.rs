//! Optimistic transactions (`[routing] optimistic_transactions`, with the split): a
//! transaction, and with autocommit off every implicit one, begins on a replica. Its statements
//! and a checksum of each result are logged as transaction replay logs them (`retry.rs`). At
//! its first statement for the primary (a write), the replica's transaction is rolled back, the
//! logged statements run again on the primary, and when every result is the same the statement
//! goes on there. When one differs (the replica was behind, or another client wrote in
//! between), the transaction is rolled back and the client gets error 1213 (SQLSTATE 40001),
//! as for a replayed transaction that diverged. A transaction that ends on the replica (it only
//! read) never touches the primary.

use sluice_proto::consts::{com, err as code, status};
use sluice_proto::rw::Class;
use sluice_proto::sql::TransactionEnd;

use super::session::{Flow, Session};
use super::split::Target;
use crate::config::Role;
use crate::error::Result;
use crate::metrics::Split;

impl Session {
    /// Where a statement of class `class` goes under optimistic transactions (`text`: a
    /// query's); None: where the split says.
    pub(super) fn optimistic_target(&self, cmd: u8, class: Class, text: Option<&[u8]>) -> Option<(Target, Split)> {
        if self.on_replica() {
            // (A COMMIT, a ROLLBACK or a savepoint stays on the replica: the transaction only read.)
            let ends = cmd == com::QUERY && text.is_some_and(|t| sluice_proto::sql::transaction_end(t) != TransactionEnd::No);
            return Some(match class {
                Class::Read | Class::Session | Class::Previous => (Target::Current, Split::Optimistic),
                _ if ends => (Target::Current, Split::Optimistic),
                _ => (Target::Primary, Split::Optimistic),
            });
        }
        if self.state.in_transaction() {
            return None;
        }
        match class {
            Class::Begin { .. } => Some((Target::Replica, Split::Optimistic)),
            Class::Read if self.state.status & status::AUTOCOMMIT == 0 => Some((Target::Replica, Split::Optimistic)),
            _ => None,
        }
    }

    /// Whether an optimistic transaction is open on a replica now.
    #[inline]
    pub(super) fn on_replica(&self) -> bool {
        self.route.optimistic
            && self.state.in_transaction()
            && !self.backend.conn.is_detached()
            && self.backend.lost.is_none()
            && self.backend.guard.serves_as() == Role::Replica
    }

    /// The optimistic transaction's first statement for the primary: the transaction moves
    /// there (None: the statement goes on), or the client gets the error for the statement
    /// (Some), the transaction rolled back.
    pub(super) async fn move_to_primary(&mut self) -> Result<Option<Flow>> {
        let from = self.backend.guard.name.clone();
        if self.backend.lost.is_none() && !self.backend.conn.is_detached() {
            // (It only read: what it held there is let go of.)
            self.run_again(b"\x03ROLLBACK").await?;
            self.detach();
        }
        let broken = self.route.replay.as_ref().and_then(|l| l.broken);
        let failed = match broken {
            Some(why) => Some((code::LOCK_DEADLOCK, *b"40001", "optimistic_failed", format!("where it cannot run again: {why}"))),
            None => self.resume_transaction(false).await?,
        };
        let Some((code, state, result, why)) = failed else {
            self.ctx.metrics.replayed("optimistic");
            return Ok(None);
        };
        self.ctx.metrics.replayed(if result == "diverged" { "optimistic_diverged" } else { "optimistic_failed" });
        let msg = format!("sluice: the transaction began on replica {from} and moved to the primary at its first write, {why}");
        self.fail_transaction(code, &state, &msg, false).await.map(Some)
    }
}

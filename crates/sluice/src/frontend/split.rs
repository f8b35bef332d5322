//! The read/write split (`[routing] split`, users mode). A split session multiplexes: between
//! statements it holds no connection, and each statement takes one where it should run. Reads
//! that sluice is sure of (`sluice_proto::rw`) go to a replica fit for reads, balanced; the rest
//! goes to the primary; session state (`SET`, `USE`) and what reads the previous statement's
//! result stay where the session is. The connection taken is brought to the session's state
//! as multiplexing does (schema, character set, variables; prepared statements prepared again
//! on first use there), so state changes reach every connection the session uses.
//!
//! A session that holds a connection (a transaction, a pin) runs its statements there; the
//! transaction began on the primary. One held on a replica only until the next statement
//! (warnings, `FOUND_ROWS()`) lets it go when that statement must run on the primary.

use sluice_proto::consts::{com, status};
use sluice_proto::packet::HEADER;
use sluice_proto::rw::{Class, Why, classify};

use super::relay::Session;
use crate::backend::balance::Want;
use crate::config::{ReadOnlyTransactions, Role};
use crate::error::Result;
use crate::metrics::Split;

/// Where a statement of a split session should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    Replica,
    Primary,
    /// Where the session is.
    Current,
}

impl Session<'_> {
    /// Where the command about to run should go, and why (None: no statement, it stays where
    /// the session is).
    pub(super) fn wants(&self, cmd: u8, body_end: usize) -> Option<(Target, Split)> {
        let text = match cmd {
            com::QUERY | com::STMT_PREPARE => self.client.rbuf.get(HEADER + 1..body_end)?,
            com::STMT_EXECUTE | com::STMT_SEND_LONG_DATA | com::STMT_RESET => {
                let id = self.client.rbuf.get(HEADER + 1..HEADER + 5)?;
                let id = u32::from_le_bytes([id[0], id[1], id[2], id[3]]);
                self.state.prepared.get(&id)?.sql.as_bytes()
            }
            _ => return None,
        };
        // A statement longer than what is read before forwarding is not seen whole.
        let class = if body_end >= HEADER + super::relay::INSPECT_LIMIT { Class::Primary(Why::Write) } else { classify(text) };
        if self.state.status & status::AUTOCOMMIT == 0 && !matches!(class, Class::Session | Class::Previous) {
            // Every statement may begin a transaction, which must be the primary's.
            return Some((Target::Primary, Split::AutocommitOff));
        }
        Some(match class {
            Class::Read => (Target::Replica, Split::Read),
            Class::Begin { read_only: true } if self.ctx.config.routing.read_only_transactions == ReadOnlyTransactions::Replica => {
                (Target::Replica, Split::ReadOnlyTransaction)
            }
            Class::Begin { .. } => (Target::Primary, Split::Begin),
            Class::Session | Class::Previous => (Target::Current, Split::Current),
            Class::Primary(why) => (Target::Primary, Split::Primary(why as u8)),
        })
    }

    /// Binds a session that holds no connection to the backend its next statement should run
    /// on: a replica fit for reads (the balancer's choice at every read), else the primary.
    pub(super) fn aim(&mut self, target: Target, why: Split) {
        let here = &self.guard;
        let (b, why) = match target {
            Target::Current if here.is_usable() => return self.ctx.metrics.split(why),
            Target::Replica => match self.ctx.backends.balancer.pick(&self.ctx.backends, &[], Want::Reads) {
                Some(b) => (b, why),
                None => match self.primary() {
                    Some(b) => (b, Split::NoReplica),
                    None => return self.ctx.metrics.split(Split::NoReplica),
                },
            },
            _ => match self.primary() {
                Some(b) => (b, why),
                None => return self.ctx.metrics.split(why),
            },
        };
        self.ctx.metrics.split(why);
        if b.index != self.guard.index {
            self.guard = b.bind();
            self.handle.bind_backend(b.index, &b.name, 0);
        }
    }

    /// The primary: the session's backend when it is one and usable, else the balancer's choice
    /// (None: no backend is usable).
    fn primary(&self) -> Option<std::sync::Arc<crate::backend::Backend>> {
        if self.guard.is_usable() && self.guard.serves_as() == Role::Primary {
            return Some(self.guard.0.clone());
        }
        self.ctx.backends.balancer.pick(&self.ctx.backends, &[], Want::Primary)
    }

    /// Whether the session holds a connection to a replica that it may let go of for a
    /// statement bound for the primary: nothing holds it there beyond the statement before.
    pub(super) fn leaves_replica(&self, target: Target) -> bool {
        target == Target::Primary
            && !self.backend.is_detached()
            && self.lost.is_none()
            && self.guard.serves_as() == Role::Replica
            && self.state.movable()
    }

    /// Lets go of a replica connection before a statement for the primary: the user variables
    /// that statements named are read back first (a value sluice cannot carry keeps it there,
    /// and the statement runs on the replica, which answers for itself).
    pub(super) async fn leave_replica(&mut self) -> Result<()> {
        if !self.state.unread_variables.is_empty() {
            self.read_back().await?;
            if !self.state.movable() {
                return Ok(());
            }
        }
        self.detach();
        Ok(())
    }
}

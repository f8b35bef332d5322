//! The read/write split (`[routing] split`, users mode). A split session multiplexes: between
//! statements it holds no connection, and each statement takes one where it should run. Reads
//! that sluice is sure of (`sluice_proto::rw`) go to a replica fit for reads, balanced; the rest
//! goes to the primary; session state (`SET`, `USE`) and what reads the previous statement's
//! result stay where the session is. The connection taken is brought to the session's state
//! as multiplexing does (schema, character set, variables; prepared statements prepared again
//! on first use there), so state changes reach every connection the session uses.
//!
//! Causal reads (`causal_reads = "session"`): a read sent to a replica after the session wrote
//! is preceded, in the same round trip, by `MASTER_GTID_WAIT` for the write's GTID (MariaDB
//! reports it through session tracking as `last_gtid`); when the wait runs out the replica's
//! answer is dropped and the read runs on the primary. With "global" the wait is for the
//! latest GTID of each domain that any session wrote through sluice (`crate::route::gtid`).
//!
//! A session that holds a connection (a transaction, a pin) runs its statements there; the
//! transaction began on the primary. One held on a replica only until the next statement
//! (warnings, `FOUND_ROWS()`) lets it go when that statement must run on the primary.

use sluice_proto::consts::{com, status};
use sluice_proto::packet::HEADER;
use sluice_proto::rw::{Class, Why};

use sluice_proto::response::Expect;

use super::session::Session;
use crate::backend::balance::Want;
use crate::backend::restore;
use crate::config::{CausalReads, ReadOnlyTransactions, Role};
use crate::error::{Error, Result, Side};
use crate::metrics::Split;
use crate::route::rules::RouteTo;

fn replica_bit(index: usize) -> u64 {
    1 << (index % 64)
}

/// Where a statement of a split session should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    Replica,
    Primary,
    /// Where the session is.
    Current,
    /// One of these backends (bits by index), as a rule says.
    Among(u64),
}

impl Session {
    /// Where the command about to run should go, and why (None: no statement, it stays where
    /// the session is).
    /// `route`: where a query rule or a comment says it should run, which wins over the
    /// classification except for session state, what the previous statement left, and a
    /// session with autocommit off.
    /// `read`: the class, when the statement's text was read already.
    pub(super) fn wants(&self, cmd: u8, body_end: usize, route: Option<RouteTo>, read: Option<Class>) -> Option<(Target, Split)> {
        let class = match cmd {
            // A statement longer than what is read before forwarding is not seen whole.
            com::QUERY | com::STMT_PREPARE if body_end >= HEADER + super::session::INSPECT_LIMIT => Class::Primary(Why::Write),
            com::QUERY | com::STMT_PREPARE if read.is_some() => read?,
            com::QUERY | com::STMT_PREPARE => {
                let text = self.client.rbuf.get(HEADER + 1..body_end)?;
                sluice_proto::rw::classify_in(text, self.state.mode_for(text))
            }
            // (Classified once, when it was prepared.)
            com::STMT_EXECUTE | com::STMT_SEND_LONG_DATA | com::STMT_RESET => {
                let id = self.client.rbuf.get(HEADER + 1..HEADER + 5)?;
                self.state.prepared.get(&u32::from_le_bytes([id[0], id[1], id[2], id[3]]))?.class
            }
            _ => return None,
        };
        if self.route.optimistic
            && let Some(to) = self.optimistic_target(cmd, class, self.client.rbuf.get(HEADER + 1..body_end))
        {
            return Some(to);
        }
        if self.state.status & status::AUTOCOMMIT == 0 && !matches!(class, Class::Session | Class::Previous) {
            // Every statement may begin a transaction, which must be the primary's.
            return Some((Target::Primary, Split::AutocommitOff));
        }
        if let Some(r) = route
            && !matches!(class, Class::Session | Class::Previous)
        {
            let to = match r {
                RouteTo::Primary => Target::Primary,
                RouteTo::Replica => Target::Replica,
                RouteTo::Among(m) => Target::Among(m),
            };
            return Some((to, Split::Rule));
        }
        if !self.route.split {
            return None;
        }
        Some(match class {
            Class::Read => (Target::Replica, Split::Read),
            Class::Begin { read_only: true } if self.config.routing.read_only_transactions == ReadOnlyTransactions::Replica => {
                (Target::Replica, Split::ReadOnlyTransaction)
            }
            Class::Begin { .. } => (Target::Primary, Split::Begin),
            Class::Session | Class::Previous => (Target::Current, Split::Current),
            Class::Primary(why) => (Target::Primary, Split::Primary(why as u8)),
        })
    }

    /// Binds a session that holds no connection to the backend its next statement should run
    /// on: a replica fit for reads (the balancer's choice at every read), else the primary.
    /// With causal reads, a read after the session's last write waits on the replica first
    /// (`query`: a text query, which can; a prepared statement goes to the primary instead).
    pub(super) fn aim(&mut self, target: Target, why: Split, query: bool) {
        let usable_here = self.backend.guard.is_usable();
        let (b, why) = match target {
            Target::Current if usable_here => return self.ctx.metrics.split(why),
            Target::Replica => match self.ctx.backends.balancer.pick(&self.ctx.backends, &[], Want::Reads) {
                Some(b) if !self.must_wait(&b) => (b, why),
                Some(b) if query => {
                    self.route.causal.get_or_insert_with(Default::default).due = true;
                    (b, why)
                }
                found => match self.primary() {
                    Some(p) => (p, if found.is_some() { Split::Causal } else { Split::NoReplica }),
                    None => return self.ctx.metrics.split(Split::NoReplica),
                },
            },
            Target::Among(mask) => match self.ctx.backends.balancer.pick(&self.ctx.backends, &[], Want::Among(mask)) {
                Some(b) => (b, why),
                None => return self.ctx.metrics.split(why),
            },
            _ => match self.primary() {
                Some(b) => (b, why),
                None => return self.ctx.metrics.split(why),
            },
        };
        self.ctx.metrics.split(why);
        self.bind_to(&b);
    }

    pub(super) fn bind_to(&mut self, b: &std::sync::Arc<crate::backend::Backend>) {
        if b.index != self.backend.guard.index {
            self.backend.guard = b.bind();
            self.handle.bind_backend(b.index, &b.name, 0);
        }
    }

    /// Causal reads: whether replica `b` may not have applied the write the read must see yet
    /// (the session's last, or the latest through sluice with "global"): it has not waited for
    /// it there since that write.
    fn must_wait(&mut self, b: &crate::backend::Backend) -> bool {
        let mode = self.config.routing.causal_reads;
        if mode == CausalReads::None || (mode == CausalReads::Session && self.state.last_gtid.is_empty()) {
            return false;
        }
        let c = self.route.causal.get_or_insert_with(Default::default);
        let changed = match mode {
            CausalReads::Global => self.ctx.latest_writes.refresh(&mut c.gtid),
            _ if c.gtid != self.state.last_gtid => {
                c.gtid.clone_from(&self.state.last_gtid);
                true
            }
            _ => false,
        };
        if changed {
            c.seen = 0;
        }
        !c.gtid.is_empty() && c.seen & replica_bit(b.index) == 0
    }

    /// Global causal reads: the session's write is recorded for every session's reads (after
    /// a statement whose answer reported variables, `last_gtid` among them).
    pub(super) fn note_write(&self) {
        if self.config.routing.causal_reads == CausalReads::Global && !self.state.last_gtid.is_empty() {
            self.ctx.latest_writes.note(&self.state.last_gtid);
        }
    }

    /// Whether the statement about to be forwarded must be preceded by a causal read's wait.
    #[inline]
    pub(super) fn causal_due(&self) -> bool {
        self.route.causal.as_ref().is_some_and(|c| c.due)
    }

    /// Sends `MASTER_GTID_WAIT` for the session's last write to the replica, just before the
    /// statement (one round trip for both). Returns a copy of the statement (of `len` bytes, its
    /// header included), to run on the primary if the wait runs out; None: no wait was sent.
    pub(super) async fn send_causal_wait(&mut self, len: usize) -> Result<Option<Vec<u8>>> {
        if let Some(c) = self.route.causal.as_mut() {
            c.due = false;
        }
        let Some(gtid) = self.route.causal.as_ref().map(|c| &c.gtid) else { return Ok(None) };
        // (A GTID list is digits, '-' and ','; anything else is not put into SQL.)
        let copy = self.client.rbuf.get(..len).map(<[u8]>::to_vec);
        if copy.is_none() || !gtid.bytes().all(|b| b.is_ascii_digit() || b == b'-' || b == b',') {
            return Ok(None);
        }
        let timeout = self.config.routing.causal_reads_timeout.as_secs_f64();
        let body = format!("\u{3}SELECT MASTER_GTID_WAIT('{gtid}', {timeout})");
        let mut packet = Vec::with_capacity(body.len() + HEADER);
        sluice_proto::packet::frame(&mut packet, body.as_bytes(), 0);
        let limit = self.config.proxy.response_timeout;
        self.backend
            .conn
            .stream
            .write_within(limit, &packet)
            .await
            .map_err(|e| Error::io(Side::Backend, "sending a causal read's wait", e))?;
        Ok(copy)
    }

    /// Reads the wait's answer. The replica has the write: the statement's answer follows, as
    /// usual. It has not: that answer is dropped, and the statement (`copy`) runs on the primary.
    pub(super) async fn causal_outcome(&mut self, copy: Vec<u8>, expect: Expect) -> Result<()> {
        let caps = self.backend_caps();
        let answer = restore::read_text_result(&mut self.backend.conn, caps, "a causal read's wait").await?;
        // The row: "0", a length-encoded string.
        if matches!(&answer[..], [_, _, row] if row.as_slice() == b"\x010") {
            let bit = replica_bit(self.backend.guard.index);
            if let Some(c) = self.route.causal.as_mut() {
                c.seen |= bit;
            }
            return Ok(());
        }
        restore::discard_response(&mut self.backend.conn, caps, expect).await?;
        self.ctx.metrics.split(Split::Causal);
        self.detach();
        if let Some(p) = self.primary() {
            self.bind_to(&p);
        }
        if let Err(found) = self.attach_at_once() {
            self.attach(found).await?;
        }
        let limit = self.config.proxy.response_timeout;
        self.backend.conn.stream.write_within(limit, &copy).await.map_err(|e| Error::io(Side::Backend, "forwarding a causal read", e))
    }

    /// The primary: the session's backend when it is one and usable, else the balancer's choice
    /// (None: no backend is usable).
    fn primary(&self) -> Option<std::sync::Arc<crate::backend::Backend>> {
        if self.backend.guard.is_usable() && self.backend.guard.serves_as() == Role::Primary {
            return Some(self.backend.guard.0.clone());
        }
        self.ctx.backends.balancer.pick(&self.ctx.backends, &[], Want::Primary)
    }

    /// Whether the session holds a connection to a replica that it may let go of for a
    /// statement bound for the primary: nothing holds it there beyond the statement before, or
    /// an optimistic transaction, which moves to the primary.
    pub(super) fn leaves_replica(&self, target: Target) -> bool {
        target == Target::Primary
            && !self.backend.conn.is_detached()
            && self.backend.lost.is_none()
            && self.backend.guard.serves_as() == Role::Replica
            && (self.on_replica() || self.state.movable())
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

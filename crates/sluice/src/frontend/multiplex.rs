//! A users-mode session changing backend connections. Sluice holds the session's credentials
//! and its state (`SessionState`), so it can log in again elsewhere and bring a connection to
//! that state (`backend::restore`): the schema, the variables the backend reported changed, the
//! multi-statements option, the last insert id; prepared statements are prepared again on their
//! first use on the new connection, and the client keeps its statement ids (mapped from then on).
//!
//! - **Multiplexing**: at every safe point (no pin, `SessionState::detachable`) the session gives
//!   its connection back to its backend's shared connections and takes one of the same key at
//!   its next statement ([`Session::attach`]).
//! - **Moves**: to another backend at a safe point, when asked (admin API), when its backend
//!   drains, or at every safe point with `move_every_statement` (testing). A multiplexed session
//!   between statements only changes backend; one that holds a connection opens one on the new
//!   backend first and leaves the old one only when the new one is ready.
//! - **Loss**: a connection lost while the session was idle is replaced at its next command.
//!
//! A session whose state sluice could not recreate exactly stays where it is (passthrough
//! logins hold no credentials; see `SessionState::pins`). One that lost its connection then gets
//! an error at its next command and a clean close.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_proto::consts::{com, err as code};
use sluice_proto::packet::frame;

use super::session::Session;
use crate::backend::Backend;
use crate::backend::checkout::{self, Fault, Hello, Lease, Request};
use crate::backend::conn as bconn;
use crate::backend::link;
use crate::backend::restore;
use crate::backend::shared::{ConnState, Key, OnConn, Slot, Spare, Taken};
use crate::error::{Error, Result, Retry, Side};
use crate::metrics::MoveReason;
use crate::net::PacketConn;

/// A spare connection taken for a session and its place under the cap, to be brought to the
/// session's state.
pub(super) type Found = Box<(Spare, Option<Slot>)>;

/// What a session does at a safe point.
pub(super) enum Next {
    Stay,
    Move(Option<usize>, MoveReason),
    End,
    /// Read the user variables its last statements named back first.
    ReadBack,
}

impl Session {
    /// Whether a lost backend connection could be replaced without the client noticing.
    pub(super) fn may_move(&self) -> bool {
        self.backend.key.is_some() && self.state.movable() && self.state.unread_variables.is_empty()
    }

    /// At a safe point: moves, reads user variables back, gives the connection back, as
    /// [`Session::safe_point`] says. True: the session ends.
    pub(super) async fn settle(&mut self) -> Result<bool> {
        loop {
            match self.safe_point() {
                Next::Stay => return Ok(false),
                Next::End => return Ok(true),
                Next::Move(to, why) => {
                    Box::pin(self.move_now(to, why)).await;
                    return Ok(false);
                }
                Next::ReadBack => Box::pin(self.read_back()).await?,
            }
        }
    }

    /// Holds the command while the primary changes (a switchover, a lost primary replaced:
    /// `[failover] hold_timeout` at most); then a session on a backend that no longer serves
    /// as the primary moves to the one that does before the command runs.
    pub(super) async fn wait_primary(&mut self) -> Result<()> {
        self.handle.gated.store(true, Ordering::Relaxed);
        self.ctx.backends.topology.wait(self.config.failover.hold_timeout).await;
        self.handle.gated.store(false, Ordering::Relaxed);
        let demoted = self.backend.guard.serves_as() == crate::config::Role::Replica || self.backend.guard.is_fenced();
        if !self.route.split && !self.backend.conn.is_detached() && demoted {
            self.handle.ask_move(None, MoveReason::Role);
            self.settle().await?;
        }
        Ok(())
    }

    /// Reads back the user variables that statements named since the last time, so that
    /// another connection can be given them. Values sluice cannot write back exactly pin the
    /// session instead.
    pub(super) async fn read_back(&mut self) -> Result<()> {
        use sluice_proto::sql::hazard;
        let names = std::mem::take(&mut self.state.unread_variables);
        let caps = self.backend_caps();
        match restore::read_variables(&mut self.backend.conn, &names, caps, self.backend.guard.connect_timeout).await? {
            Some(values) => {
                for (name, value) in values {
                    // A variable never set is NULL: nothing to carry.
                    if value != "NULL" || self.state.user_variables.contains_key(&name) {
                        self.state.user_variables.insert(name, value);
                    }
                }
                if self.state.user_variables.len() > crate::session::MAX_USER_VARIABLES {
                    self.state.hazards |= hazard::USER_VARIABLE;
                }
            }
            // (The connection is told what it carries when it is given back.)
            None => self.state.hazards |= hazard::USER_VARIABLE,
        }
        self.handle.publish(&self.state);
        Ok(())
    }

    /// Asks the backend connection to report every variable change (after a COM_RESET_CONNECTION
    /// or a COM_CHANGE_USER, which start from the server's defaults). Only sessions sluice
    /// could move need it.
    /// `read`: which of the client's own tracking settings (`statement::TRACKS_*`) to take from
    /// what the connection has before: the server's defaults after a reset, or what a
    /// statement of the client's set (the rest is sluice's own, set before).
    pub(super) async fn track_variables(&mut self, read: u8) {
        if self.backend.key.is_none() {
            return;
        }
        let caps = self.backend_caps();
        match restore::track_all(&mut self.backend.conn, caps, self.backend.guard.connect_timeout).await {
            Ok((client, sql_mode)) => {
                if let Some(c) = self.backend.carries.as_mut() {
                    c.tracking = true;
                }
                // After a reset or a change of user the server's sql_mode replaces the one the
                // login's capabilities gave (IGNORE_SPACE): another connection must be told.
                if read == super::statement::TRACKS_VARIABLES | super::statement::TRACKS_STATE {
                    self.state.lex = Some(sluice_proto::lexer::Mode::from_sql_mode(sql_mode.as_bytes()));
                    self.state.variables.insert("sql_mode".into(), sql_mode);
                    self.handle.publish(&self.state);
                }
                // What the client's own session tracks now (the server's defaults after a
                // reset, or what it set).
                if let Some(t) = self.state.tracked.as_deref_mut() {
                    if read & super::statement::TRACKS_VARIABLES != 0 {
                        t.variables = client.variables;
                    }
                    if read & super::statement::TRACKS_STATE != 0 {
                        t.state_change = client.state_change;
                    }
                    self.backend.tracker.filter_session_track(Some(t.clone()));
                }
            }
            Err(e) => {
                tracing::warn!(session = self.handle.id, backend = %self.backend.guard.name, error = %e.message, "cannot track session variables; the session will not move")
            }
        }
    }

    /// Takes a connection for the command about to run (a multiplexed session holds none
    /// between statements) when a spare one of its key is on its backend in its state already:
    /// the common case, with no await. Otherwise [`Session::attach`] must run, with the spare
    /// connection found, if any, to bring to the session's state.
    pub(super) fn attach_at_once(&mut self) -> std::result::Result<(), Option<Found>> {
        let Some(key) = self.backend.key.as_deref() else { return Err(None) };
        if self.config.proxy.move_every_statement {
            return Err(None);
        }
        let b = self.backend.guard.0.clone();
        let Some((spare, slot)) = b.shared.try_take(key) else { return Err(None) };
        if restore::differs(&spare.state, &self.state) || !checkout::fits(&spare, self.same_as()) {
            // (One that does not fit is closed there; its place goes to a new connection.)
            return Err(Some(Box::new((spare, slot))));
        }
        let (backend_caps, mariadb) = (spare.backend_caps, spare.mariadb);
        drop(self.install(&b, Lease { conn: spare.conn, state: spare.state, slot, backend_caps, mariadb }));
        Ok(())
    }

    /// Takes a connection for the command about to run: `found` (a spare one of its key, not
    /// in its state yet), or one from the backend's shared connections, else a new login,
    /// waiting in the backend's queue at `max_backend_connections`.
    pub(super) async fn attach(&mut self, found: Option<Found>) -> Result<()> {
        let b = self.backend.guard.0.clone();
        let lease = self.connection_on(&b, !self.config.proxy.move_every_statement, found).await?;
        drop(self.install(&b, lease));
        Ok(())
    }

    /// No connection could be had for a command (its backend is down, or none serves as the
    /// primary) while failover is on: the session waits for a primary, up to
    /// `transaction_replay_timeout`, aiming again as the command would.
    pub(super) async fn attach_when_primary(
        &mut self,
        aim: Option<(super::split::Target, crate::metrics::Split)>,
        first: Error,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.config.routing.transaction_replay_timeout;
        let mut last = first;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            match aim {
                Some((target, why)) => self.aim(target, why, false),
                None => {
                    let backends = &self.ctx.backends;
                    if let Some(b) = backends.balancer.pick(backends, &[], crate::backend::balance::Want::Primary) {
                        self.bind_to(&b);
                    }
                }
            }
            if !self.backend.guard.is_usable() {
                continue;
            }
            match self.attach(None).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Gives the connection back to the backend's shared connections (multiplexing, at a safe
    /// point). A KILL aimed at the session's running statement keeps it (the killer read the
    /// thread id before it was cleared).
    pub(super) fn detach(&mut self) {
        self.handle.backend_thread_id.store(0, Ordering::SeqCst);
        if self.handle.kill_pending.load(Ordering::SeqCst) || !self.backend.conn.rbuf.is_empty() {
            let tid = self.backend.carries.as_ref().map_or(0, |c| c.thread_id);
            self.handle.backend_thread_id.store(tid, Ordering::SeqCst);
            return;
        }
        let (Some(key), Some(mut state)) = (self.backend.key.as_deref(), self.backend.carries.take()) else { return };
        state.take_on(&self.state);
        state.sweep_statements(&self.ctx.open_statements);
        let conn = std::mem::replace(&mut self.backend.conn, PacketConn::detached());
        let key = Key { attrs: state.attrs, ..key.clone() };
        let spare = Spare::new(conn, key, state, self.backend_caps(), self.backend.mariadb);
        self.backend.guard.shared.give_back(spare, self.backend.slot.take());
    }

    /// The connection's state after COM_RESET_CONNECTION or COM_CHANGE_USER (the server's
    /// defaults: no statements, no variables changed, none tracked) in the session's schema.
    pub(super) fn conn_was_reset(&mut self) {
        let schema = self.state.schema.clone();
        if let Some(c) = self.backend.carries.as_mut() {
            **c = ConnState { schema, thread_id: c.thread_id, multi_statements: c.multi_statements, ..ConnState::default() };
        }
    }

    /// The capabilities and the kind of server its connections have, which another must share.
    fn same_as(&self) -> Option<(u32, bool)> {
        Some((self.backend_caps(), self.backend.mariadb))
    }

    /// A connection to `b` in the session's state (`backend::checkout`): `found` (a spare one
    /// of its key taken already), else one from the backend's shared connections (when
    /// `reuse`), else a new login with the credentials sluice holds.
    async fn connection_on(&self, b: &Arc<Backend>, reuse: bool, found: Option<Found>) -> Result<Lease> {
        let (Some(key), Some(profile), Some(credential)) =
            (self.backend.key.as_deref(), self.who.profile.as_ref(), self.who.credential.as_ref())
        else {
            return Err(Error::proxy(code::UNKNOWN_ERROR, "sluice holds no credentials for this session"));
        };
        let r = Request {
            key,
            reuse,
            state: &self.state,
            hello: Hello::Encoded { bytes: profile.bytes(), schema: self.state.schema.as_deref() },
            client_caps: self.client_caps(),
            client_tls: self.client.stream.is_tls(),
            credential,
            same_as: self.same_as(),
            origin: super::origin(&self.handle),
            pool: None,
        };
        let mut tried = Vec::new();
        let got = match found {
            Some(found) => {
                let (spare, slot) = *found;
                checkout::ready(b, Taken::Conn(spare, slot), &r, &mut None, &mut tried).await.map_err(Fault::Failed)
            }
            None => checkout::checkout(b, &r, &mut None, &mut tried).await,
        };
        match got {
            Ok(Some(lease)) => Ok(lease),
            // (A connection that could not be had: the backend's refusal, or why it could not
            // be reached.)
            Ok(None) => Err(tried.pop().map_or_else(|| Error::backend("no connection could be had"), |(_, e)| e)),
            Err(Fault::Queue(waited)) => Err(queue_error(&self.ctx, b, waited)),
            Err(Fault::Failed(e)) => Err(e),
        }
    }

    /// Makes `ready` the session's connection, on `b`; returns the one it held (detached for
    /// a multiplexed session between statements).
    fn install(&mut self, b: &Arc<Backend>, ready: Lease) -> (PacketConn, Option<Box<ConnState>>, Option<Slot>) {
        let tid = ready.state.thread_id;
        let old_conn = std::mem::replace(&mut self.backend.conn, ready.conn);
        let old_state = self.backend.carries.replace(ready.state);
        let old_slot = std::mem::replace(&mut self.backend.slot, ready.slot);
        self.backend.taken = self.backend.taken.wrapping_add(1);
        self.backend.touched = true;
        if !self.state.prepared.is_empty() || self.route.multiplex {
            self.state.stmt_ids_mapped = true;
            if let Some(max) = self.state.prepared.keys().max() {
                self.state.next_stmt_id = self.state.next_stmt_id.max(max.wrapping_add(1)).max(1);
            }
        }
        if b.index != self.backend.guard.index {
            self.backend.guard = b.bind();
            self.handle.bind_backend(b.index, &b.name, tid);
        } else {
            self.handle.backend_thread_id.store(tid, Ordering::SeqCst);
        }
        let client_tls = self.client.stream.is_tls();
        self.backend.fit.backend_tls = b.tls.wanted(client_tls);
        if old_conn.stream.is_tls() != self.backend.conn.stream.is_tls() {
            self.handle.info.lock().backend_tls = self.backend.conn.stream.is_tls();
        }
        (old_conn, old_state, old_slot)
    }

    /// At a safe point (after a command, or when a move is asked of an idle session): says
    /// whether a move is due (asked through the admin API or by a drain, or forced by
    /// `move_every_statement`), or else gives the connection back when multiplexing. `End`: a
    /// passthrough session, which cannot move, on a backend drained for `drain_timeout`.
    pub(super) fn safe_point(&mut self) -> Next {
        let asked = self.handle.move_asked();
        let forced = self.config.proxy.move_every_statement;
        if self.backend.key.is_none() {
            return self.passthrough_safe_point(asked, forced);
        }
        if !(self.route.multiplex || asked || forced) || self.backend.lost.is_some() {
            return Next::Stay;
        }
        if !self.state.detachable() {
            // (On TiDB a move carries what pins a session to its connection: its states.)
            if (asked || forced) && self.moves_by_states() && self.state.movable_by_states() {
                self.count_pins();
                if let Some((to, why)) = self.handle.take_move() {
                    return Next::Move(to, why);
                }
                return if forced { Next::Move(None, MoveReason::Test) } else { Next::Stay };
            }
            if asked {
                tracing::debug!(session = self.handle.id, pins = ?self.state.pins(), "a move waits for the session's pins to end");
            }
            self.count_pins();
            return Next::Stay;
        }
        self.route.pinned = 0;
        if !self.state.unread_variables.is_empty() && !self.backend.conn.is_detached() {
            return Next::ReadBack;
        }
        if let Some((to, why)) = self.handle.take_move() {
            return Next::Move(to, why);
        }
        if forced {
            return Next::Move(None, MoveReason::Test);
        }
        if self.route.multiplex && !self.backend.conn.is_detached() {
            self.detach();
        }
        Next::Stay
    }

    /// A passthrough session: one on TiDB moves by its session states (`transfer.rs`) when
    /// asked or forced, between transactions and not between a SET TRANSACTION and the
    /// transaction it is for (which TiDB's states do not carry); another cannot move, and ends
    /// when asked to leave a backend drained for `drain_timeout`.
    fn passthrough_safe_point(&mut self, asked: bool, forced: bool) -> Next {
        if (asked || forced) && self.state.movable_by_states() && self.moves_by_states() {
            if let Some((to, why)) = self.handle.take_move() {
                return Next::Move(to, why);
            }
            if forced {
                return Next::Move(None, MoveReason::Test);
            }
        }
        if asked && self.drained_out() { Next::End } else { Next::Stay }
    }

    /// A session that cannot move, asked to leave a backend that drained for `drain_timeout`.
    fn drained_out(&self) -> bool {
        let expired = self.backend.guard.drained_for().is_some_and(|d| d >= self.config.proxy.drain_timeout);
        if expired && self.state.at_safe_point() {
            tracing::info!(session = self.handle.id, backend = %self.backend.guard.name, "closing a session that cannot move off a draining backend");
            return true;
        }
        false
    }

    /// Counts the pins that began since the last safe point (multiplexed sessions).
    fn count_pins(&mut self) {
        let pins = self.state.pins();
        let mut mask = 0u32;
        for p in pins {
            let bit = 1 << (p as u32);
            if self.route.pinned & bit == 0 {
                self.ctx.metrics.pinned(p.as_str());
            }
            mask |= bit;
        }
        self.route.pinned = mask;
    }

    /// COM_STMT_CLOSE once statement ids are mapped: the statement is forgotten; it is closed
    /// on the connection only when the session holds one, prepared it there, and does not
    /// multiplex (a multiplexed session leaves it prepared there for the next session of its
    /// key). No answer either way.
    pub(super) async fn close_statement(&mut self, client_id: u32) -> Result<super::session::Flow> {
        self.skip_request().await?;
        let Some(p) = self.state.prepared.remove(&client_id) else { return Ok(super::session::Flow::Continue) };
        self.handle.publish(&self.state);
        // (The last client that held one open: closed wherever it is prepared.)
        let last = p.counted && self.ctx.open_statements.release(&p.sql);
        let here = p.conn_gen == self.backend.taken && !self.backend.conn.is_detached();
        let shared = self.state.prepared.values().any(|q| q.conn_gen == p.conn_gen && q.backend_id == p.backend_id);
        if here && (!self.route.multiplex || last) && !shared {
            if let Some(c) = self.backend.carries.as_mut()
                && c.stmts.get(&p.sql).is_some_and(|on| on.id == p.backend_id)
            {
                c.stmts.remove(&p.sql);
            }
            self.close_on_backend(p.backend_id).await?;
        }
        Ok(super::session::Flow::Continue)
    }

    /// Moves the session after its backend connection was lost; when it cannot move, the client
    /// gets an error for its command and the session ends.
    pub(super) async fn move_or_fail(&mut self, reason: &str) -> Result<()> {
        let from = self.backend.guard.name.clone();
        match self.move_after_loss().await {
            Ok(()) => {
                self.ctx.metrics.moved(MoveReason::Failure, true);
                tracing::info!(session = self.handle.id, from = %from, to = %self.backend.guard.name, "session moved to a new backend connection");
                Ok(())
            }
            Err(e) => {
                self.ctx.metrics.moved(MoveReason::Failure, false);
                let msg = format!(
                    "sluice: the connection to backend {from} was lost ({reason}) and the session could not be recreated: {}",
                    e.message
                );
                self.client_error(1, code::SERVER_LOST, b"HY000", &msg).await;
                Err(Error::new(Side::Backend, code::SERVER_LOST, msg))
            }
        }
    }

    /// After a loss, a new connection on `b` with the session's state (transaction replay's,
    /// on the primary).
    pub(super) async fn reconnect_on(&mut self, b: &Arc<Backend>) -> Result<()> {
        self.drop_dead_connection();
        let ready = self.connection_on(b, true, None).await?;
        drop(self.install(b, ready));
        self.handle.publish(&self.state);
        Ok(())
    }

    /// The dead connection goes now (its place under the cap with it).
    fn drop_dead_connection(&mut self) {
        drop(self.backend.carries.take());
        self.backend.conn = PacketConn::detached();
        self.backend.slot = None;
    }

    /// Logs in to a backend again (another one first) and restores the session there.
    pub(super) async fn move_after_loss(&mut self) -> Result<()> {
        let lost = self.backend.guard.index;
        self.drop_dead_connection();
        let mut tried = vec![(lost, Error::backend("the session's connection to it was lost"))];
        let deadline = tokio::time::Instant::now() + self.config.routing.transaction_replay_timeout;
        let mut lost_again = false;
        loop {
            let b = match link::pick(&self.ctx.backends, &tried) {
                Ok(b) => b,
                // Nothing else is usable: the lost backend itself may be back (a restart), or
                // only the connection was closed (wait_timeout).
                Err(_) if !lost_again && tried.first().is_some_and(|(i, _)| *i == lost) && self.backend.guard.is_up() => {
                    lost_again = true;
                    tried.remove(0);
                    continue;
                }
                // Failover is on: a primary may be being promoted.
                Err(_) if self.ctx.backends.topology.is_strict() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    tried.clear();
                    continue;
                }
                Err(e) => return Err(e),
            };
            match self.connection_on(&b, true, None).await {
                Ok(ready) => {
                    drop(self.install(&b, ready));
                    self.handle.publish(&self.state);
                    return Ok(());
                }
                Err(e) if e.retry == Retry::Safe => tried.push((b.index, e)),
                Err(e) => return Err(e),
            }
        }
    }

    /// A move at a safe point: to backend `to` (any other one when None). A session between
    /// statements that holds no connection only changes backend; one that holds a connection
    /// keeps it when the new one cannot be had.
    pub(super) async fn move_now(&mut self, to: Option<usize>, why: MoveReason) {
        let backends = &self.ctx.backends;
        let target = match to {
            Some(i) => backends.get(i).filter(|b| b.is_up()),
            // Off a backend that stopped being the primary: to the one that is now, if any (a
            // session that got there since stays).
            None if why == MoveReason::Role => {
                let primary = |b: &Backend| b.is_usable() && b.serves_as() == crate::config::Role::Primary;
                if primary(&self.backend.guard) {
                    return;
                }
                backends.balancer.pick(backends, &[], crate::backend::balance::Want::Primary).filter(|b| primary(b))
            }
            None => {
                let mut exclude = vec![(self.backend.guard.index, Error::backend("the session is there"))];
                match link::pick(backends, &exclude) {
                    Ok(b) => Some(b),
                    // A forced move with one backend: a new connection on the same one.
                    Err(_) if why == MoveReason::Test => {
                        exclude.clear();
                        link::pick(backends, &exclude).ok()
                    }
                    Err(_) => None,
                }
            }
        };
        let Some(target) = target else {
            tracing::debug!(session = self.handle.id, "no backend to move the session to");
            self.ctx.metrics.moved(why, false);
            return;
        };
        self.move_to(target, why).await;
        if self.route.multiplex && !self.backend.conn.is_detached() {
            self.detach();
        }
    }

    async fn move_to(&mut self, target: Arc<Backend>, why: MoveReason) {
        if self.backend.conn.is_detached() {
            self.backend.guard = target.bind();
            self.handle.bind_backend(target.index, &target.name, 0);
            self.ctx.metrics.moved(why, true);
            self.handle.moved_at_ms.store(crate::metrics::mono_ns() / 1_000_000, Ordering::Relaxed);
            return;
        }
        if target.index == self.backend.guard.index && why != MoveReason::Test {
            return;
        }
        let from = self.backend.guard.name.clone();
        // (On TiDB the session's own states carry it: `transfer.rs`.)
        let by_states = self.moves_by_states();
        let moved = if by_states {
            self.transfer_to(&target).await
        } else {
            self.connection_on(&target, why != MoveReason::Test, None).await.map(|ready| self.install(&target, ready).0)
        };
        match moved {
            Ok(old) => {
                self.ctx.metrics.moved(why, true);
                self.handle.moved_at_ms.store(crate::metrics::mono_ns() / 1_000_000, Ordering::Relaxed);
                tracing::debug!(session = self.handle.id, from = %from, to = %target.name, reason = why.as_str(), by_states, "session moved");
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), bconn::quit(old)).await;
            }
            Err(e) => {
                self.ctx.metrics.moved(why, false);
                tracing::warn!(session = self.handle.id, from = %from, to = %target.name, error = %e.message, by_states, "session could not move; it stays");
            }
        }
    }

    /// Makes sure the statement `client_id` names is prepared on the session's connection
    /// (it was prepared on another one, before a move or since the session took this one), from
    /// the statements the connection has; true when it must be prepared there first
    /// ([`Session::prepare_again`]). Unknown ids are left to the backend.
    pub(super) fn find_prepared(&mut self, client_id: u32) -> bool {
        let this_conn = self.backend.taken;
        let Some(p) = self.state.prepared.get_mut(&client_id).filter(|p| p.conn_gen != this_conn) else { return false };
        let Some(conn) = self.backend.carries.as_ref() else { return false };
        match conn.stmts.get(&p.sql) {
            Some(on) if on.params == p.params && on.columns == p.columns => {
                p.backend_id = on.id;
                p.conn_gen = this_conn;
                p.types_unsent = p.params > 0 && on.types != p.param_types;
                false
            }
            _ => true,
        }
    }

    /// Prepares the statement `client_id` names on the session's connection again.
    pub(super) async fn prepare_again(&mut self, client_id: u32) -> Result<()> {
        let this_conn = self.backend.taken;
        let caps = self.backend_caps();
        let Some(p) = self.state.prepared.get(&client_id) else { return Ok(()) };
        let sql = p.sql.clone();
        let (id, columns, params) = restore::prepare(&mut self.backend.conn, &sql, caps, self.backend.guard.connect_timeout).await?;
        let Some(p) = self.state.prepared.get_mut(&client_id) else { return Ok(()) };
        if (columns, params) != (p.columns, p.params) {
            return Err(Error::backend(format!("re-preparing statement {client_id} ({sql}): its shape changed")));
        }
        p.backend_id = id;
        p.conn_gen = this_conn;
        p.types_unsent = p.params > 0;
        if let Some(conn) = self.backend.carries.as_mut() {
            conn.stmts.insert(sql, OnConn { id, params, columns, types: Vec::new() });
        }
        Ok(())
    }
}

/// The error a statement gets when no connection to `b` became free within `queue_timeout`.
pub(super) fn queue_error(ctx: &crate::ctx::Ctx, b: &Backend, waited: std::time::Duration) -> Error {
    let mut e = Error::new(Side::Proxy, code::CON_COUNT, queue_message(ctx, b, waited)).state(b"08004");
    e.retry = Retry::Safe;
    e
}

/// Why a wait for a connection to `b` ran out: the cap, and who holds the connections and why
/// (their pins), so that a cap too small can be told from sessions that keep theirs.
pub(super) fn queue_message(ctx: &crate::ctx::Ctx, b: &Backend, waited: std::time::Duration) -> String {
    const SHOWN: usize = 8;
    let (mut held, mut shown) = (0, Vec::new());
    ctx.sessions.for_each(|h| {
        if h.backend_index.load(Ordering::Relaxed) as usize != b.index || h.backend_thread_id.load(Ordering::Relaxed) == 0 {
            return;
        }
        held += 1;
        if shown.len() < SHOWN {
            let pins: Vec<&str> = h.snapshot().pins.iter().map(|p| p.as_str()).collect();
            let why = match (pins.is_empty(), h.busy.load(Ordering::Relaxed)) {
                (false, _) => format!("pinned: {}", pins.join(", ")),
                (true, true) => "running a statement".to_string(),
                (true, false) => "between statements".to_string(),
            };
            shown.push(format!("session {} ({why})", h.id));
        }
    });
    let more = if held > shown.len() { format!(", and {} more", held - shown.len()) } else { String::new() };
    format!(
        "sluice: no connection to backend {} became free within queue_timeout ({} ms waited; max_backend_connections = {}); \
         {held} held by sessions: {}{more}",
        b.name,
        waited.as_millis(),
        ctx.config().proxy.max_backend_connections,
        shown.join("; ")
    )
}

/// The connection's record of prepared statement `p`, when the connection `carries` still
/// holds it under the id the session knows.
fn on_conn<'a>(
    carries: &'a mut Option<Box<crate::backend::shared::ConnState>>,
    p: &crate::session::Prepared,
) -> Option<&'a mut crate::backend::shared::OnConn> {
    carries.as_mut()?.stmts.get_mut(&p.sql).filter(|on| on.id == p.backend_id)
}

impl Session {
    /// Remembers the parameter types an execute sends, and adds them to an execute that does
    /// not send them when the connection has not been sent these types for the statement (it
    /// was prepared again there, or another session bound other types). Reads the whole
    /// execute command (its first packet), before statement ids are mapped.
    pub(super) fn execute_types(&mut self, h: sluice_proto::packet::Header) -> Result<()> {
        use sluice_proto::packet::HEADER;
        let end = HEADER + h.len;
        let Some(payload) = self.client.rbuf.get(HEADER..end) else { return Ok(()) };
        let Some(id) = payload.get(1..5).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) else { return Ok(()) };
        let Some(p) = self.state.prepared.get_mut(&id).filter(|p| p.params > 0) else { return Ok(()) };
        let params = p.params as usize;
        let flag_at = super::replay_exec::flag_at(p.params);
        let types = flag_at + 1..flag_at + 1 + 2 * params;
        // (The connection's record of the statement, looked up only when the types were sent
        // or must be: most executes send none.)
        let carries = &mut self.backend.carries;
        match payload.get(flag_at) {
            Some(1) if payload.len() >= types.end => {
                let sent = &payload[types];
                if let Some(on) = on_conn(carries, p)
                    && on.types != sent
                {
                    on.types.clear();
                    on.types.extend_from_slice(sent);
                }
                if p.param_types != sent {
                    p.param_types.clear();
                    p.param_types.extend_from_slice(sent);
                }
                p.types_unsent = false;
            }
            Some(0) if p.types_unsent && p.param_types.len() == 2 * params => {
                // The client bound its types on another connection: send them to this one.
                let mut fixed = Vec::with_capacity(h.len + 2 * params + HEADER);
                let mut body = Vec::with_capacity(h.len + 2 * params);
                body.extend_from_slice(&payload[..flag_at]);
                body.push(1);
                body.extend_from_slice(&p.param_types);
                body.extend_from_slice(&payload[flag_at + 1..]);
                if body.len() >= sluice_proto::consts::MAX_PAYLOAD {
                    return Err(Error::proxy(code::UNKNOWN_ERROR, "an execute too large to re-send its parameter types after a move"));
                }
                if let Some(on) = on_conn(carries, p) {
                    on.types.clone_from(&p.param_types);
                }
                frame(&mut fixed, &body, 0);
                let rest = self.client.rbuf.split_off(end);
                self.client.rbuf.clear();
                self.client.rbuf.extend_from_slice(&fixed);
                self.client.rbuf.unsplit(rest);
                p.types_unsent = false;
            }
            _ => {}
        }
        Ok(())
    }

    /// Records a statement the client prepared on the session's connection, so that other
    /// sessions (multiplexing) or a later move find it there. Returns a statement to close: an
    /// older one of the same text that no statement of the session uses.
    pub(super) fn prepared_here(&mut self, client_id: u32) -> Option<u32> {
        let this_conn = self.backend.taken;
        let p = self.state.prepared.get_mut(&client_id)?;
        p.conn_gen = this_conn;
        if self.backend.key.is_some() && self.state.stmt_ids_mapped && !p.counted {
            self.ctx.open_statements.hold(&p.sql);
            p.counted = true;
        }
        let conn = self.backend.carries.as_mut()?;
        let on = OnConn { id: p.backend_id, params: p.params, columns: p.columns, types: Vec::new() };
        let old = conn.stmts.insert(p.sql.clone(), on)?;
        let used = self.state.prepared.values().any(|q| q.conn_gen == this_conn && q.backend_id == old.id);
        (!used).then_some(old.id)
    }

    /// The client's statements are gone (COM_RESET_CONNECTION, COM_CHANGE_USER, the session's
    /// end): no longer counted as held open.
    pub(super) fn release_statements(&mut self) {
        for p in self.state.prepared.values_mut().filter(|p| p.counted) {
            self.ctx.open_statements.release(&p.sql);
            p.counted = false;
        }
    }

    /// Closes the statements its connection carries that no client holds open any more
    /// (`ConnState::to_close`, noted when another session gave it back).
    pub(super) async fn close_unheld(&mut self) -> Result<()> {
        let ids = self.backend.carries.as_mut().map(|c| std::mem::take(&mut c.to_close)).unwrap_or_default();
        let mut out = Vec::with_capacity(ids.len() * 9);
        for id in ids {
            let mut p = [com::STMT_CLOSE, 0, 0, 0, 0];
            p[1..].copy_from_slice(&id.to_le_bytes());
            frame(&mut out, &p, 0);
        }
        let limit = self.config.proxy.response_timeout;
        self.backend.conn.stream.write_within(limit, &out).await.map_err(|e| Error::io(Side::Backend, "closing statements", e))
    }

    /// Sends COM_STMT_CLOSE for a statement on the session's connection (it has no answer).
    pub(super) async fn close_on_backend(&mut self, backend_id: u32) -> Result<()> {
        let mut p = [0u8; 9];
        p[..4].copy_from_slice(&[5, 0, 0, 0]);
        p[4] = com::STMT_CLOSE;
        p[5..].copy_from_slice(&backend_id.to_le_bytes());
        let limit = self.config.proxy.response_timeout;
        self.backend.conn.stream.write_within(limit, &p).await.map_err(|e| Error::io(Side::Backend, "closing a statement", e))
    }
}

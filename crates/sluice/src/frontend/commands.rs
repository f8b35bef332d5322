//! Commands sluice must rewrite rather than relay as they are: KILL (client-visible ids are
//! sluice's, not the backend's) and COM_CHANGE_USER (the login is re-run against the backend).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Buf;
use sluice_proto::consts::{cap, com, err as code};
use sluice_proto::handshake::ChangeUser;
use sluice_proto::packet::{HEADER, Header};
use sluice_proto::response::Expect;
use sluice_proto::sql::{self, Kill, KillTarget};

use super::response::relay_response;
use super::session::{Flow, Session};
use super::verify::{Relay, Verdict, verify};
use crate::backend::conn::{self as bconn, Outcome};
use crate::error::{Error, Result, Side};
use crate::session::{SessionHandle, StateSink};

/// Waits (a second at most) until a killed session has closed its client's connection, as the
/// server closes a killed connection before its KILL is answered: the killer's client, told the
/// KILL went through, finds the connection gone.
async fn gone(ctx: &crate::ctx::Ctx, killer: u32, target: &SessionHandle) {
    if target.id == killer {
        return;
    }
    // (Listening before the look: an end between the two is not missed.)
    let ended = target.ended.notified();
    tokio::pin!(ended);
    ended.as_mut().enable();
    if ctx.sessions.get(target.id).is_some() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), ended).await;
    }
}

/// Ends the sessions of `targets` whose connection KILL stands at `at` ([`Target::at`]).
async fn end_targets(ctx: &crate::ctx::Ctx, killer: u32, targets: &[Target], at: u32) {
    for t in targets.iter().filter(|t| t.connection && t.at == at) {
        t.handle.kill();
        gone(ctx, killer, &t.handle).await;
    }
}

/// The plugin name that makes a backend answer with an auth switch and a fresh scramble.
const SWITCH_PLUGIN: &[u8] = b"sluice_passthrough";

/// What sluice does with a command that holds a KILL.
pub(super) enum KillPlan {
    /// A query that is one KILL of a literal connection id, or COM_PROCESS_KILL: sluice runs
    /// it on the target's backend, whichever that is.
    Single(Kill),
    /// KILLs among other statements, every target on this session's backend: the query is
    /// forwarded with each id replaced by its target's thread id.
    Rewrite { query: Vec<u8>, targets: Vec<Target> },
    /// A KILL sluice cannot translate exactly: refused before anything reaches the backend.
    Refuse { code: u16, msg: String },
}

/// A session a KILL among other statements names.
pub(super) struct Target {
    handle: Arc<SessionHandle>,
    /// A connection KILL (not KILL QUERY): the session ends.
    connection: bool,
    /// How many of the query's statements must have run (ended in OK) before it ends: those
    /// before the KILL for a session that holds no backend connection (sluice ends it itself,
    /// where the KILL stands), and the KILL too for one whose backend thread the server kills.
    /// [`AT_END`]: once the whole query ran without an error.
    at: u32,
}

/// [`Target::at`] of a KILL after a statement that may answer with several results (a CALL, an
/// EXECUTE): where the statements after it begin cannot be told from the response.
const AT_END: u32 = u32::MAX;

impl Session {
    /// A command that fails [`Session::command_byte`]'s checks: the client gets the server's
    /// error for it, and the session ends with the returned error.
    pub(super) async fn bad_command(&mut self, h: Header) -> Error {
        if h.seq != 0 {
            self.client_error(h.seq.wrapping_add(1), code::NET_PACKETS_OUT_OF_ORDER, b"08S01", "Got packets out of order").await;
            return Error::client(format!("command packet with sequence id {}", h.seq));
        }
        if h.len as u64 > self.config.proxy.max_packet_size {
            self.ctx.metrics.reject(crate::metrics::Reject::PacketTooLarge);
            let msg = "Got a packet bigger than 'max_allowed_packet' bytes";
            self.client_error(1, code::NET_PACKET_TOO_LARGE, b"08S01", msg).await;
            return Error::client(format!("command of {} bytes exceeds max_packet_size", h.len));
        }
        self.client_error(1, code::NET_READ_ERROR, b"08S01", "Empty command packet").await;
        Error::client("empty command packet")
    }

    /// Recognises a KILL anywhere in a COM_QUERY or COM_STMT_PREPARE, and COM_PROCESS_KILL
    /// (None: nothing to translate). The backend never receives a sluice connection id: a KILL
    /// is translated, or refused. A plain check, so that the common case awaits nothing.
    /// `scanned`: the query's hazards as its shape gave them (whether it names KILL), if known.
    pub(super) fn kill_in(&self, cmd: u8, body_end: usize, scanned: Option<u16>) -> Option<KillPlan> {
        let payload = &self.client.rbuf[HEADER + 1..body_end];
        if cmd == com::PROCESS_KILL {
            let b = payload.get(..4)?;
            return Some(KillPlan::Single(Kill { query_only: false, id: u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64, hard: None }));
        }
        // A prepared statement is one statement.
        let multi = self.state.multi_statements && cmd == com::QUERY;
        let may = match scanned {
            Some(found) => found & sql::hazard::KILL != 0,
            None => sql::may_name_kill(payload, multi),
        };
        if !may {
            return None;
        }
        let readings = self.state.readings(payload);
        let kills = sql::find_kills_in(payload, multi, readings.0);
        // Where sluice does not know the session's sql_mode and the text reads two ways, a KILL
        // in either reading is refused unless both agree: the server may see statements sluice
        // would not.
        if let Some(other) = readings.1
            && sql::find_kills_in(payload, multi, other) != kills
        {
            return Some(KillPlan::Refuse {
                code: code::NOT_SUPPORTED_YET,
                msg: "sluice: this text is read differently with and without NO_BACKSLASH_ESCAPES, and sluice does not know this \
                      session's sql_mode: the KILL in it cannot be mapped"
                    .into(),
            });
        }
        let kills = kills?;
        let mut ids = Vec::new();
        for f in &kills.found {
            let refuse = |msg: &str| Some(KillPlan::Refuse { code: code::NOT_SUPPORTED_YET, msg: format!("sluice: {msg}") });
            match &f.target {
                // Neither names a connection by sluice's id.
                KillTarget::QueryId | KillTarget::Own => {}
                KillTarget::User => {
                    return refuse(
                        "KILL USER is not relayed (a user's sessions are spread over backends and pooled connections); kill each session by its id",
                    );
                }
                KillTarget::Placeholder | KillTarget::Expression => {
                    return refuse("KILL takes a literal connection id through sluice (the backend's ids differ from sluice's)");
                }
                KillTarget::Id { .. } if f.quoted || cmd == com::STMT_PREPARE => {
                    return refuse("a KILL cannot be prepared through sluice (the backend's ids differ from sluice's); send it as a query");
                }
                KillTarget::Id { kill, at } => ids.push((*kill, at.clone(), f.statement.clone(), f.index)),
            }
        }
        match ids.as_slice() {
            [] => None,
            [(kill, ..)] if kills.statements == 1 => Some(KillPlan::Single(*kill)),
            _ => Some(self.rewrite_kills(payload, &ids, kills.single_results)),
        }
    }

    /// Rewrites the ids of the KILLs of a multi-statement (at their places in `payload`), or
    /// refuses it when a target is unknown or runs a statement on another backend. A KILL of a
    /// session between statements becomes `DO 0` (nothing runs there: a KILL QUERY has nothing
    /// to do, a KILL closes the session where the statement stands).
    /// `counted`: how many statements from the first answer with one result each.
    fn rewrite_kills(&self, payload: &[u8], ids: &[(Kill, Range<usize>, Range<usize>, usize)], counted: usize) -> KillPlan {
        let mut query = vec![com::QUERY];
        let mut targets = Vec::with_capacity(ids.len());
        let mut copied = 0;
        for (kill, at, statement, index) in ids {
            // (Past a statement of several results, the end of the whole response.)
            let index = if *index <= counted { u32::try_from(*index).unwrap_or(AT_END) } else { AT_END };
            let target = u32::try_from(kill.id).ok().and_then(|id| self.ctx.sessions.get(id));
            let tid = target.as_ref().map_or(0, |t| t.backend_thread_id.load(Ordering::Relaxed));
            let Some(target) = target else {
                return KillPlan::Refuse { code: code::NO_SUCH_THREAD, msg: format!("Unknown thread id: {}", kill.id) };
            };
            // A session between statements (a multiplexed one holds no connection; another's
            // may be on any backend) is ended by sluice, as a KILL alone ends it.
            if tid == 0 || !target.busy.load(Ordering::SeqCst) {
                query.extend_from_slice(&payload[copied..statement.start]);
                query.extend_from_slice(b"DO 0");
                copied = statement.end;
                targets.push(Target { handle: target, connection: !kill.query_only, at: index });
                continue;
            }
            if target.backend_index.load(Ordering::Relaxed) as usize != self.backend.guard.index {
                let msg = format!(
                    "sluice: connection {} is on another backend; a KILL among other statements reaches only this session's backend: send it alone",
                    kill.id
                );
                return KillPlan::Refuse { code: code::NOT_SUPPORTED_YET, msg };
            }
            query.extend_from_slice(&payload[copied..at.start]);
            query.extend_from_slice(tid.to_string().as_bytes());
            copied = at.end;
            let at = if index == AT_END { AT_END } else { index + 1 };
            targets.push(Target { handle: target, connection: !kill.query_only, at });
        }
        query.extend_from_slice(&payload[copied..]);
        KillPlan::Rewrite { query, targets }
    }

    /// Runs a KILL plan.
    pub(super) async fn run_kill(&mut self, plan: KillPlan) -> Result<Flow> {
        match plan {
            KillPlan::Single(kill) => self.kill(kill).await,
            KillPlan::Rewrite { query, targets } => self.kill_rewritten(&query, &targets).await,
            KillPlan::Refuse { code, msg } => {
                self.skip_request().await?;
                let state = if code == code::NO_SUCH_THREAD { b"HY000" } else { b"42000" };
                self.client_error(1, code, state, &msg).await;
                Ok(Flow::Continue)
            }
        }
    }

    /// Forwards a multi-statement whose KILL ids were rewritten. Each connection KILL ends its
    /// target's session where it stands: once the statements before it ran (and, for a target
    /// whose backend thread the server kills, the KILL itself), before the client reads the
    /// results of the statements after it, as the server closes a killed connection at once.
    async fn kill_rewritten(&mut self, query: &[u8], targets: &[Target]) -> Result<Flow> {
        self.skip_request().await?;
        for t in targets.iter().filter(|t| t.connection) {
            t.handle.kill_pending.store(true, Ordering::Relaxed);
        }
        let ran = self.query_on_backend(query, targets).await;
        for t in targets {
            t.handle.kill_pending.store(false, Ordering::Relaxed);
        }
        ran.map(|_| Flow::Continue)
    }

    /// Sends a COM_QUERY of sluice's making on the session's backend connection and relays the
    /// response, ending each connection KILL's target at its point ([`Target::at`]); true when
    /// the response held no error.
    async fn query_on_backend(&mut self, query: &[u8], targets: &[Target]) -> Result<bool> {
        let mut points: Vec<u32> = targets.iter().filter(|t| t.connection).map(|t| t.at).collect();
        points.sort_unstable();
        points.dedup();
        // (Those that stand first end before anything is sent.)
        end_targets(&self.ctx, self.handle.id, targets, 0).await;
        let mut pkt = Vec::with_capacity(query.len() + HEADER);
        sluice_proto::packet::frame(&mut pkt, query, 0);
        let limit = self.config.proxy.response_timeout;
        self.backend.conn.stream.write_within(limit, &pkt).await.map_err(|e| Error::io(Side::Backend, "sending KILL", e))?;
        let mut sink = StateSink::new(&mut self.state);
        self.backend.tracker.start(Expect::Results, 0);
        for at in points.into_iter().filter(|&at| at > 0 && at != AT_END).chain([0]) {
            // (0 last: the rest of the response, held nowhere.)
            self.backend.tracker.hold_at(at);
            let watch = crate::session::deadline::Watch { clock: &self.ctx.clock, handle: &self.handle, waker: &mut self.waker };
            relay_response(&mut self.backend.tracker, &mut self.backend.conn, Some(&mut self.client), &mut sink, &self.ctx, watch, false)
                .await?;
            // (Short of the point, the response ended: an error stopped the statements first.)
            if at > 0 && self.backend.tracker.results() >= at {
                end_targets(&self.ctx, self.handle.id, targets, at).await;
            }
            if self.backend.tracker.is_done() {
                break;
            }
        }
        let (changed, ok) = (sink.changed, sink.error.is_none());
        if changed {
            self.handle.publish(&self.state);
        }
        if ok {
            end_targets(&self.ctx, self.handle.id, targets, AT_END).await;
        }
        Ok(ok)
    }

    /// Runs a KILL: translated to the target's backend thread.
    pub(super) async fn kill(&mut self, kill: Kill) -> Result<Flow> {
        self.skip_request().await?;
        let target = u32::try_from(kill.id).ok().and_then(|id| self.ctx.sessions.get(id));
        let Some(target) = target else {
            self.client_error(1, code::NO_SUCH_THREAD, b"HY000", &format!("Unknown thread id: {}", kill.id)).await;
            return Ok(Flow::Continue);
        };
        // Said before the thread id is read: a multiplexed target keeps its connection while a
        // KILL is pending (`Session::detach`), so the id cannot pass to another session's
        // statement meanwhile; and before the backend acts, so that the target does not take
        // the end of its connection for a loss to recover from.
        target.kill_pending.store(true, Ordering::SeqCst);
        let tid = target.backend_thread_id.load(Ordering::SeqCst);
        let tb = target.backend_index.load(Ordering::Relaxed) as usize;
        let connection_kill = !kill.query_only;
        if tid == 0 || !target.busy.load(Ordering::SeqCst) {
            // A session between statements (a multiplexed one holds no connection; another may
            // be moving to a new one): nothing runs, and the session is closed here.
            if connection_kill {
                target.kill();
                gone(&self.ctx, self.handle.id, &target).await;
            }
            target.kill_pending.store(false, Ordering::Relaxed);
            let mut ok = Vec::new();
            // (The flags of the session, not of the last answer: nothing more follows, and no
            // state changed.)
            use sluice_proto::consts::status;
            let st = self.state.status & !(status::SESSION_STATE_CHANGED | status::MORE_RESULTS_EXISTS);
            sluice_proto::basic::ok_payload(&mut ok, 0, 0, 0, st, 0);
            self.client.write_packet(&ok, 1).await.map_err(|e| Error::io(Side::Client, "writing", e))?;
            return Ok(Flow::Continue);
        }
        let mut q = vec![com::QUERY];
        sql::write_kill(&kill, tid as u64, &mut q);
        let ok = if tb == self.backend.guard.index { self.query_on_backend(&q, &[]).await? } else { self.kill_elsewhere(tb, &q).await? };
        if ok && connection_kill {
            target.kill();
            gone(&self.ctx, self.handle.id, &target).await;
        }
        target.kill_pending.store(false, Ordering::Relaxed);
        Ok(Flow::Continue)
    }

    /// Runs a KILL on another backend over a fresh connection with this session's credentials
    /// (users mode) and relays the answer.
    async fn kill_elsewhere(&mut self, backend_index: usize, query: &[u8]) -> Result<bool> {
        let Some(b) = self.ctx.backends.get(backend_index) else {
            self.client_error(1, code::NO_SUCH_THREAD, b"HY000", "Unknown thread id").await;
            return Ok(false);
        };
        let Some(cred) = self.who.credential.clone() else {
            let msg = format!("sluice: that session is on backend {}; in passthrough mode sluice holds no credentials to reach it", b.name);
            self.client_error(1, 1095, b"HY000", &msg).await;
            return Ok(false);
        };
        // TLS as the session's own backend connection would have it (REQUIRE SSL users).
        let who =
            bconn::As { user: &self.state.user, collation: self.state.collation, cred: &cred, client_tls: self.client.stream.is_tls() };
        let reply = bconn::run_once(&b, &who, query).await?;
        self.client.write_packet(&reply, 1).await.map_err(|e| Error::io(Side::Client, "writing", e))?;
        Ok(reply.first() == Some(&0))
    }

    /// COM_CHANGE_USER: the client's reply was computed over sluice's scramble, so the packet is
    /// rewritten to make the backend ask again with its own; the exchange is then relayed
    /// (passthrough) or answered by sluice with the new user's credentials (users mode).
    pub(super) async fn change_user(&mut self, h: Header) -> Result<Flow> {
        if h.len + HEADER > self.client.rbuf.len() {
            self.skip_request().await?;
            self.client_error(1, code::NET_PACKET_TOO_LARGE, b"08S01", "COM_CHANGE_USER too large").await;
            return Ok(Flow::Continue);
        }
        let caps = self.client_caps();
        let parsed = ChangeUser::parse(&self.client.rbuf[HEADER..HEADER + h.len], caps);
        self.client.rbuf.advance(HEADER + h.len);
        let mut cu = match parsed {
            Ok(cu) => cu,
            Err(e) => {
                self.client_error(1, code::NET_READ_ERROR, b"08S01", &e.to_string()).await;
                return Err(Error::malformed(Side::Client, e));
            }
        };
        if !self.state.passthrough {
            return self.change_user_users(cu).await;
        }
        cu.auth_response.clear();
        cu.auth_plugin = Some(SWITCH_PLUGIN.to_vec());
        cu.collation.get_or_insert(self.state.collation as u16);
        let mut payload = Vec::new();
        cu.write(&mut payload);
        let limit = self.config.proxy.handshake_timeout;
        bconn::bounded(limit, "COM_CHANGE_USER", self.relay_change_user(&cu, &payload)).await
    }

    /// Relays a passthrough COM_CHANGE_USER exchange between backend and client until OK or ERR.
    async fn relay_change_user(&mut self, cu: &ChangeUser, payload: &[u8]) -> Result<Flow> {
        self.backend.conn.write_packet(payload, 0).await.map_err(|e| Error::io(Side::Backend, "change user", e))?;
        let strip_track = (self.client_caps() & cap::SESSION_TRACK == 0).then_some(self.backend.mariadb);
        let mut relay = Relay { client: &mut self.client, seq: 1, strip_track };
        // A refusal reached the client; the session goes on as the previous user.
        let Outcome::Ok(ok) = bconn::exchange(&mut self.backend.conn, None, &mut relay).await? else { return Ok(Flow::Continue) };
        self.state.reset();
        self.state.user = String::from_utf8_lossy(&cu.user).into();
        self.state.schema = (!cu.database.is_empty()).then(|| String::from_utf8_lossy(&cu.database).into());
        // (TiDB: a move logs in as the new user.)
        if let Some(p) = self.who.profile.as_mut() {
            p.set_user(&cu.user);
        }
        if let Ok(ok) = sluice_proto::basic::Ok::parse(&ok, self.backend_caps() & cap::SESSION_TRACK != 0) {
            self.state.status = ok.status;
        }
        self.handle.publish(&self.state);
        Ok(Flow::Continue)
    }
}

impl Session {
    /// COM_CHANGE_USER in users mode: sluice checks the new user's reply (computed over the
    /// scramble of the session's greeting), then changes the backend connection's user with the
    /// credentials it holds. On failure the session keeps its previous user, as the server does.
    async fn change_user_users(&mut self, cu: ChangeUser) -> Result<Flow> {
        let name = String::from_utf8_lossy(&cu.user).into_owned();
        let plugin = cu.auth_plugin.clone().unwrap_or_else(|| sluice_proto::auth::NATIVE.to_vec());
        let (verdict, seq) =
            verify(&mut self.client, 1, &self.ctx.users, self.ctx.rsa.as_ref(), &name, &plugin, &cu.auth_response, &self.who.scramble)
                .await
                .map_err(|e| Error::io(Side::Client, "change user", e))?;
        let user = match verdict {
            Verdict::Accepted(u) => u,
            Verdict::Denied { used_password } => {
                let msg = format!("Access denied for user '{name}' (using password: {})", if used_password { "YES" } else { "NO" });
                self.client_error(seq, code::ACCESS_DENIED, b"28000", &msg).await;
                return Ok(Flow::Continue);
            }
        };
        if user.require_tls && !self.client.stream.is_tls() {
            self.client_error(seq, code::SECURE_TRANSPORT_REQUIRED, b"HY000", &format!("user '{name}' must connect with TLS")).await;
            return Ok(Flow::Continue);
        }
        // Held by this function until the change succeeds: every early return gives it back.
        let Some(slot) = user.acquire() else {
            let msg = format!("User '{name}' has exceeded the 'max_user_connections' resource");
            self.client_error(seq, code::TOO_MANY_USER_CONNECTIONS, b"42000", &msg).await;
            return Ok(Flow::Continue);
        };
        let Some(cred) = user.credential() else {
            self.client_error(seq, code::UNKNOWN_ERROR, b"HY000", "sluice holds no credential for this user yet").await;
            return Ok(Flow::Continue);
        };
        let backend_cu = ChangeUser {
            user: cu.user.clone(),
            auth_response: Vec::new(),
            database: cu.database.clone(),
            collation: Some(cu.collation.unwrap_or(self.state.collation as u16)),
            auth_plugin: Some(SWITCH_PLUGIN.to_vec()),
            attributes: cu.attributes.clone(),
        };
        let mut payload = Vec::new();
        backend_cu.write(&mut payload);
        self.backend.conn.write_packet(&payload, 0).await.map_err(|e| Error::io(Side::Backend, "change user", e))?;
        match bconn::answer_auth(&self.backend.guard, &mut self.backend.conn, &cred).await {
            Ok(ok) => {
                let ok = if self.client_caps() & cap::SESSION_TRACK == 0 {
                    sluice_proto::basic::strip_session_track(&ok, self.backend.mariadb).unwrap_or(ok)
                } else {
                    ok
                };
                self.client.write_packet(&ok, seq).await.map_err(|e| Error::io(Side::Client, "change user", e))?;
                // The previous user's slot is given back.
                self.who.user_slot = Some(slot);
                self.who.credential = Some(cred);
                self.release_statements();
                self.state.reset();
                self.state.user = name.into();
                self.state.schema = (!cu.database.is_empty()).then(|| String::from_utf8_lossy(&cu.database).into());
                // A later login on the session's behalf is as the new user.
                if let Some(p) = self.who.profile.as_mut() {
                    p.set_user(&cu.user);
                }
                if let Some(k) = self.backend.key.as_mut() {
                    k.user = self.state.user.clone();
                }
                self.conn_was_reset();
                self.track_variables(super::statement::TRACKS_VARIABLES | super::statement::TRACKS_STATE).await;
                self.handle.publish(&self.state);
                Ok(Flow::Continue)
            }
            Err(e) if e.code != code::SERVER_LOST => {
                self.client_error(seq, e.code, &e.sql_state, &e.message).await;
                Ok(Flow::Continue)
            }
            Err(e) => Err(e),
        }
    }
}

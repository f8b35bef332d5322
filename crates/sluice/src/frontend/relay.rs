//! The command relay: read a command from the client, forward it, follow the backend's response
//! header by header while writing it to the client straight from the read buffer, update the
//! session state, repeat.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Buf;
use sluice_proto::consts::{com, err as code};
use sluice_proto::packet::{HEADER, Header, RequestWalker};
use sluice_proto::response::Expect;

use super::client::ClientConn;
use super::idle::Wait;
use super::login::LoggedIn;
use super::response::relay_response;
use super::rules::Plan;
use super::session::{BackendSide, Ended, Flow, INSPECT_LIMIT, Identity, Routing, Session, tracker};
use super::statement::Done;
use crate::backend::shared::Key;
use crate::ctx::Ctx;
use crate::error::{Error, Result, Retry, Side};
use crate::metrics::{Split, mono_ns};
use crate::route::digest::Outcome;
use crate::session::deadline::Watch;
use crate::session::{SessionHandle, StateSink};
use sluice_proto::sql::SqlPrepare;

/// Where a command goes.
enum Route {
    Relay(Expect),
    Quit,
    Unsupported,
    Kill(super::commands::KillPlan),
    ChangeUser,
}

/// The sink that follows a command's response into the session's state: `preparing`, the text
/// of a statement being prepared; `command`, what the command expects and the statement it
/// names (only an execute that asked for a cursor, or a fetch from one, moves its state).
fn sink_for<'a>(
    state: &'a mut crate::session::SessionState,
    preparing: Option<&'a [u8]>,
    (expect, stmt_id): (Expect, Option<u32>),
    conn_gen: u32,
    cache: bool,
    sums: Option<Box<crate::capture::sums::RowSums>>,
) -> StateSink<'a> {
    let mut sink = StateSink::new(state);
    sink.preparing = preparing;
    sink.executing = matches!(expect, Expect::Cursor | Expect::Rows).then_some(stmt_id).flatten();
    sink.conn_gen = conn_gen;
    sink.capture = cache.then(Vec::new);
    sink.sums = sums;
    sink
}

/// What the relay of a command leaves to account for.
struct Relayed {
    /// When the request was forwarded (`mono_ns()`).
    started: u64,
    rows: u64,
    /// The answer as the client got it, for the result cache.
    answer: Option<Vec<u8>>,
    /// The capture's record of the response.
    response: Option<super::capture::Response>,
}

impl Relayed {
    /// What the sink gathered of the response; what it did to the session goes to `done`.
    /// `log`: transaction replay's, when the command was logged (it notes the result).
    fn of(sink: &mut StateSink<'_>, done: &mut Done, recording: bool, started: u64, log: Option<&mut super::trxlog::TrxLog>) -> Relayed {
        if let Some(log) = log {
            log.noted(sink, recording);
        }
        let rows = sink.rows;
        let response = recording.then(|| super::capture::Response {
            error: sink.error,
            stmt_id: sink.prepared_id,
            rows,
            affected: sink.affected,
            sums: sink.sums.take(),
        });
        done.error = sink.error;
        done.changed |= sink.changed;
        done.prepared_id = sink.prepared_id;
        done.warnings = sink.warnings;
        done.reported = sink.reported;
        Relayed { started, rows, answer: sink.capture.take(), response }
    }
}

/// What [`Session::after_response`] leaves to do on the backend connection: a statement to
/// close there (the client's id now names another), variable tracking to turn on again (after
/// COM_RESET_CONNECTION).
struct Later {
    close: Option<u32>,
    /// Which of the client's own tracking settings to read back first (`statement::TRACKS_*`).
    track: Option<u8>,
}

impl Session {
    pub fn new(ctx: Arc<Ctx>, handle: Arc<SessionHandle>, l: LoggedIn, multiplex: bool) -> Session {
        let config = ctx.config.get();
        let mut client = ClientConn::new(l.client, l.compression);
        client.write_timeout = config.proxy.client_write_timeout;
        client.read_timeout = config.proxy.client_read_timeout;
        let key = (l.credential.is_some() && l.profile.is_some())
            .then(|| Box::new(Key { user: l.state.user.clone(), fit: l.fit, collation: l.state.collation, attrs: l.conn_attrs }));
        let split = config.routing.split && key.is_some();
        let replays = config.replays_transactions() && key.is_some();
        let optimistic = split && config.routing.optimistic_transactions;
        handle.split.store(split, Ordering::Relaxed);
        let multiplex = (multiplex || split) && key.is_some();
        let mut state = l.state;
        state.stmt_ids_mapped |= multiplex;
        let client_ip = handle.info.lock().client.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
        if multiplex && client.compression().is_none() {
            handle.parking.allow(config.proxy.park_every_command);
        }
        let tracker = tracker(l.client_caps, l.backend_caps, l.mariadb, state.tracked.as_deref());
        Session {
            ctx,
            handle,
            config,
            client,
            client_caps: l.client_caps,
            client_ip,
            state,
            who: Identity { credential: l.credential, scramble: l.scramble, user_slot: l.user_slot, profile: l.profile },
            backend: BackendSide {
                conn: l.backend,
                guard: l.guard,
                tracker,
                caps: l.backend_caps,
                mariadb: l.mariadb,
                carries: l.conn,
                key,
                slot: l.slot,
                taken: 0,
                touched: false,
                lost: None,
                fit: l.fit,
                unreported: None,
            },
            route: Routing {
                multiplex,
                split,
                causal: None,
                pinned: 0,
                replay: (replays || optimistic).then(|| Box::new(super::trxlog::TrxLog::new(replays))),
                optimistic,
            },
            capture: None,
            waker: None,
            idle_since: None,
            resumed: false,
        }
    }

    pub(super) fn client_caps(&self) -> u32 {
        self.client_caps
    }

    pub(super) fn backend_caps(&self) -> u32 {
        self.backend.caps
    }

    /// Readies a session that has just logged in for its first command.
    pub fn start(&mut self) {
        self.handle.publish(&self.state);
        // A multiplexed session holds no connection until its first statement.
        if self.route.multiplex {
            self.detach();
        }
    }

    /// Serves commands until the session ends (`Ended::Done`), or until it parks, idle
    /// (`idle/`), from where it resumes here.
    pub async fn resume(&mut self) -> Result<Ended> {
        loop {
            let h = match self.wait_command().await? {
                Wait::Command(h) => h,
                Wait::End => return Ok(Ended::Done),
                Wait::Park => return Ok(Ended::Parked),
                Wait::HandedOff => return Ok(Ended::HandedOff),
            };
            self.handle.busy.store(true, Ordering::Relaxed);
            let flow = self.command(h).await;
            self.handle.busy.store(false, Ordering::Relaxed);
            if self.capture.is_some() {
                self.capture_result();
            }
            match flow? {
                Flow::Continue => {}
                Flow::Close => return Ok(Ended::Done),
            }
            // (Passthrough sessions only when a move is asked, or forced on TiDB for tests.)
            let forced = self.who.profile.is_some() && self.config.proxy.move_every_statement;
            if (self.backend.key.is_some() || self.handle.move_asked() || forced) && self.settle().await? {
                return Ok(Ended::Done);
            }
            if self.ctx.is_draining() && !self.state.in_transaction() {
                return Ok(Ended::Done);
            }
        }
    }

    /// Handles one command whose first packet header is `h`.
    async fn command(&mut self, mut h: Header) -> Result<Flow> {
        // The common path is synchronous: steps that may wait are entered only when they must.
        let Some(cmd) = self.command_byte(h) else { return Err(Box::pin(self.bad_command(h)).await) };
        // A capture's consistent start, or the primary changing: the command waits.
        let capture = self.ctx.capture.generation();
        let capture = if self.gated(capture) { Box::pin(self.wait_gates(capture)).await? } else { capture };
        // Plan: its record, its statement read once, its rule (which may answer it, or rewrite
        // it), where it should run.
        let mut plan = self.plan(cmd, h, capture);
        if plan.rule.is_some()
            && let Some(flow) = Box::pin(self.rule_before(&mut plan, cmd, &mut h)).await?
        {
            return Ok(flow);
        }
        let body_end = HEADER + h.len.min(INSPECT_LIMIT);
        // The read/write split and the rules' routes: where the statement should run.
        plan.aim = if self.route.split || plan.route.is_some() { self.wants(cmd, body_end, plan.route, plan.class) } else { None };
        // Checkout: the connection the command runs on.
        if let Some((target, _)) = plan.aim
            && self.leaves_replica(target)
            && let Some(flow) = Box::pin(self.leave_replica_for(target)).await?
        {
            return Ok(flow);
        }
        if cmd != com::QUIT
            && (self.backend.lost.is_some() || self.backend.conn.is_detached())
            && let Err(e) = self.take_connection(cmd, plan.aim).await?
        {
            return self.refuse_command(e).await;
        }
        // Dispatch: what the command is (relayed, or handled apart), and what it leaves.
        let mut done = Done { scanned: plan.hazards, ..Done::default() };
        let expect = match self.route(cmd, body_end, &mut done) {
            Route::Relay(expect) => expect,
            // Rare paths are boxed: their state stays out of every idle session's task.
            apart => return Box::pin(self.handle_apart(apart, cmd, h)).await,
        };
        let stmt_id = self.client.rbuf.get(HEADER + 1..HEADER + 5).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if (self.state.stmt_ids_mapped || cmd == com::STMT_EXECUTE)
            && let Some(need) = self.statement_ids_now(cmd, h, stmt_id)?
            && let Some(flow) = Box::pin(self.statement_ids_apart(need, cmd, h)).await?
        {
            return Ok(flow);
        }
        self.note_request(cmd, body_end, stmt_id, &mut done);
        // Relay: the request forwarded (at once when the socket takes it), the response followed.
        let started = mono_ns();
        // Causal reads: the wait for the session's last write goes first, in the same round trip.
        let causal = if self.causal_due() { Box::pin(self.send_causal_wait(HEADER + h.len)).await? } else { None };
        let _timer = if plan.rule.is_some() { self.watch_timeout(&plan) } else { None };
        let logged = self.logs_for_replay(causal.is_some(), cmd, h.len, stmt_id);
        let mut walk = RequestWalker::request();
        let request_seq = match if logged { Some(0) } else { self.forward_now(&mut walk)? } {
            None => walk.last_seq,
            Some(unsent) => match self.send_request(logged, walk, unsent).await? {
                Ok(seq) => seq,
                Err(flow) => return Ok(flow),
            },
        };
        if let Some(copy) = causal {
            Box::pin(self.causal_outcome(copy, expect)).await?;
        }
        let sums = self.response_sums(plan.recording, logged);
        let preparing = done.preparing.take();
        let mut sink = sink_for(&mut self.state, preparing.as_deref(), (expect, stmt_id), self.backend.taken, plan.cache.is_some(), sums);
        let watch = Watch { clock: &self.ctx.clock, handle: &self.handle, waker: &mut self.waker };
        self.backend.tracker.start(expect, request_seq);
        let (tracker, client) = (&mut self.backend.tracker, Some(&mut self.client));
        match relay_response(tracker, &mut self.backend.conn, client, &mut sink, &self.ctx, watch, logged).await {
            Err(e) if e.retry == Retry::Unanswered => return Box::pin(self.recover(e, true)).await,
            r => r?,
        }
        let relayed = Relayed::of(&mut sink, &mut done, plan.recording, started, self.route.replay.as_deref_mut().filter(|_| logged));
        // Account: statistics, the capture's record, what the session is now.
        let later = self.account(cmd, &plan, relayed, Done { preparing, ..done });
        if later.close.is_some() || later.track.is_some() || self.backend.unreported.is_some() {
            Box::pin(self.after_response_on_backend(later)).await?;
        }
        Ok(Flow::Continue)
    }

    /// Whether transaction replay logs the command about to be relayed, noted when it does (a
    /// causal read's only when transactions are optimistic).
    #[inline]
    fn logs_for_replay(&mut self, causal: bool, cmd: u8, len: usize, stmt_id: Option<u32>) -> bool {
        self.route.replay.is_some() && (!causal || self.route.optimistic) && self.note_for_replay(cmd, len, stmt_id)
    }

    /// Whether the command waits first: at a capture's gate (`capture`: its generation), or
    /// while the primary changes, out of a transaction.
    #[inline]
    fn gated(&self, capture: u64) -> bool {
        let held = self.backend.key.is_some() && self.ctx.backends.topology.is_held();
        (capture & crate::capture::GATE != 0 || held) && !self.state.in_transaction()
    }

    /// Waits at a capture's gate (`capture`: its generation) or while the primary changes; the
    /// capture's generation after.
    async fn wait_gates(&mut self, mut capture: u64) -> Result<u64> {
        if capture & crate::capture::GATE != 0 {
            capture = self.wait_gate().await;
        }
        if self.backend.key.is_some() && self.ctx.backends.topology.is_held() {
            self.wait_primary().await?;
        }
        Ok(capture)
    }

    /// A command not relayed as it is.
    async fn handle_apart(&mut self, route: Route, cmd: u8, h: Header) -> Result<Flow> {
        match route {
            Route::Relay(_) | Route::Quit => Ok(Flow::Close),
            Route::Unsupported => self.unsupported(cmd).await,
            Route::Kill(kill) => self.run_kill(kill).await,
            Route::ChangeUser => self.change_user(h).await,
        }
    }

    /// The row sums a response is followed with: for a capture's record, or transaction
    /// replay's log.
    fn response_sums(&mut self, recording: bool, logged: bool) -> Option<Box<crate::capture::sums::RowSums>> {
        if recording {
            Some(self.capture_sums())
        } else if logged {
            self.replay_sums()
        } else {
            None
        }
    }

    /// The plan's synchronous part: the command counted (and recorded when a capture takes it),
    /// its statement read once ([`Session::see`]).
    #[inline]
    fn plan(&mut self, cmd: u8, h: Header, capture: u64) -> Plan {
        let recording = self.begin_command(cmd, h, capture);
        let mut plan = if self.looks_at_statements() { self.see(cmd, HEADER + h.len.min(INSPECT_LIMIT), h.len) } else { Plan::default() };
        plan.recording = recording;
        plan
    }

    /// Counts the command, and records it when a capture (`capture`: its generation) takes it.
    /// Whether it is recorded.
    fn begin_command(&mut self, cmd: u8, h: Header, capture: u64) -> bool {
        self.ctx.metrics.relay.command(cmd);
        self.handle.queries.fetch_add(1, Ordering::Relaxed);
        let recording = capture != 0 && self.capture_command(capture, cmd, h);
        // COM_PING changes nothing on the server.
        self.backend.touched |= cmd != com::PING && cmd != com::QUIT;
        recording
    }

    /// Answers a command sluice does not relay.
    async fn unsupported(&mut self, cmd: u8) -> Result<Flow> {
        self.skip_request().await?;
        let msg = format!("sluice does not relay this command ({} / 0x{cmd:02x})", com::name(cmd));
        self.client_error(1, code::UNKNOWN_COM, b"08S01", &msg).await;
        Ok(Flow::Continue)
    }

    /// What the request itself says the session will be once it succeeded: the text of a
    /// statement being prepared (re-preparing elsewhere needs it), COM_INIT_DB's schema,
    /// COM_SET_OPTION's multi-statements; and what changes before it is sent.
    fn note_request(&mut self, cmd: u8, body_end: usize, stmt_id: Option<u32>, done: &mut Done) {
        done.preparing = (cmd == com::STMT_PREPARE).then(|| self.client.rbuf[HEADER + 1..body_end].into());
        if cmd == com::INIT_DB {
            done.noted = Some(String::from_utf8_lossy(&self.client.rbuf[HEADER + 1..body_end]).into());
        }
        // COM_SET_OPTION: 0 turns multi-statements on, 1 off.
        done.multi_option = (cmd == com::SET_OPTION).then(|| self.client.rbuf.get(HEADER + 1) == Some(&0));
        done.changed = self.before_command(cmd, stmt_id);
    }

    /// The account of a relayed command: the capture's record of its response, its digest's
    /// outcome, the result cache, the backend's latency and activity, and what it left on the
    /// session (what is left to do on the backend connection is returned).
    fn account(&mut self, cmd: u8, plan: &Plan, r: Relayed, done: Done) -> Later {
        let (started, now) = (r.started, mono_ns());
        if let Some(response) = r.response {
            self.capture_response(response, started, now);
        }
        self.note_outcome(plan, Outcome { at: now, nanos: now.saturating_sub(started), rows: r.rows, error: done.error.is_some() });
        if let (Some(packets), None, false) = (r.answer, done.error, done.reported.state_changed) {
            self.keep_answer(plan, packets, r.rows);
        }
        self.backend.guard.metrics.latency.observe_nanos(now.saturating_sub(started));
        self.backend.guard.activity.record(now / 1_000_000);
        self.after_response(cmd, done)
    }

    /// The checks every command passes first; returns its command byte.
    fn command_byte(&self, h: Header) -> Option<u8> {
        if h.seq != 0 || h.len as u64 > self.config.proxy.max_packet_size {
            return None;
        }
        self.client.rbuf.get(HEADER).copied()
    }

    /// A split session's replica let go of for a statement bound for `target`, or its
    /// optimistic transaction moved to the primary. Some: the command was answered already.
    async fn leave_replica_for(&mut self, target: super::split::Target) -> Result<Option<Flow>> {
        if self.on_replica() && target == super::split::Target::Primary {
            return self.move_to_primary().await;
        }
        self.leave_replica().await?;
        Ok(None)
    }

    /// Makes sure the session holds a backend connection for a command: a lost one replaced
    /// (or the session ends), and a multiplexed session's taken. The inner error is the
    /// command's: no connection could be had for it.
    /// A split session's connection is taken where `aim` says.
    async fn take_connection(&mut self, cmd: u8, aim: Option<(super::split::Target, Split)>) -> Result<std::result::Result<(), Error>> {
        if let Some(reason) = self.backend.lost.take() {
            if self.may_replay() {
                return Box::pin(self.replay_after_idle_loss(&reason)).await;
            }
            Box::pin(self.move_or_fail(&reason)).await?;
        }
        if !self.backend.conn.is_detached() || (cmd == com::STMT_CLOSE && self.route.multiplex) {
            return Ok(Ok(()));
        }
        if let Some((target, why)) = aim {
            self.aim(target, why, cmd == com::QUERY);
        }
        // Boxed: a new login, a state to bring or a wait for a connection is the rare path, and
        // its future large.
        let mut taken = if let Err(found) = self.attach_at_once() { Box::pin(self.attach(found)).await } else { Ok(()) };
        if self.ctx.backends.topology.is_strict() {
            // (A backend that could not be reached, not one that refused.)
            taken = match taken {
                Err(e) if e.retry == Retry::Safe && !e.is_backend_refusal() => Box::pin(self.attach_when_primary(aim, e)).await,
                other => other,
            };
        }
        // A shared connection carries the statements no client holds any more, to close first.
        if taken.is_ok() && self.backend.carries.as_ref().is_some_and(|c| !c.to_close.is_empty()) {
            Box::pin(self.close_unheld()).await?;
        }
        Ok(taken)
    }

    /// What to do with a command: relay it expecting a response of some shape, or handle it
    /// apart. Notes in `done` what a query or an execute leaves (the pins that last one
    /// statement, user variables named, a SQL PREPARE or DEALLOCATE, recorded once it
    /// succeeded).
    fn route(&mut self, cmd: u8, body_end: usize, done: &mut Done) -> Route {
        match cmd {
            com::QUIT => return Route::Quit,
            com::BINLOG_DUMP
            | com::BINLOG_DUMP_GTID
            | com::REGISTER_SLAVE
            | com::TABLE_DUMP
            | com::CONNECT_OUT
            | com::DAEMON
            | com::CONNECT
            | com::DELAYED_INSERT
            | com::TIME
            | com::SLEEP => return Route::Unsupported,
            com::CHANGE_USER => return Route::ChangeUser,
            com::PROCESS_KILL | com::QUERY | com::STMT_PREPARE => {
                // (What the statement's shape says of KILL, before the pins take their bits.)
                let scanned = done.scanned;
                if self.who.credential.is_some() && cmd == com::QUERY {
                    self.note_query(body_end, done);
                } else if self.who.profile.is_some() && cmd == com::QUERY {
                    self.note_set_transaction(body_end, done);
                }
                if let Some(plan) = self.kill_in(cmd, body_end, scanned) {
                    return Route::Kill(plan);
                }
            }
            com::STMT_EXECUTE if !self.note_execute(done) => return Route::Relay(Expect::Results),
            _ => {}
        }
        let rbuf = &self.client.rbuf;
        Route::Relay(Expect::of(rbuf.get(HEADER..(HEADER + 6).min(rbuf.len())).unwrap_or(&[cmd])))
    }

    /// What a relayed command changed, once its response is through.
    fn after_response(&mut self, cmd: u8, done: Done) -> Later {
        let error = done.error;
        if let (Some(on), None) = (done.multi_option, error) {
            self.state.multi_statements = on;
        }
        let mut later = Later { close: done.prepared_id.and_then(|id| self.prepared_here(id)), track: None };
        let warnings = if done.warnings > 0 { crate::session::WARNINGS } else { 0 };
        let row_count = if self.state.reads_row_count { sluice_proto::sql::hazard::ROW_COUNT } else { 0 };
        let pin_next = done.next_pins | warnings | row_count;
        // (A pin for the next statement only, begun or ended, is shown too.)
        let pins_changed = pin_next != self.state.pin_next;
        self.state.pin_next = pin_next;
        match (done.noted, error) {
            (Some(db), None) if cmd == com::INIT_DB => self.state.schema = Some(db.into()),
            (Some(collation), None) => _ = self.state.variables.insert("collation_connection".into(), collation.into()),
            _ => {}
        }
        if done.reported.variables && self.route.split {
            self.note_write();
        }
        let explained = done.explained || (done.plain_set && done.reported.variables);
        // A server that reports no session state (TiDB) cannot say what a SET changed: sluice
        // reads back the variables it named; one it cannot name keeps the session on its
        // connection (it still moves by TiDB's session states).
        let untracked = done.plain_set && self.backend.caps & sluice_proto::consts::cap::SESSION_TRACK == 0;
        let unseen = untracked && self.backend.unreported.is_none();
        if (done.reported.state_changed && !explained || unseen)
            && matches!(cmd, com::QUERY | com::STMT_EXECUTE)
            && self.who.credential.is_some()
        {
            // A stored routine, most likely: what it left is unknown.
            self.state.hazards |= crate::session::HIDDEN_STATE;
            self.handle.publish(&self.state);
        }
        let transaction_changed = matches!(cmd, com::QUERY | com::STMT_EXECUTE)
            && self.who.credential.is_some()
            && (done.autocommit_off || self.state.status & sluice_proto::consts::status::AUTOCOMMIT == 0)
            && self.follow_transaction(done.autocommit_off, done.transaction);
        let sql_prepared = done.sql_prepare.is_some() && error.is_none();
        if let (Some(prepare), None) = (done.sql_prepare, error) {
            let (op, query) = *prepare;
            match op {
                SqlPrepare::Prepare(name) => self.state.sql_prepared.insert(String::from_utf8_lossy(&name).into_owned(), query),
                SqlPrepare::Deallocate(name) => self.state.sql_prepared.remove(String::from_utf8_lossy(&name).as_ref()),
            };
        }
        if done.sets_tracking != 0 && error.is_none() {
            // The client's own tracking is read back, and sluice's set again.
            later.track = Some(done.sets_tracking);
        }
        if cmd == com::RESET_CONNECTION && error.is_none() {
            self.conn_was_reset();
            // The reset also put the backend's variable tracking back to its default.
            later.track = Some(super::statement::TRACKS_VARIABLES | super::statement::TRACKS_STATE);
        }
        if self.after_command(cmd, error.is_none()) || done.changed || sql_prepared || pins_changed || transaction_changed {
            self.handle.publish(&self.state);
        } else {
            self.handle.publish_status(self.state.status);
        }
        later
    }

    /// Follows what the status flags do not show of a transaction (see
    /// `SessionState::open_transaction`); true when that changed.
    fn follow_transaction(&mut self, autocommit_off: bool, what: sluice_proto::sql::TransactionEnd) -> bool {
        use sluice_proto::sql::TransactionEnd;
        let off_now = self.state.status & sluice_proto::consts::status::AUTOCOMMIT == 0;
        let open = match what {
            _ if !off_now => false,
            TransactionEnd::Ends => false,
            TransactionEnd::Savepoint => autocommit_off || self.state.open_transaction,
            TransactionEnd::No => self.state.open_transaction,
        };
        let changed = open != self.state.open_transaction;
        self.state.open_transaction = open;
        changed
    }

    /// What a response leaves to do on the backend connection.
    async fn after_response_on_backend(&mut self, later: Later) -> Result<()> {
        if let Some(old) = later.close {
            self.close_on_backend(old).await?;
        }
        if let Some(read) = later.track {
            self.track_variables(read).await;
        }
        if let Some(names) = self.backend.unreported.take() {
            self.read_settings(&names).await?;
        }
        Ok(())
    }

    /// A command that cannot run (no connection could be had, a statement could not be
    /// prepared again): consumed, and answered with the error.
    pub(super) async fn refuse_command(&mut self, e: Error) -> Result<Flow> {
        self.skip_request().await?;
        let state = e.sql_state;
        self.client_error(1, e.code, &state, &e.message).await;
        Ok(Flow::Continue)
    }

    /// State changes known from the command itself; true when one ends a pin (an execute or
    /// reset ends the statement's long data and cursor), which the session then publishes.
    fn before_command(&mut self, cmd: u8, stmt_id: Option<u32>) -> bool {
        let prepared = stmt_id.and_then(|id| self.state.prepared.get_mut(&id));
        match (cmd, prepared) {
            (com::STMT_SEND_LONG_DATA, Some(p)) => p.long_data = true,
            (com::STMT_EXECUTE | com::STMT_RESET, Some(p)) => {
                let pinned = p.long_data || p.cursor;
                p.long_data = false;
                p.cursor = false;
                return pinned;
            }
            (com::STMT_CLOSE, Some(_)) => {
                if let Some(id) = stmt_id {
                    self.state.prepared.remove(&id);
                }
            }
            _ => {}
        }
        false
    }

    /// State changes that take effect when the command succeeded. Returns whether state changed.
    fn after_command(&mut self, cmd: u8, ok: bool) -> bool {
        if !ok {
            return false;
        }
        match cmd {
            com::INIT_DB => true,
            com::RESET_CONNECTION => {
                self.release_statements();
                self.state.reset();
                true
            }
            com::STMT_CLOSE | com::STMT_SEND_LONG_DATA => true,
            _ => false,
        }
    }

    /// Sends an ERR to the client (best effort: it may be gone). Boxed, like every rare path:
    /// its future stays out of the session's task.
    pub(super) async fn client_error(&mut self, seq: u8, code: u16, state: &[u8; 5], msg: &str) {
        if self.capture.is_some() {
            self.capture_error(code);
        }
        let _ = Box::pin(self.client.send_err(seq, code, state, msg)).await;
    }

    /// What [`Session::forward_now`] left of a request (`unsent`, for `walk`), forwarded; or,
    /// for a request transaction replay `logged`, all of it, after the commit mark when one is
    /// due, and recovered from when its connection is lost (the flow it left). Its last
    /// sequence number.
    async fn send_request(&mut self, logged: bool, mut walk: RequestWalker, unsent: usize) -> Result<std::result::Result<u8, Flow>> {
        if !logged {
            self.pipe_from_client(&mut walk, unsent).await?;
            return Ok(Ok(walk.last_seq));
        }
        if self.commit_mark_due()
            && let Some(flow) = Box::pin(self.mark_commit()).await?
        {
            return Ok(Err(flow));
        }
        match self.forward_request().await {
            Err(e) if e.side == Side::Backend => Box::pin(self.recover(e, false)).await.map(Err),
            r => r.map(Ok),
        }
    }

    /// Forwards a client request (one logical packet, of any size) to the backend; returns the
    /// sequence id of its last packet.
    pub(super) async fn forward_request(&mut self) -> Result<u8> {
        let mut walk = RequestWalker::request();
        if let Some(unsent) = self.forward_now(&mut walk)? {
            self.pipe_from_client(&mut walk, unsent).await?;
        }
        Ok(walk.last_seq)
    }

    /// Consumes a request without forwarding it.
    pub(super) async fn skip_request(&mut self) -> Result<()> {
        let mut walk = RequestWalker::request();
        loop {
            let n = walk.scan(&self.client.rbuf);
            self.client.rbuf.advance(n);
            if walk.done {
                return Ok(());
            }
            self.fill_client().await?;
        }
    }

    /// Boxed: its timer stays out of the command's future (a request that spans reads is rare).
    async fn fill_client(&mut self) -> Result<()> {
        match Box::pin(self.client.fill_rest()).await {
            Ok(0) => Err(Error::client("client closed the connection in the middle of a request")),
            Ok(_) => Ok(()),
            Err(e) => Err(Error::client_read("reading request", e)),
        }
    }

    /// Forwards what the client's buffer holds of a request, as `walk` delimits it, as far as
    /// the backend's socket takes it at once, with no future: None when the whole request went
    /// (the common case), else how many bytes at the front of the buffer are the request's and
    /// still to send, for [`Session::pipe_from_client`] to go on from.
    fn forward_now(&mut self, walk: &mut RequestWalker) -> Result<Option<usize>> {
        let n = walk.scan(&self.client.rbuf);
        let limit = self.config.proxy.max_packet_size;
        if walk.total > limit {
            self.ctx.metrics.reject(crate::metrics::Reject::PacketTooLarge);
            return Err(Error::client(format!("request of more than {limit} bytes exceeds max_packet_size")));
        }
        let sent = if n > 0 {
            let sent = self
                .backend
                .conn
                .stream
                .write_now(&self.client.rbuf[..n])
                .map_err(|e| Error::io(Side::Backend, "forwarding request", e))?;
            self.ctx.metrics.relay.bytes_from_clients(sent);
            self.client.rbuf.advance(sent);
            sent
        } else {
            0
        };
        Ok((sent < n || !walk.done).then_some(n - sent))
    }

    /// Forwards the rest of a request that [`Session::forward_now`] began: its `unsent` bytes
    /// at the front of the client's buffer, then the client's packets as `walk` delimits them.
    async fn pipe_from_client(&mut self, walk: &mut RequestWalker, mut unsent: usize) -> Result<()> {
        loop {
            if unsent > 0 {
                let limit = self.config.proxy.response_timeout;
                self.backend
                    .conn
                    .stream
                    .write_rest_within(limit, &self.client.rbuf[..unsent])
                    .await
                    .map_err(|e| Error::io(Side::Backend, "forwarding request", e))?;
                self.ctx.metrics.relay.bytes_from_clients(unsent);
                self.client.rbuf.advance(unsent);
            }
            if walk.done {
                return Ok(());
            }
            self.fill_client().await?;
            match self.forward_now(walk)? {
                None => return Ok(()),
                Some(n) => unsent = n,
            }
        }
    }
}

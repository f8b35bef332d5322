//! Session state, owned in one place.
//!
//! [`SessionState`] is everything a client session has changed on its backend connection: the
//! user, schema, collation, transaction status, session variables, prepared statements, and the
//! reasons it is pinned to its backend. The session task owns it and updates it from the
//! commands it relays and the responses it follows; pooling, migration and capture read it.
//! A copy is published to the session's [`SessionHandle`] after each command that changed it,
//! which is what the admin API shows.

use std::collections::HashMap;

use crate::vars::Vars;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Instant, SystemTime};

use parking_lot::Mutex;
use serde::Serialize;
use sluice_proto::basic::{self, StateChange};
use sluice_proto::consts::status;
use sluice_proto::response::Sink;

use crate::metrics::MoveReason;

/// A prepared statement as the client knows it.
#[derive(Debug, Clone, Serialize)]
pub struct Prepared {
    /// The id the backend knows it by (the client's id, unless the session moved).
    pub backend_id: u32,
    pub sql: String,
    pub params: u16,
    pub columns: u16,
    /// COM_STMT_SEND_LONG_DATA was sent and not yet consumed by an execute.
    pub long_data: bool,
    /// A cursor is open on it (COM_STMT_FETCH may follow).
    pub cursor: bool,
    /// The parameter types of the last execute that sent them (2 bytes per parameter):
    /// clients send them once, and a statement re-prepared elsewhere needs them again.
    #[serde(skip)]
    pub param_types: Vec<u8>,
    /// The backend connection has not been sent the parameter types yet (after a move).
    #[serde(skip)]
    pub types_unsent: bool,
    /// Which of the session's connections `backend_id` belongs to (the session's count of
    /// connections taken when it was prepared there).
    #[serde(skip)]
    pub conn_gen: u32,
    /// What the lexer finds in its text (`sluice_proto::sql::hazard` bits): each execute
    /// leaves them as a query would.
    #[serde(skip)]
    pub hazards: u16,
    /// Where the read/write split runs it (`sluice_proto::rw::classify` of its text, once).
    #[serde(skip)]
    pub class: sluice_proto::rw::Class,
}

/// Why a session cannot leave its backend connection right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pin {
    /// A transaction is open.
    Transaction,
    /// A cursor is open on a prepared statement.
    Cursor,
    /// Long data was sent for a prepared statement that has not been executed.
    LongData,
    /// Sluice relays the client's login and holds no credentials to log in elsewhere.
    PassthroughAuth,
    /// User variables were set and not read back yet (a session that does not multiplex reads
    /// them back only when it moves on purpose), or hold a value sluice cannot write back.
    UserVariables,
    /// A temporary table may exist.
    TemporaryTable,
    /// A named lock or a table lock may be held.
    Lock,
    /// A statement was prepared with SQL `PREPARE`.
    SqlPrepare,
    /// A table handler may be open (`HANDLER ... OPEN`).
    Handler,
    /// An XA transaction may be open or prepared.
    Xa,
    /// `SET TRANSACTION` set the next transaction's characteristics (until the next statement).
    SetTransaction,
    /// `SQL_CALC_FOUND_ROWS` ran: `FOUND_ROWS()` may follow (until the next statement).
    FoundRows,
    /// The session reads `ROW_COUNT()`: it stays for the statement after each one.
    RowCount,
    /// The last statement left warnings: `SHOW WARNINGS` may follow (until the next statement).
    Warnings,
    /// The server reported a change of session state that the statement's text does not
    /// explain: a stored routine ran that may have set user variables, created a temporary
    /// table, taken a lock or changed the role.
    HiddenState,
}

impl Pin {
    pub const ALL: [Pin; 15] = [
        Pin::Transaction,
        Pin::Cursor,
        Pin::LongData,
        Pin::PassthroughAuth,
        Pin::UserVariables,
        Pin::TemporaryTable,
        Pin::Lock,
        Pin::SqlPrepare,
        Pin::Handler,
        Pin::Xa,
        Pin::SetTransaction,
        Pin::FoundRows,
        Pin::RowCount,
        Pin::Warnings,
        Pin::HiddenState,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Pin::Transaction => "transaction",
            Pin::Cursor => "cursor",
            Pin::LongData => "long_data",
            Pin::PassthroughAuth => "passthrough_auth",
            Pin::UserVariables => "user_variables",
            Pin::TemporaryTable => "temporary_table",
            Pin::Lock => "lock",
            Pin::SqlPrepare => "sql_prepare",
            Pin::Handler => "handler",
            Pin::Xa => "xa",
            Pin::SetTransaction => "set_transaction",
            Pin::FoundRows => "found_rows",
            Pin::RowCount => "row_count",
            Pin::Warnings => "warnings",
            Pin::HiddenState => "hidden_state",
        }
    }
}

/// A [`SessionState::pin_next`] bit beside the `hazard` ones: the last statement left warnings.
pub const WARNINGS: u16 = 1 << 15;

/// A [`SessionState::hazards`] bit beside the lexer's: the server reported a state change that
/// the statement's text does not explain ([`Pin::HiddenState`]).
pub const HIDDEN_STATE: u16 = 1 << 14;

/// Most user variables a session may have sluice carry between connections; past it the
/// session stays on its connection.
pub const MAX_USER_VARIABLES: usize = 64;

/// Serializes a map's keys only (user variables: their values may be secrets).
fn names_only<S: serde::Serializer>(m: &Vars, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_seq(m.keys())
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionState {
    pub user: String,
    pub schema: Option<String>,
    pub collation: u8,
    /// Server status flags from the last OK/EOF.
    pub status: u16,
    /// Session variables the backend reported as changed (SESSION_TRACK).
    pub variables: Vars,
    /// By statement id; FxHash, since it is looked up on every execute.
    pub prepared: HashMap<u32, Prepared, rustc_hash::FxBuildHasher>,
    pub multi_statements: bool,
    pub passthrough: bool,
    /// State the session's statements left on its backend connection that sluice cannot
    /// recreate elsewhere (`sluice_proto::sql::hazard::LASTING` bits), until the next reset.
    pub hazards: u16,
    /// What the last statement left that only the next one may read on the same connection
    /// (`hazard::SET_TRANSACTION`, `FOUND_ROWS`, `ROW_COUNT`, [`WARNINGS`]).
    pub pin_next: u16,
    /// The session reads `ROW_COUNT()`: every statement pins it for the next one.
    pub reads_row_count: bool,
    /// What `LAST_INSERT_ID()` returns: the last id an insert generated (0: none yet).
    pub last_insert_id: u64,
    /// The GTID of the session's last transaction that wrote (MariaDB's read-only `last_gtid`,
    /// reported by session tracking with the binary log on; empty: none yet). Not a variable to
    /// restore elsewhere.
    pub last_gtid: String,
    /// Statements prepared with SQL `PREPARE name FROM '...'`, by lowercased name: the query
    /// that prepared each, which prepares it again on another connection.
    pub sql_prepared: Vars,
    /// User variables by lowercased name, each as the SQL literal that sets its value again
    /// (read back from the connection at a safe point). Only the names are shown.
    #[serde(serialize_with = "names_only")]
    pub user_variables: Vars,
    /// User variables that statements named since the last read-back: their values on the
    /// connection may differ from `user_variables`.
    pub unread_variables: Vec<String>,
    /// Statement ids as the client knows them differ from the backend's (the session moved).
    pub stmt_ids_mapped: bool,
    /// The next client-side statement id, once ids are mapped.
    pub next_stmt_id: u32,
}

impl SessionState {
    pub fn in_transaction(&self) -> bool {
        self.status & status::IN_TRANS != 0
    }

    /// Every reason the session is pinned to its backend connection now.
    pub fn pins(&self) -> Vec<Pin> {
        let mut v = Vec::new();
        if self.in_transaction() {
            v.push(Pin::Transaction);
        }
        if self.prepared.values().any(|p| p.cursor) {
            v.push(Pin::Cursor);
        }
        if self.prepared.values().any(|p| p.long_data) {
            v.push(Pin::LongData);
        }
        if self.passthrough {
            v.push(Pin::PassthroughAuth);
        }
        use sluice_proto::sql::hazard;
        if !self.unread_variables.is_empty() && self.hazards & hazard::USER_VARIABLE == 0 {
            v.push(Pin::UserVariables);
        }
        for (bit, pin) in [
            (hazard::USER_VARIABLE, Pin::UserVariables),
            (hazard::TEMPORARY_TABLE, Pin::TemporaryTable),
            (hazard::LOCK, Pin::Lock),
            (hazard::SQL_PREPARE, Pin::SqlPrepare),
            (hazard::HANDLER, Pin::Handler),
            (hazard::XA, Pin::Xa),
            (HIDDEN_STATE, Pin::HiddenState),
        ] {
            if self.hazards & bit != 0 {
                v.push(pin);
            }
        }
        for (bit, pin) in [
            (hazard::SET_TRANSACTION, Pin::SetTransaction),
            (hazard::FOUND_ROWS, Pin::FoundRows),
            (hazard::ROW_COUNT, Pin::RowCount),
            (WARNINGS, Pin::Warnings),
        ] {
            if self.pin_next & bit != 0 {
                v.push(pin);
            }
        }
        v
    }

    /// Whether a multiplexed session may give its connection back now: it could move, and
    /// the last statement left nothing for the next one to read there.
    pub fn detachable(&self) -> bool {
        self.pin_next == 0 && self.movable()
    }

    /// Whether sluice could recreate this session on a new backend connection now: it holds
    /// credentials, and nothing it cannot recreate is open.
    pub fn movable(&self) -> bool {
        !self.passthrough && self.hazards == 0 && self.at_safe_point()
    }

    /// The id the backend knows a client's statement id by. Unknown ids map to one no backend
    /// hands out, so that they get the backend's own "unknown statement" error.
    pub fn backend_stmt_id(&self, client_id: u32) -> u32 {
        match self.prepared.get(&client_id) {
            Some(p) => p.backend_id,
            None if client_id == u32::MAX => u32::MAX,
            None => u32::MAX - 1,
        }
    }

    /// Whether the session could be moved to another backend connection between commands.
    pub fn at_safe_point(&self) -> bool {
        !self.in_transaction() && !self.prepared.values().any(|p| p.cursor || p.long_data)
    }

    /// Applies the session-state block of an OK. Returns what it reported: a state change, and
    /// a change of schema or of a variable (which explains a state change).
    pub fn apply_ok(&mut self, ok: &basic::Ok<'_>) -> Reported {
        let mut r = Reported::default();
        for change in basic::state_changes(ok.session_state) {
            match change {
                StateChange::Schema(s) => {
                    r.variables = true;
                    // (No schema at all is reported as an empty one.)
                    self.schema = (!s.is_empty()).then(|| String::from_utf8_lossy(s).into_owned());
                }
                StateChange::SystemVariable { name, value } if name.eq_ignore_ascii_case(b"last_gtid") => {
                    r.variables = true;
                    self.last_gtid.clear();
                    self.last_gtid.push_str(&String::from_utf8_lossy(value));
                }
                StateChange::SystemVariable { name, value } => {
                    r.variables = true;
                    self.variables.insert(String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned());
                }
                StateChange::StateChanged => r.state_changed = true,
                _ => {}
            }
        }
        r
    }

    /// Forgets what COM_RESET_CONNECTION or COM_CHANGE_USER resets on the server.
    pub fn reset(&mut self) {
        self.prepared.clear();
        self.variables.clear();
        self.hazards = 0;
        self.pin_next = 0;
        self.last_insert_id = 0;
        self.sql_prepared.clear();
        self.user_variables.clear();
        self.unread_variables.clear();
        self.status &= !status::IN_TRANS;
    }
}

/// What the session-state blocks of a response reported.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reported {
    /// The server's session state changed (`session_track_state_change`).
    pub state_changed: bool,
    /// A schema or a system variable was reported (a stored routine of another schema
    /// reports the schema it returns to).
    pub variables: bool,
}

impl std::ops::BitOrAssign for Reported {
    fn bitor_assign(&mut self, o: Reported) {
        self.state_changed |= o.state_changed;
        self.variables |= o.variables;
    }
}

/// Updates the state from the response of one command (the tracker's sink).
pub struct StateSink<'a> {
    pub state: &'a mut SessionState,
    /// The statement being prepared, when the command is COM_STMT_PREPARE.
    pub preparing: Option<&'a [u8]>,
    /// The statement executed, when the command is COM_STMT_EXECUTE or COM_STMT_FETCH.
    pub executing: Option<u32>,
    pub error: Option<u16>,
    pub changed: bool,
    /// The client-side id to write into the PREPARE_OK just parsed (when ids are mapped).
    pub patch_stmt_id: Option<u32>,
    /// The warning count of the last result.
    pub warnings: u16,
    /// The session's count of connections taken (see [`Prepared::conn_gen`]).
    pub conn_gen: u32,
    /// The client id of the statement the PREPARE_OK just parsed made.
    pub prepared_id: Option<u32>,
    /// What the OKs' session-state blocks reported.
    pub reported: Reported,
    /// Rows sent.
    pub rows: u64,
    /// Affected rows, summed over the results.
    pub affected: u64,
    /// Checksums of the rows (a capture records this command).
    pub sums: Option<Box<crate::capture::sums::RowSums>>,
    /// The answer's packets as the client got them, for the result cache (None: not kept).
    pub capture: Option<Vec<u8>>,
}

impl<'a> StateSink<'a> {
    pub fn new(state: &'a mut SessionState) -> StateSink<'a> {
        StateSink {
            state,
            preparing: None,
            executing: None,
            error: None,
            changed: false,
            patch_stmt_id: None,
            warnings: 0,
            conn_gen: 0,
            prepared_id: None,
            reported: Reported::default(),
            rows: 0,
            affected: 0,
            sums: None,
            capture: None,
        }
    }
}

impl StateSink<'_> {
    /// Status flags are published through an atomic by the caller; only a change of cursor
    /// state marks the state as changed here.
    fn status(&mut self, st: u16) {
        self.state.status = st;
        if let Some(p) = self.executing.and_then(|id| self.state.prepared.get_mut(&id)) {
            let cursor = st & status::CURSOR_EXISTS != 0 && st & status::LAST_ROW_SENT == 0;
            if p.cursor != cursor {
                p.cursor = cursor;
                self.changed = true;
            }
        }
    }
}

impl Sink for StateSink<'_> {
    fn ok(&mut self, ok: &basic::Ok<'_>) {
        if !ok.session_state.is_empty() {
            self.changed = true;
            self.reported |= self.state.apply_ok(ok);
        }
        if ok.last_insert_id != 0 {
            self.state.last_insert_id = ok.last_insert_id;
        }
        self.warnings = ok.warnings;
        self.affected = self.affected.saturating_add(ok.affected_rows);
        self.status(ok.status);
    }

    fn eof(&mut self, st: u16, warnings: u16) {
        self.warnings = warnings;
        self.status(st);
    }

    fn err(&mut self, e: &basic::Err<'_>) {
        self.error = Some(e.code);
    }

    fn row(&mut self, payload: &[u8]) {
        self.rows += 1;
        if let Some(s) = self.sums.as_mut() {
            s.row(payload);
        }
    }

    fn row_more(&mut self, bytes: &[u8]) {
        if let Some(s) = self.sums.as_mut() {
            s.more(bytes);
        }
    }

    fn prepared(&mut self, id: u32, columns: u16, params: u16) {
        let sql = String::from_utf8_lossy(self.preparing.unwrap_or_default()).into_owned();
        let client_id = if self.state.stmt_ids_mapped {
            let c = self.state.next_stmt_id;
            self.state.next_stmt_id = c.wrapping_add(1).max(1);
            self.patch_stmt_id = Some(c);
            c
        } else {
            id
        };
        // (Only a session that may change connections acts on them.)
        let hazards = if self.state.passthrough { 0 } else { sluice_proto::sql::hazards(sql.as_bytes()) };
        let class = sluice_proto::rw::classify(sql.as_bytes());
        let p = Prepared {
            backend_id: id,
            sql,
            params,
            columns,
            long_data: false,
            cursor: false,
            param_types: Vec::new(),
            types_unsent: false,
            conn_gen: self.conn_gen,
            hazards,
            class,
        };
        self.state.prepared.insert(client_id, p);
        self.prepared_id = Some(client_id);
        self.changed = true;
    }
}

/// What the admin API shows of a session.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    pub id: u32,
    pub client: String,
    pub listener: String,
    /// The client's connection to sluice is TLS.
    pub tls: bool,
    /// Sluice's connection to the backend is TLS.
    pub backend_tls: bool,
    pub compressed: bool,
    pub connected_at_unix: u64,
    pub backend: Option<String>,
    pub backend_thread_id: Option<u32>,
    pub state: SessionState,
    pub pins: Vec<Pin>,
    pub safe_point: bool,
    /// A move asked and not made yet, and why.
    pub move_asked: Option<&'static str>,
    pub queries: u64,
    pub busy: bool,
    /// Idle and parked: waiting for its client in the parking lot (`frontend/lot.rs`).
    pub parked: bool,
}

/// What [`SessionHandle::response_wait`] holds when the session is not waiting for a backend.
pub const NOT_WAITING: u32 = 0;
/// What it holds once the response-timeout sweep (`deadline`) found the wait past the limit.
pub const EXPIRED: u32 = u32::MAX;

/// The shared face of a session: what other tasks may see or ask of it.
pub struct SessionHandle {
    pub id: u32,
    pub started: Instant,
    pub queries: AtomicU64,
    pub busy: AtomicBool,
    /// Set by KILL CONNECTION or a forced shutdown.
    pub killed: AtomicBool,
    /// A KILL CONNECTION for this session is under way.
    pub kill_pending: AtomicBool,
    /// Woken to make an idle session look at `killed` and the drain flag.
    pub wake: Wake,
    pub backend_index: AtomicU32,
    pub backend_thread_id: AtomicU32,
    /// Server status flags after the last command (changes every transaction: kept apart from
    /// `info` so that publishing it costs one store).
    pub status: AtomicU16,
    /// The tick (`ctx.clock`) at which the session began to wait for its backend's response,
    /// [`NOT_WAITING`] when it is not waiting, or [`EXPIRED`] once the sweep
    /// found that wait past `response_timeout`.
    pub response_wait: AtomicU32,
    /// A move asked of the session: [`NO_MOVE`], [`MOVE_ANYWHERE`], or the target backend's
    /// index + 1; and why (a [`MoveReason`] index).
    move_to: AtomicU32,
    move_why: AtomicU8,
    /// Sluice could move the session at its next safe point: it holds the credentials (users
    /// mode) and nothing it cannot recreate is open (as last published).
    pub can_move: AtomicBool,
    /// It waits at the gate of a consistent capture start.
    pub gated: AtomicBool,
    /// Its statements are routed one by one (read/write split): the backend it is bound to
    /// changes with them, and the rebalancer leaves it alone.
    pub split: AtomicBool,
    /// When it last moved (milliseconds of `metrics::mono_ns`; 0: never).
    pub moved_at_ms: AtomicU64,
    /// Whether it may park while idle, and was asked to.
    pub parking: crate::parking::Parking,
    pub info: Mutex<SessionInfo>,
}

pub const NO_MOVE: u32 = 0;
pub const MOVE_ANYWHERE: u32 = u32::MAX;

impl SessionHandle {
    pub fn new(id: u32, client: String, listener: String) -> SessionHandle {
        let connected_at_unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        SessionHandle {
            id,
            started: Instant::now(),
            queries: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            kill_pending: AtomicBool::new(false),
            wake: Wake::default(),
            backend_index: AtomicU32::new(u32::MAX),
            backend_thread_id: AtomicU32::new(0),
            status: AtomicU16::new(status::AUTOCOMMIT),
            response_wait: AtomicU32::new(NOT_WAITING),
            move_to: AtomicU32::new(NO_MOVE),
            move_why: AtomicU8::new(0),
            can_move: AtomicBool::new(false),
            gated: AtomicBool::new(false),
            split: AtomicBool::new(false),
            moved_at_ms: AtomicU64::new(0),
            parking: Default::default(),
            info: Mutex::new(SessionInfo {
                id,
                client,
                listener,
                tls: false,
                backend_tls: false,
                compressed: false,
                connected_at_unix,
                backend: None,
                backend_thread_id: None,
                state: SessionState::default(),
                pins: Vec::new(),
                safe_point: true,
                move_asked: None,
                queries: 0,
                busy: false,
                parked: false,
            }),
        }
    }

    /// Records the backend connection the session is bound to (before the client is told it is
    /// logged in, so that a KILL naming this session can always find it).
    pub fn bind_backend(&self, index: usize, name: &str, thread_id: u32) {
        self.backend_index.store(index as u32, Ordering::Relaxed);
        self.backend_thread_id.store(thread_id, Ordering::Relaxed);
        let mut i = self.info.lock();
        // (Reusing the string: a split session changes backend at many statements.)
        match &mut i.backend {
            Some(b) => {
                b.clear();
                b.push_str(name);
            }
            None => i.backend = Some(name.to_string()),
        }
        i.backend_thread_id = Some(thread_id);
    }

    /// Publishes the session's state for the admin API (after changes other than status).
    pub fn publish(&self, state: &SessionState) {
        self.can_move.store(!state.passthrough && state.hazards == 0, Ordering::Relaxed);
        self.info.lock().state = state.clone();
        self.publish_status(state.status);
    }

    #[inline]
    pub fn publish_status(&self, st: u16) {
        if self.status.load(Ordering::Relaxed) != st {
            self.status.store(st, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> SessionInfo {
        let mut i = self.info.lock().clone();
        i.state.status = self.status.load(Ordering::Relaxed);
        i.pins = i.state.pins();
        i.safe_point = i.state.at_safe_point();
        i.move_asked = self.move_reason().map(MoveReason::as_str);
        // A multiplexed session between statements holds no connection.
        let tid = self.backend_thread_id.load(Ordering::Relaxed);
        i.backend_thread_id = (tid != 0).then_some(tid);
        i.queries = self.queries.load(Ordering::Relaxed);
        i.busy = self.busy.load(Ordering::Relaxed);
        i.parked = self.parking.parked.load(Ordering::Relaxed);
        i
    }

    /// Asks the session to move to backend `to` (any other one when None) at its next safe
    /// point, and wakes it if it is idle.
    pub fn ask_move(&self, to: Option<usize>, why: MoveReason) {
        self.move_why.store(why as u8, Ordering::Relaxed);
        self.move_to.store(to.map_or(MOVE_ANYWHERE, |i| i as u32 + 1), Ordering::SeqCst);
        self.wake.notify();
    }

    #[inline]
    pub fn move_asked(&self) -> bool {
        self.move_to.load(Ordering::Relaxed) != NO_MOVE
    }

    /// The backend a move asked goes to (None: none asked, or any other backend).
    pub fn move_target(&self) -> Option<usize> {
        match self.move_to.load(Ordering::Relaxed) {
            NO_MOVE | MOVE_ANYWHERE => None,
            i => Some(i as usize - 1),
        }
    }

    /// Why a move was asked, if one was.
    pub fn move_reason(&self) -> Option<MoveReason> {
        self.move_asked().then(|| MoveReason::ALL[usize::from(self.move_why.load(Ordering::Relaxed)) % MoveReason::ALL.len()])
    }

    /// Takes the move asked: its target (None: any other backend) and reason.
    pub fn take_move(&self) -> Option<(Option<usize>, MoveReason)> {
        let why = self.move_reason()?;
        match self.move_to.swap(NO_MOVE, Ordering::SeqCst) {
            NO_MOVE => None,
            MOVE_ANYWHERE => Some((None, why)),
            i => Some((Some(i as usize - 1), why)),
        }
    }

    /// Calls off a move asked for `why` that was not made yet.
    pub fn cancel_move(&self, why: MoveReason) {
        if self.move_reason() == Some(why) {
            self.move_to.store(NO_MOVE, Ordering::SeqCst);
        }
    }

    pub fn kill(&self) {
        self.killed.store(true, Ordering::Relaxed);
        self.wake.notify();
    }
}

/// Wakes a session that waits for its next command (to look at a kill or the drain flag).
/// Waiting costs an atomic swap and a pointer comparison: the task's waker is stored only when
/// it changed, not registered and removed at every command as a `tokio::sync::Notify` would.
#[derive(Default)]
pub struct Wake {
    flag: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Wake {
    /// Makes the next (or current) wait return.
    pub fn notify(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.wake_task();
    }

    /// Wakes the task that waits here, without making its wait return.
    pub fn wake_task(&self) {
        if let Some(w) = self.waker.lock().as_ref() {
            w.wake_by_ref();
        }
    }

    /// Makes sure the task of `cx` is the one woken, leaving the flag alone. `known` is the
    /// waker the caller last stored here; true when it had to be stored again.
    pub fn register(&self, cx: &Context<'_>, known: &mut Option<Waker>) -> bool {
        if known.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return false;
        }
        *known = Some(cx.waker().clone());
        *self.waker.lock() = Some(cx.waker().clone());
        true
    }

    /// Whether `notify` was called since a wait last returned.
    pub fn pending(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Makes `w` the waker that `notify` wakes (a parked session's, in the parking lot).
    pub fn hand_to(&self, w: Waker) {
        *self.waker.lock() = Some(w);
    }

    /// Ready once `notify` was called since it last returned Ready. `known` is the waker the
    /// caller last stored here.
    pub fn poll_woken(&self, cx: &mut Context<'_>, known: &mut Option<Waker>) -> Poll<()> {
        if self.flag.swap(false, Ordering::SeqCst) {
            return Poll::Ready(());
        }
        // A notify that ran before the waker was stored left only the flag.
        if self.register(cx, known) && self.flag.swap(false, Ordering::SeqCst) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// All live sessions by sluice connection id.
#[derive(Default)]
pub struct Registry {
    map: Mutex<HashMap<u32, Arc<SessionHandle>>>,
    next_id: AtomicU32,
}

impl Registry {
    pub fn next_id(&self) -> u32 {
        // Ids start at 1 and skip 0 on wrap-around.
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if id != 0 {
                return id;
            }
        }
    }

    pub fn insert(&self, h: Arc<SessionHandle>) {
        self.map.lock().insert(h.id, h);
    }

    /// Runs `f` on every live session (under the registry's lock: keep it short).
    pub fn for_each(&self, mut f: impl FnMut(&SessionHandle)) {
        for h in self.map.lock().values() {
            f(h);
        }
    }

    pub fn remove(&self, id: u32) {
        self.map.lock().remove(&id);
    }

    pub fn get(&self, id: u32) -> Option<Arc<SessionHandle>> {
        self.map.lock().get(&id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<SessionHandle>> {
        let mut v: Vec<_> = self.map.lock().values().cloned().collect();
        v.sort_by_key(|h| h.id);
        v
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wake_reaches_a_waiting_session_and_one_that_was_busy() {
        let wake = Arc::new(Wake::default());
        let mut known = None;
        // A notify while nobody waits is kept for the next wait.
        wake.notify();
        std::future::poll_fn(|cx| wake.poll_woken(cx, &mut known)).await;
        // A notify from another thread wakes the waiting task.
        let w = wake.clone();
        let waiter = tokio::spawn(async move {
            let mut known = None;
            std::future::poll_fn(|cx| w.poll_woken(cx, &mut known)).await;
        });
        tokio::task::yield_now().await;
        std::thread::spawn(move || wake.notify()).join().unwrap();
        waiter.await.unwrap();
    }
}

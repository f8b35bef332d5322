//! Session state, owned in one place.
//!
//! [`SessionState`] is everything a client session has changed on its backend connection: the
//! user, schema, collation, transaction status, session variables, prepared statements, and the
//! reasons it is pinned to its backend. The session task owns it and updates it from the
//! commands it relays and the responses it follows; pooling, migration and capture read it.
//! A copy is published to the session's [`SessionHandle`] after each command that changed it,
//! which is what the admin API shows.

use std::collections::HashMap;

use crate::session::vars::Vars;
use serde::Serialize;
use sluice_proto::basic::{self, StateChange};
use sluice_proto::consts::status;
use sluice_proto::lexer::Mode;
use sluice_proto::response::Sink;

pub mod deadline;
mod handle;
mod parcel;
pub mod parking;
pub mod vars;
pub use handle::{ABANDONED, EXPIRED, NOT_WAITING, Registry, SessionHandle, SessionInfo};
pub use parcel::StateParcel;

/// A prepared statement as the client knows it.
#[derive(Debug, Clone, Serialize)]
pub struct Prepared {
    /// The id the backend knows it by (the client's id, unless the session moved).
    pub backend_id: u32,
    /// (Shown with its literals taken out when it may carry a password.)
    #[serde(serialize_with = "redacted")]
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
    /// Its text may carry a password or a key (`sluice_proto::secret::may_carry`, once): a capture
    /// records its executes without their parameters.
    #[serde(skip)]
    pub secret: bool,
    /// Counted among the statements clients hold open (`backend::shared::OpenStatements`).
    #[serde(skip)]
    pub counted: bool,
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

/// The ways the server may read a statement's text: one where sluice knows the session's
/// `sql_mode` or where modes cannot differ on the text (it has no `\`, nor `"` under
/// ANSI_QUOTES); else the default's and NO_BACKSLASH_ESCAPES's, both of which a reader that
/// guards something (a KILL's mapping) must take into account. (A secret's redaction needs no
/// reading: `sluice_proto::secret` holds in every one.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readings(pub Mode, pub Option<Mode>);

impl Readings {
    /// The readings of `sql` by a session whose lexer mode is `lex` (None: unknown).
    pub fn of(lex: Option<Mode>, sql: &[u8]) -> Readings {
        match lex {
            Some(m) => Readings(m.for_text(sql), None),
            None if memchr::memchr(b'\\', sql).is_some() => {
                Readings(Mode::DEFAULT, Some(Mode { no_backslash_escapes: true, ansi_quotes: false }))
            }
            None => Readings(Mode::DEFAULT, None),
        }
    }

    pub fn iter(self) -> impl Iterator<Item = Mode> {
        std::iter::once(self.0).chain(self.1)
    }
}

impl SessionState {
    /// The mode to lex the session's statement `sql` in, where one reading is enough (routing,
    /// pins, digests): the session's where known, else the default.
    #[inline]
    pub fn mode_for(&self, sql: &[u8]) -> Mode {
        self.lex.map_or(Mode::DEFAULT, |m| m.for_text(sql))
    }

    /// The ways the server may read the session's statement `sql` ([`Readings`]).
    pub fn readings(&self, sql: &[u8]) -> Readings {
        Readings::of(self.lex, sql)
    }
}

/// Statement text as it may be stored or shown (`/sessions`, the SQL admin, captures' session
/// records, logs and errors): with every literal taken out when it may carry a password or a
/// key (`sluice_proto::secret`), else as written.
pub fn shown_text(sql: &[u8]) -> std::borrow::Cow<'_, str> {
    if sluice_proto::secret::may_carry(sql) {
        return String::from_utf8_lossy(&sluice_proto::secret::redacted(sql)).into_owned().into();
    }
    String::from_utf8_lossy(sql)
}

fn redacted<S: serde::Serializer>(sql: &str, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&shown_text(sql.as_bytes()))
}

fn redacted_values<S: serde::Serializer>(m: &Vars, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_map(m.iter().map(|(k, v)| (k, shown_text(v.as_bytes()))))
}

/// Serializes a map's keys only (user variables: their values may be secrets).
fn names_only<S: serde::Serializer>(m: &Vars, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_seq(m.keys())
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionState {
    /// (Shared by the copy the session publishes and its multiplexing key.)
    pub user: std::sync::Arc<str>,
    pub schema: Option<std::sync::Arc<str>>,
    pub collation: u8,
    /// Server status flags from the last OK/EOF.
    pub status: u16,
    /// Session variables the backend reported as changed (SESSION_TRACK).
    pub variables: Vars,
    /// By statement id; FxHash, since it is looked up on every execute.
    pub prepared: HashMap<u32, Prepared, rustc_hash::FxBuildHasher>,
    pub multi_statements: bool,
    pub passthrough: bool,
    /// Its server hands sessions over (TiDB's session states): a passthrough session moves too.
    pub handed_over: bool,
    /// How the session's `sql_mode` has the server read quoted text (`lexer::Mode`), where
    /// sluice knows it: read at a users-mode login, then followed through session tracking.
    /// None: unknown (passthrough, until an OK reports a `sql_mode`): see [`SessionState::readings`].
    #[serde(skip)]
    pub lex: Option<Mode>,
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
    /// that prepared each, which prepares it again on another connection. (Shown with the
    /// literals of those that may carry a password taken out.)
    #[serde(serialize_with = "redacted_values")]
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
    /// What the client's own session tracks (its `session_track_*` settings), where sluice
    /// tracks more on its behalf: users mode, a client with CLIENT_SESSION_TRACK.
    #[serde(skip)]
    pub tracked: Option<Box<sluice_proto::basic::Tracked>>,
    /// The server holds a transaction its status flags do not show: with autocommit off, a
    /// savepoint was set (before any table was touched, which leaves no flag) and no COMMIT or
    /// ROLLBACK (nor autocommit turned on) ended it since.
    pub open_transaction: bool,
}

impl SessionState {
    pub fn in_transaction(&self) -> bool {
        self.status & status::IN_TRANS != 0 || self.open_transaction
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
    /// Whether TiDB's session states could carry the session to another connection now:
    /// between transactions, and not between a SET TRANSACTION and its transaction (which the
    /// states do not carry). (TiDB refuses to hand over what else it cannot carry.)
    pub fn movable_by_states(&self) -> bool {
        self.handed_over && self.at_safe_point() && self.pin_next & sluice_proto::sql::hazard::SET_TRANSACTION == 0
    }

    pub fn at_safe_point(&self) -> bool {
        !self.in_transaction() && !self.prepared.values().any(|p| p.cursor || p.long_data)
    }

    /// Applies the session-state block of an OK. Returns what it reported: a state change, and
    /// a change of schema or of a variable (which explains a state change).
    pub fn apply_ok(&mut self, ok: &basic::Ok<'_>) -> Reported {
        let mut r = Reported::default();
        let (mut charset, mut collation) = (false, false);
        for change in basic::state_changes(ok.session_state) {
            match change {
                StateChange::Schema(s) => {
                    r.variables = true;
                    // (No schema at all is reported as an empty one.)
                    self.schema = (!s.is_empty()).then(|| String::from_utf8_lossy(s).into());
                }
                StateChange::SystemVariable { name, value } if name.eq_ignore_ascii_case(b"last_gtid") => {
                    r.variables = true;
                    self.last_gtid.clear();
                    self.last_gtid.push_str(&String::from_utf8_lossy(value));
                }
                StateChange::SystemVariable { name, value } => {
                    r.variables = true;
                    charset |= name.eq_ignore_ascii_case(b"character_set_connection");
                    collation |= name.eq_ignore_ascii_case(b"collation_connection");
                    self.set_variable(String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned());
                }
                StateChange::StateChanged => r.state_changed = true,
                _ => {}
            }
        }
        // A new character set for the connection brings its default collation (the server
        // reports the one, not the other): a collation kept from before is no longer in force.
        if charset && !collation {
            self.variables.remove("collation_connection");
        }
        r
    }

    /// A session variable's value now (as the server reported it, or as it was read back).
    pub fn set_variable(&mut self, name: String, value: String) {
        if name.eq_ignore_ascii_case("sql_mode") {
            self.lex = Some(Mode::from_sql_mode(value.as_bytes()));
        }
        self.variables.insert(name, value);
    }

    /// Forgets what COM_RESET_CONNECTION or COM_CHANGE_USER resets on the server.
    pub fn reset(&mut self) {
        // (The server's default sql_mode again: users mode reads it back, `frontend/multiplex.rs`.)
        self.lex = None;
        self.prepared.clear();
        self.variables.clear();
        self.hazards = 0;
        self.pin_next = 0;
        self.last_insert_id = 0;
        self.sql_prepared.clear();
        self.user_variables.clear();
        self.unread_variables.clear();
        self.end_transaction();
    }

    /// Out of any transaction (it ended with its connection, or was ended for the client).
    pub fn end_transaction(&mut self) {
        self.status &= !status::IN_TRANS;
        self.open_transaction = false;
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
        let mode = self.state.mode_for(sql.as_bytes());
        let hazards = if self.state.passthrough { 0 } else { sluice_proto::sql::hazards_in(sql.as_bytes(), mode) };
        let class = sluice_proto::rw::classify_in(sql.as_bytes(), mode);
        let secret = sluice_proto::secret::may_carry(sql.as_bytes());
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
            secret,
            counted: false,
        };
        self.state.prepared.insert(client_id, p);
        self.prepared_id = Some(client_id);
        self.changed = true;
    }
}

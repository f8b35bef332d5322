//! What a statement leaves on its session, as sluice follows it: the hazards the lexer finds
//! (pins), the user variables it names (read back at the next safe point), a SQL PREPARE that
//! can be repeated elsewhere, whether a change of state the server reports is explained, and
//! on a server that reports none (TiDB) the variables a `SET` assigns (read back after it).

use sluice_proto::sql::SqlPrepare;

use super::session::Session;
use sluice_proto::packet::HEADER;

/// A SQL PREPARE or DEALLOCATE and the query that ran it.
pub(super) type SqlPrepareQuery = (SqlPrepare, String);

/// What a relayed command left to record once its response is through: what the statement
/// leaves for the next one only (its hazards), and what it does to the session's state.
#[derive(Default)]
pub(super) struct Done {
    /// The query's hazards, found already by the pass that took its digest.
    pub(super) scanned: Option<u16>,
    pub(super) preparing: Option<Box<[u8]>>,
    /// COM_INIT_DB's schema, or the collation a `SET NAMES ... COLLATE` gives the connection
    /// (the server reports only the character sets): recorded once the command succeeded.
    pub(super) noted: Option<Box<str>>,
    pub(super) multi_option: Option<bool>,
    pub(super) next_pins: u16,
    /// A SQL `PREPARE` or `DEALLOCATE PREPARE` (boxed: rare, and this struct is in the future
    /// of every command).
    pub(super) sql_prepare: Option<Box<SqlPrepareQuery>>,
    pub(super) error: Option<u16>,
    pub(super) changed: bool,
    pub(super) prepared_id: Option<u32>,
    pub(super) warnings: u16,
    /// The statement's text explains a change of session state the server reports: the lexer
    /// found what changes it.
    pub(super) explained: bool,
    /// The statement is one `SET` or `USE`: a change of state is explained by the variables or
    /// schema reported with it (`SET ROLE` reports none).
    pub(super) plain_set: bool,
    pub(super) reported: crate::session::Reported,
    /// Autocommit was off when the statement began.
    pub(super) autocommit_off: bool,
    /// What the statement does to a transaction the flags may not show (with autocommit off:
    /// only then is it looked for).
    pub(super) transaction: sluice_proto::sql::TransactionEnd,
    /// The statement sets the client's own session tracking (`session_track_*`), which sluice
    /// reads back and hides behind its own: [`TRACKS_VARIABLES`], [`TRACKS_STATE`] bits.
    pub(super) sets_tracking: u8,
}

/// A statement names `session_track_system_variables`.
pub(super) const TRACKS_VARIABLES: u8 = 1;
/// A statement names `session_track_state_change`.
pub(super) const TRACKS_STATE: u8 = 2;

/// Which of the tracking settings sluice hides behind its own a `SET` names.
fn sets_tracking(sql: &[u8]) -> u8 {
    let Some(first) = sluice_proto::lexer::Lexer::new(sql).next() else { return 0 };
    if !first.is_word(sql, "SET") {
        return 0;
    }
    let names = |name: &[u8]| sql.windows(name.len()).any(|w| w.eq_ignore_ascii_case(name));
    let mut bits = 0;
    if names(b"session_track_system_variables") {
        bits |= TRACKS_VARIABLES;
    }
    if names(b"session_track_state_change") {
        bits |= TRACKS_STATE;
    }
    bits
}

/// Whether a query is one `SET` or `USE` statement, whose changes of session state the server
/// reports one by one (a `SET` of user variables is found by the lexer).
fn is_plain_set(sql: &[u8]) -> bool {
    // The first word, without allocating: most queries end here.
    let Some(first) = sluice_proto::lexer::Lexer::new(sql).next() else { return false };
    if !(first.is_word(sql, "SET") || first.is_word(sql, "USE")) {
        return false;
    }
    sluice_proto::lexer::statements(sql).nth(1).is_none()
}

impl Session {
    /// A passthrough session on TiDB (which sluice does not read statements for otherwise):
    /// whether the query is or holds a SET TRANSACTION, which TiDB's session states do not
    /// carry to another server (the session does not move before its transaction). Only a
    /// `SET`, or a text of several statements, is read.
    pub(super) fn note_set_transaction(&self, body_end: usize, done: &mut Done) {
        use sluice_proto::sql::hazard;
        let text = &self.client.rbuf[HEADER + 1..body_end];
        let first_is_set = sluice_proto::lexer::Lexer::new(text).next().is_some_and(|t| t.is_word(text, "SET"));
        if first_is_set || (self.state.multi_statements && memchr::memchr(b';', text).is_some()) {
            done.next_pins = sluice_proto::sql::hazards_in(text, self.state.mode_for(text)) & hazard::SET_TRANSACTION;
        }
    }

    /// Notes what a query does that sluice follows: its hazards, the user variables it names,
    /// a SQL PREPARE sluice can repeat elsewhere.
    pub(super) fn note_query(&mut self, body_end: usize, done: &mut Done) {
        use sluice_proto::sql::{self, hazard};
        let text = &self.client.rbuf[HEADER + 1..body_end];
        let mut found = match done.scanned.take() {
            Some(found) => found,
            None => sql::hazards_in(text, self.state.mode_for(text)),
        };
        done.explained = found != 0;
        let set = is_plain_set(text);
        done.plain_set = !done.explained && set;
        // (A SET alone, or one the lexer found something in: not every statement.)
        done.sets_tracking = if self.state.tracked.is_some() && (done.plain_set || done.explained) { sets_tracking(text) } else { 0 };
        if done.plain_set {
            done.noted = sql::set_names_collation(text).map(String::into_boxed_str);
        }
        // A server that reports no session state (TiDB) has what a SET or USE changed read back.
        if set && self.backend.caps & sluice_proto::consts::cap::SESSION_TRACK == 0 {
            // (A SET of user variables alone leaves nothing more to read.)
            self.backend.unreported = sql::set_system_variables(text).filter(|names| done.plain_set || !names.is_empty());
        }
        done.autocommit_off = self.state.status & sluice_proto::consts::status::AUTOCOMMIT == 0;
        if done.autocommit_off {
            done.transaction = sql::transaction_end(text);
        }
        // A PREPARE sluice can repeat elsewhere (or a DEALLOCATE) pins nothing, unless its text
        // names user variables (each EXECUTE would set or read them unseen).
        if found & hazard::SQL_PREPARE != 0
            && found & hazard::USER_VARIABLE == 0
            && let Some(op) = sql::sql_prepare(text)
        {
            found &= !hazard::SQL_PREPARE;
            done.sql_prepare = Some(Box::new((op, String::from_utf8_lossy(text).into_owned())));
        }
        if found & hazard::USER_VARIABLE != 0 {
            let names = sql::user_variables(text);
            self.note_variables(names);
        }
        done.next_pins = self.note_hazards(found);
    }

    /// Notes what an execute leaves, as its statement's text says (as for a query). Always
    /// true (a guard for `route`'s match).
    pub(super) fn note_execute(&mut self, done: &mut Done) -> bool {
        if self.who.credential.is_none() {
            return true;
        }
        let id = self.client.rbuf.get(HEADER + 1..HEADER + 5).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let Some(p) = id.and_then(|id| self.state.prepared.get(&id)) else { return true };
        done.autocommit_off = self.state.status & sluice_proto::consts::status::AUTOCOMMIT == 0;
        if done.autocommit_off {
            done.transaction = sluice_proto::sql::transaction_end(p.sql.as_bytes());
        }
        let found = p.hazards;
        if found != 0 {
            if found & sluice_proto::sql::hazard::USER_VARIABLE != 0 {
                let names = sluice_proto::sql::user_variables(p.sql.as_bytes());
                self.note_variables(names);
            }
            done.explained = true;
            done.next_pins = self.note_hazards(found);
        }
        true
    }

    /// After a `SET` or `USE` on a server that reports no session state (TiDB): the schema
    /// and the variables it named, read back into the session's state; when that fails, the
    /// session keeps its connection.
    pub(super) async fn read_settings(&mut self, names: &[String]) -> crate::error::Result<()> {
        let (caps, limit) = (self.backend_caps(), self.backend.guard.connect_timeout);
        match crate::backend::restore::read_settings(&mut self.backend.conn, names, caps, limit).await? {
            Some(s) => {
                self.state.schema = s.schema.map(Into::into);
                for (name, value) in s.values {
                    self.state.set_variable(name, value);
                }
            }
            None => self.state.hazards |= crate::session::HIDDEN_STATE,
        }
        self.handle.publish(&self.state);
        Ok(())
    }

    /// User variables a statement named: their values are read back at the next safe point.
    fn note_variables(&mut self, names: Vec<String>) {
        let unread = &mut self.state.unread_variables;
        for n in names {
            if !unread.contains(&n) {
                unread.push(n);
            }
        }
        if unread.len() + self.state.user_variables.len() > crate::session::MAX_USER_VARIABLES {
            self.state.hazards |= sluice_proto::sql::hazard::USER_VARIABLE;
        }
    }

    /// Records what the lexer found in a statement: lasting hazards on the session (user
    /// variables are read back instead), `ROW_COUNT()` readers; returns the bits that pin the
    /// session for the next statement only.
    fn note_hazards(&mut self, found: u16) -> u16 {
        use sluice_proto::sql::hazard;
        let lasting = found & hazard::LASTING & !hazard::USER_VARIABLE;
        if lasting & !self.state.hazards != 0 {
            self.state.hazards |= lasting;
            self.handle.publish(&self.state);
        }
        if found & hazard::ROW_COUNT != 0 {
            self.state.reads_row_count = true;
        }
        found & (hazard::SET_TRANSACTION | hazard::FOUND_ROWS)
    }
}

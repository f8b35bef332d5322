//! A session's state as it travels to another process (an upgrade hands idle sessions over):
//! all of it, unlike what the admin API shows (user variables' values, parameter types).

use serde::{Deserialize, Serialize};

use super::{Prepared, SessionState};
use crate::session::vars::Vars;

#[derive(Serialize, Deserialize)]
pub struct StateParcel {
    user: String,
    schema: Option<String>,
    collation: u8,
    status: u16,
    variables: Vars,
    prepared: Vec<(u32, PreparedParcel)>,
    multi_statements: bool,
    passthrough: bool,
    #[serde(default)]
    handed_over: bool,
    hazards: u16,
    pin_next: u16,
    reads_row_count: bool,
    last_insert_id: u64,
    last_gtid: String,
    sql_prepared: Vars,
    user_variables: Vars,
    unread_variables: Vec<String>,
    stmt_ids_mapped: bool,
    next_stmt_id: u32,
    #[serde(default)]
    tracked: Option<(Vec<u8>, bool)>,
    #[serde(default)]
    open_transaction: bool,
    /// The session's lexer mode where known: (NO_BACKSLASH_ESCAPES, ANSI_QUOTES).
    #[serde(default)]
    lex: Option<(bool, bool)>,
}

#[derive(Serialize, Deserialize)]
struct PreparedParcel {
    backend_id: u32,
    sql: String,
    params: u16,
    columns: u16,
    long_data: bool,
    cursor: bool,
    param_types: Vec<u8>,
    types_unsent: bool,
    conn_gen: u32,
    hazards: u16,
}

impl From<&SessionState> for StateParcel {
    fn from(s: &SessionState) -> StateParcel {
        let prepared = s
            .prepared
            .iter()
            .map(|(id, p)| {
                let p = PreparedParcel {
                    backend_id: p.backend_id,
                    sql: p.sql.clone(),
                    params: p.params,
                    columns: p.columns,
                    long_data: p.long_data,
                    cursor: p.cursor,
                    param_types: p.param_types.clone(),
                    types_unsent: p.types_unsent,
                    conn_gen: p.conn_gen,
                    hazards: p.hazards,
                };
                (*id, p)
            })
            .collect();
        StateParcel {
            user: s.user.to_string(),
            schema: s.schema.as_deref().map(String::from),
            collation: s.collation,
            status: s.status,
            variables: s.variables.clone(),
            prepared,
            multi_statements: s.multi_statements,
            passthrough: s.passthrough,
            handed_over: s.handed_over,
            hazards: s.hazards,
            pin_next: s.pin_next,
            reads_row_count: s.reads_row_count,
            last_insert_id: s.last_insert_id,
            last_gtid: s.last_gtid.clone(),
            sql_prepared: s.sql_prepared.clone(),
            user_variables: s.user_variables.clone(),
            unread_variables: s.unread_variables.clone(),
            stmt_ids_mapped: s.stmt_ids_mapped,
            next_stmt_id: s.next_stmt_id,
            tracked: s.tracked.as_ref().map(|t| (t.variables.to_vec(), t.state_change)),
            open_transaction: s.open_transaction,
            lex: s.lex.map(|m| (m.no_backslash_escapes, m.ansi_quotes)),
        }
    }
}

impl From<StateParcel> for SessionState {
    fn from(p: StateParcel) -> SessionState {
        let prepared = p
            .prepared
            .into_iter()
            .map(|(id, s)| {
                let class = sluice_proto::rw::classify(s.sql.as_bytes());
                let secret = sluice_proto::secret::may_carry(s.sql.as_bytes());
                let s = Prepared {
                    backend_id: s.backend_id,
                    sql: s.sql,
                    params: s.params,
                    columns: s.columns,
                    long_data: s.long_data,
                    cursor: s.cursor,
                    param_types: s.param_types,
                    types_unsent: s.types_unsent,
                    conn_gen: s.conn_gen,
                    hazards: s.hazards,
                    class,
                    secret,
                    counted: false,
                };
                (id, s)
            })
            .collect();
        SessionState {
            user: p.user.into(),
            schema: p.schema.map(Into::into),
            collation: p.collation,
            status: p.status,
            variables: p.variables,
            prepared,
            multi_statements: p.multi_statements,
            passthrough: p.passthrough,
            handed_over: p.handed_over,
            hazards: p.hazards,
            pin_next: p.pin_next,
            reads_row_count: p.reads_row_count,
            last_insert_id: p.last_insert_id,
            last_gtid: p.last_gtid,
            sql_prepared: p.sql_prepared,
            user_variables: p.user_variables,
            unread_variables: p.unread_variables,
            stmt_ids_mapped: p.stmt_ids_mapped,
            next_stmt_id: p.next_stmt_id,
            tracked: p
                .tracked
                .map(|(variables, state_change)| Box::new(sluice_proto::basic::Tracked { variables: variables.into(), state_change })),
            open_transaction: p.open_transaction,
            lex: p.lex.map(|(no_backslash_escapes, ansi_quotes)| sluice_proto::lexer::Mode { no_backslash_escapes, ansi_quotes }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_comes_back_whole() {
        let mut s = SessionState { user: "app".into(), schema: Some("db".into()), collation: 45, status: 3, ..Default::default() };
        s.variables.insert("sql_mode".into(), "ANSI".into());
        s.user_variables.insert("secret".into(), "'x'".into());
        s.sql_prepared.insert("p".into(), "PREPARE p FROM 'SELECT 1'".into());
        s.unread_variables.push("y".into());
        s.hazards = 4;
        s.pin_next = 8;
        s.last_insert_id = 99;
        s.last_gtid = "0-1-7".into();
        s.stmt_ids_mapped = true;
        s.next_stmt_id = 12;
        let p = Prepared {
            backend_id: 5,
            sql: "INSERT INTO t VALUES (?)".into(),
            params: 1,
            columns: 0,
            long_data: false,
            cursor: true,
            param_types: vec![3, 0],
            types_unsent: true,
            conn_gen: 2,
            hazards: 1,
            class: sluice_proto::rw::classify(b"INSERT INTO t VALUES (?)"),
            secret: false,
            counted: false,
        };
        s.prepared.insert(11, p);
        s.tracked = Some(Box::new(sluice_proto::basic::Tracked { variables: b"time_zone"[..].into(), state_change: true }));
        s.open_transaction = true;
        let text = serde_json::to_vec(&StateParcel::from(&s)).unwrap();
        let back = SessionState::from(serde_json::from_slice::<StateParcel>(&text).unwrap());
        assert_eq!(format!("{back:?}"), format!("{s:?}"));
    }
}

//! A command that names a prepared statement by its id, before it is relayed: the parameter
//! types an execute sent remembered, and, once ids are mapped (the session took another
//! connection, or multiplexes), the id the backend knows written into the command. The common
//! path is synchronous; only a statement that must be prepared on this connection first, or a
//! close answered here, waits.

use sluice_proto::consts::com;
use sluice_proto::packet::{HEADER, Header};

use super::session::{Flow, INSPECT_LIMIT, Session};
use crate::error::Result;

/// What a command naming a prepared statement must wait for before it is relayed.
pub(super) enum StatementNeeds {
    /// COM_STMT_CLOSE of a mapped id: answered here.
    Close(u32),
    /// The statement is not prepared on this connection yet.
    PrepareAgain(u32),
}

/// Whether command `cmd` names a prepared statement by its id.
fn names_statement(cmd: u8) -> bool {
    matches!(
        cmd,
        com::STMT_EXECUTE | com::STMT_FETCH | com::STMT_CLOSE | com::STMT_RESET | com::STMT_SEND_LONG_DATA | com::STMT_BULK_EXECUTE
    )
}

impl Session {
    /// A command naming a prepared statement, its ids mapped at once ([`Session::statement_ids`])
    /// on the common path; Some: what it must wait for first ([`Session::statement_ids_apart`]).
    pub(super) fn statement_ids_now(&mut self, cmd: u8, h: Header, stmt_id: Option<u32>) -> Result<Option<StatementNeeds>> {
        let mapped = stmt_id.filter(|_| self.state.stmt_ids_mapped && names_statement(cmd));
        match self.statement_needs(cmd, mapped) {
            None => self.statement_ids(cmd, h, mapped).map(|()| None),
            need => Ok(need),
        }
    }

    /// The wait [`Session::statement_needs`] found, then [`Session::statement_ids`]. Some: the
    /// command was answered here (COM_STMT_CLOSE, or an error).
    pub(super) async fn statement_ids_apart(&mut self, need: StatementNeeds, cmd: u8, h: Header) -> Result<Option<Flow>> {
        let id = match need {
            StatementNeeds::Close(id) => return self.close_statement(id).await.map(Some),
            StatementNeeds::PrepareAgain(id) => id,
        };
        if let Err(e) = self.prepare_again(id).await {
            return self.refuse_command(e).await.map(Some);
        }
        self.statement_ids(cmd, h, Some(id)).map(|()| None)
    }

    /// What a command naming a prepared statement by a `mapped` id (ids are mapped) must wait
    /// for: its statement prepared on this connection if it is not yet, or its close answered
    /// here. None on the common path.
    fn statement_needs(&mut self, cmd: u8, mapped: Option<u32>) -> Option<StatementNeeds> {
        let id = mapped?;
        if cmd == com::STMT_CLOSE {
            Some(StatementNeeds::Close(id))
        } else if self.find_prepared(id) {
            Some(StatementNeeds::PrepareAgain(id))
        } else {
            None
        }
    }

    /// The parameter types an execute sent, remembered (or sent again if needed), and, for a
    /// `mapped` id (ids are mapped), the id the backend knows written into the command. (Every
    /// session's executes come here, mapped or not: a move, multiplexing and a capture's replay
    /// need the parameter types it sent when a later execute does not send them again.)
    fn statement_ids(&mut self, cmd: u8, h: Header, mapped: Option<u32>) -> Result<()> {
        // (With MySQL's query attributes the execute layout differs; those sessions are not helped.)
        if cmd == com::STMT_EXECUTE && h.len < INSPECT_LIMIT && self.backend.caps & sluice_proto::consts::cap::QUERY_ATTRIBUTES == 0 {
            self.execute_types(h)?;
        }
        if let Some(id) = mapped {
            let backend_id = self.state.backend_stmt_id(id);
            self.client.rbuf[HEADER + 1..HEADER + 5].copy_from_slice(&backend_id.to_le_bytes());
        }
        Ok(())
    }
}

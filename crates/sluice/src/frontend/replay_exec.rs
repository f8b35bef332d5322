//! Prepared statements in transaction replay: a COM_STMT_EXECUTE is logged as the client sent
//! it (its statement named by the client's id, its parameters as bound), and run again on the
//! new connection with the statement prepared there first and named as that connection knows
//! it, its parameter types sent along when the connection has not had them. Not logged (the
//! transaction is then not replayable): an execute that opens a cursor, one whose statement was
//! given long data, and executes in MySQL's layout with query attributes.

use std::borrow::Cow;

use sluice_proto::consts::{cap, com};
use sluice_proto::packet::HEADER;

use super::session::Session;
use crate::error::Result;

/// Where an execute's new-parameters-bound flag is, for a statement of `params` parameters:
/// command, statement id, flags, iteration count, the NULL bitmap, then the flag.
pub(super) fn flag_at(params: u16) -> usize {
    10 + usize::from(params).div_ceil(8)
}

impl Session {
    /// Whether the execute in the client buffer (of statement `client_id`) can be logged; why
    /// not otherwise.
    pub(super) fn loggable_execute(&self, client_id: Option<u32>) -> std::result::Result<(), &'static str> {
        const WHY: &str = "a prepared statement ran in it with a cursor, long data or query attributes";
        let p = client_id.and_then(|id| self.state.prepared.get(&id)).ok_or(WHY)?;
        let flags = self.client.rbuf.get(HEADER + 5).copied().ok_or(WHY)?;
        if flags != 0 || p.long_data || self.backend.caps & cap::QUERY_ATTRIBUTES != 0 {
            return Err(WHY);
        }
        Ok(())
    }

    /// The SQL text of a logged request: a query's, or the text of the statement an execute
    /// runs (empty when it is no longer prepared).
    pub(super) fn logged_sql<'a>(&'a self, request: &'a [u8]) -> &'a [u8] {
        match request.first() {
            Some(&com::STMT_EXECUTE) => {
                let id = request.get(1..5).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                self.state.prepared.get(&id).map_or(&[][..], |p| p.sql.as_bytes())
            }
            _ => request.get(1..).unwrap_or_default(),
        }
    }

    /// A logged request as it is sent again on the session's connection: an execute names its
    /// statement as the connection knows it (prepared there first when it is not) and carries
    /// the parameter types the connection has not had. None: the statement was closed since.
    pub(super) async fn request_again<'a>(&mut self, logged: &'a [u8]) -> Result<Option<Cow<'a, [u8]>>> {
        if logged.first() != Some(&com::STMT_EXECUTE) {
            return Ok(Some(Cow::Borrowed(logged)));
        }
        let Some(id) = logged.get(1..5).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) else { return Ok(None) };
        if !self.state.prepared.contains_key(&id) {
            return Ok(None);
        }
        if self.find_prepared(id) {
            Box::pin(self.prepare_again(id)).await?;
        }
        let Some(p) = self.state.prepared.get_mut(&id) else { return Ok(None) };
        let mut request = logged.to_vec();
        request[1..5].copy_from_slice(&p.backend_id.to_le_bytes());
        let at = flag_at(p.params);
        if p.params > 0 && request.get(at) == Some(&0) && p.types_unsent && p.param_types.len() == 2 * usize::from(p.params) {
            request[at] = 1;
            request.splice(at + 1..at + 1, p.param_types.iter().copied());
        }
        if p.params > 0 && request.get(at) == Some(&1) {
            p.types_unsent = false;
            let types = request.get(at + 1..at + 1 + 2 * usize::from(p.params)).unwrap_or_default();
            if let Some(on) = self.backend.carries.as_mut().and_then(|c| c.stmts.get_mut(&p.sql)).filter(|on| on.id == p.backend_id) {
                on.types.clear();
                on.types.extend_from_slice(types);
            }
        }
        Ok(Some(Cow::Owned(request)))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bound_flag_follows_the_null_bitmap() {
        assert_eq!(super::flag_at(0), 10);
        assert_eq!(super::flag_at(1), 11);
        assert_eq!(super::flag_at(8), 11);
        assert_eq!(super::flag_at(9), 12);
    }
}

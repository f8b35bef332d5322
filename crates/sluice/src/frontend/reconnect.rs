//! Moving a session to a new backend connection. When a users-mode session's backend connection
//! is lost while the session is idle between statements (the backend was killed, restarted or
//! stopped, or closed the connection), the session is not closed: at its next command sluice
//! logs in again with the credentials it holds, on another backend when one is usable, restores
//! what the session had changed (schema, session variables, prepared statements) and goes on.
//! Statement ids the client holds keep working: from then on they are mapped to the new
//! connection's ids (`SessionState::stmt_ids_mapped`).
//!
//! A session cannot move when sluice could not recreate it exactly: passthrough logins (no
//! credentials), an open transaction, cursor or long data, or state sluice does not track (user
//! variables, temporary tables, locks, SQL `PREPARE`; see `SessionState::pins`). Those get an
//! error at their next command and a clean close.

use sluice_proto::consts::{cap, com, err as code};
use sluice_proto::packet::frame;
use sluice_proto::response::{Expect, ResponseTracker, Sink, State};
use tokio::io::AsyncReadExt;

use super::relay::Session;
use crate::backend::conn as bconn;
use crate::backend::link::{TRACK_ALL, backend_response, open_any, set_up_query};
use crate::error::{Error, Result, Side};
use crate::net::{BUF_SIZE, PacketConn};

impl Session<'_> {
    /// Whether a lost backend connection could be replaced without the client noticing.
    pub(super) fn may_move(&self) -> bool {
        self.credential.is_some() && self.profile.is_some() && self.state.movable()
    }

    /// Asks the backend connection to report every variable change (after a login, a
    /// COM_RESET_CONNECTION or a COM_CHANGE_USER, which all start from the server's defaults).
    /// Only sessions sluice could move need it.
    pub(super) async fn track_variables(&mut self) {
        if self.credential.is_none() {
            return;
        }
        if let Err(e) = set_up_query(&mut self.backend, TRACK_ALL, self.guard.connect_timeout).await {
            tracing::warn!(session = self.handle.id, backend = %self.guard.name, error = %e.message, "cannot track session variables; the session will not move");
        }
    }

    /// Moves the session after its backend connection was lost; when it cannot move, the client
    /// gets an error for its command and the session ends.
    pub(super) async fn move_or_fail(&mut self, reason: &str) -> Result<()> {
        let from = self.guard.name.clone();
        match self.move_session().await {
            Ok(()) => {
                self.ctx.metrics.session_moves[0].inc();
                tracing::info!(session = self.handle.id, from = %from, to = %self.guard.name, "session moved to a new backend connection");
                Ok(())
            }
            Err(e) => {
                self.ctx.metrics.session_moves[1].inc();
                let msg = format!(
                    "sluice: the connection to backend {from} was lost ({reason}) and the session could not be recreated: {}",
                    e.message
                );
                self.client_error(1, code::SERVER_LOST, b"HY000", &msg).await;
                Err(Error::new(Side::Backend, code::SERVER_LOST, msg))
            }
        }
    }

    /// Logs in to a backend again (another one first) and restores the session there.
    pub(super) async fn move_session(&mut self) -> Result<()> {
        let lost = self.guard.index;
        let mut tried = vec![(lost, Error::backend("the session's connection to it was lost"))];
        loop {
            let o = match open_any(&self.ctx.backends, &mut tried).await {
                Ok(o) => o,
                // Nothing else is usable: the lost backend itself may be back (a restart), or
                // only the connection was closed (wait_timeout).
                Err(_) if tried.first().is_some_and(|(i, _)| *i == lost) && self.guard.is_up() => {
                    tried.remove(0);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let (Some(profile), Some(credential)) = (self.profile.as_ref(), self.credential.as_ref()) else {
                return Err(Error::proxy(code::UNKNOWN_ERROR, "sluice holds no credentials for this session"));
            };
            let client_tls = self.client.stream.is_tls();
            let tls = match o.backend.tls.decide(client_tls, &o.greeting) {
                Ok(tls) => tls,
                Err(e) => {
                    tried.push((o.backend.index, e));
                    continue;
                }
            };
            let mut bhr = backend_response(profile, &o.greeting, self.client_caps(), tls);
            bhr.database = self.state.schema.as_ref().map(|s| s.as_bytes().to_vec());
            bhr.capabilities |= if bhr.database.is_some() { cap::CONNECT_WITH_DB } else { 0 };
            let mariadb = o.greeting.capabilities & cap::LONG_PASSWORD == 0;
            // (Whether the new connection is TLS may differ: nothing after the login depends on
            // it.)
            if (bhr.capabilities ^ self.backend_caps()) & !(cap::CONNECT_WITH_DB | cap::SSL) != 0 || mariadb != self.mariadb {
                tried.push((o.backend.index, Error::connect("its capabilities differ from the lost backend's")));
                continue;
            }
            let mut conn = match bconn::login(&o.backend, o.conn, &o.greeting, bhr, credential).await {
                Ok(c) => c,
                Err(e) if e.retry == crate::error::Retry::Safe => {
                    tried.push((o.backend.index, e));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let ids = bconn::bounded(o.backend.connect_timeout, "session restore", self.restore(&mut conn)).await?;
            for (client_id, backend_id) in ids {
                if let Some(p) = self.state.prepared.get_mut(&client_id) {
                    p.backend_id = backend_id;
                    p.types_unsent = p.params > 0;
                }
            }
            if let Some(max) = self.state.prepared.keys().max() {
                self.state.stmt_ids_mapped = true;
                self.state.next_stmt_id = self.state.next_stmt_id.max(max.wrapping_add(1)).max(1);
            }
            self.handle.info.lock().backend_tls = conn.stream.is_tls();
            self.fit.backend_tls = o.backend.tls.wanted(client_tls);
            self.backend = conn;
            self.touched = true;
            self.guard = o.backend.bind();
            self.handle.bind_backend(o.backend.index, &o.backend.name, o.greeting.connection_id);
            self.handle.publish(&self.state);
            return Ok(());
        }
    }

    /// Recreates the session's variables and prepared statements on a fresh connection, in one
    /// round trip. Returns the new statement ids by client id.
    async fn restore(&mut self, conn: &mut PacketConn) -> Result<Vec<(u32, u32)>> {
        let mut set = TRACK_ALL.to_vec();
        for (name, value) in &self.state.variables {
            if name != "session_track_system_variables" && valid_name(name) {
                set.extend_from_slice(b", ");
                set.extend_from_slice(name.as_bytes());
                set.push(b'=');
                set_value(&mut set, value);
            }
        }
        let mut out = Vec::new();
        let mut payload = vec![com::QUERY];
        payload.extend_from_slice(&set);
        frame(&mut out, &payload, 0);
        let statements: Vec<(u32, &str, u16, u16)> =
            self.state.prepared.iter().map(|(id, p)| (*id, p.sql.as_str(), p.params, p.columns)).collect();
        for (_, sql, _, _) in &statements {
            payload.clear();
            payload.push(com::STMT_PREPARE);
            payload.extend_from_slice(sql.as_bytes());
            frame(&mut out, &payload, 0);
        }
        conn.stream
            .write_within(std::time::Duration::ZERO, &out)
            .await
            .map_err(|e| Error::io(Side::Backend, "restoring the session", e))?;

        let caps = self.backend_caps();
        let deprecate_eof = caps & cap::DEPRECATE_EOF != 0;
        let track = caps & cap::SESSION_TRACK != 0;
        let mut tracker = ResponseTracker::new(deprecate_eof, track);
        let mut sink = Collect::default();
        read_response(&mut tracker, Expect::Results, conn, &mut sink).await?;
        if let Some(e) = sink.error.take() {
            return Err(Error::backend(format!("restoring session variables: {e}")));
        }
        let mut ids = Vec::with_capacity(statements.len());
        for (client_id, sql, params, columns) in statements {
            read_response(&mut tracker, Expect::Prepare, conn, &mut sink).await?;
            match (sink.error.take(), sink.prepared.take()) {
                (None, Some((id, c, p))) if c == columns && p == params => ids.push((client_id, id)),
                (e, _) => {
                    let why = e.unwrap_or_else(|| "its shape changed".into());
                    return Err(Error::backend(format!("re-preparing statement {client_id} ({sql}): {why}")));
                }
            }
        }
        Ok(ids)
    }
}

impl Session<'_> {
    /// Remembers the parameter types an execute sends, and adds them to an execute that does
    /// not send them when the statement was re-prepared on a new connection since. `payload` is
    /// the whole execute command (its first packet), before statement ids are mapped.
    pub(super) fn execute_types(&mut self, h: sluice_proto::packet::Header) -> Result<()> {
        use sluice_proto::packet::HEADER;
        let end = HEADER + h.len;
        let Some(payload) = self.client.rbuf.get(HEADER..end) else { return Ok(()) };
        let Some(id) = payload.get(1..5).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) else { return Ok(()) };
        let Some(p) = self.state.prepared.get_mut(&id).filter(|p| p.params > 0) else { return Ok(()) };
        let params = p.params as usize;
        // Command, statement id, flags, iteration count, NULL bitmap, then the flag.
        let flag_at = 10 + params.div_ceil(8);
        let types = flag_at + 1..flag_at + 1 + 2 * params;
        match payload.get(flag_at) {
            Some(1) if payload.len() >= types.end => {
                p.param_types.clear();
                p.param_types.extend_from_slice(&payload[types]);
                p.types_unsent = false;
            }
            Some(0) if p.types_unsent && p.param_types.len() == 2 * params => {
                // The client bound its types on the old connection: send them to the new one.
                let mut fixed = Vec::with_capacity(h.len + 2 * params + HEADER);
                let mut body = Vec::with_capacity(h.len + 2 * params);
                body.extend_from_slice(&payload[..flag_at]);
                body.push(1);
                body.extend_from_slice(&p.param_types);
                body.extend_from_slice(&payload[flag_at + 1..]);
                if body.len() >= sluice_proto::consts::MAX_PAYLOAD {
                    return Err(Error::proxy(code::UNKNOWN_ERROR, "an execute too large to re-send its parameter types after a move"));
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
}

/// Reads one whole response off `conn`, without forwarding it.
async fn read_response(tracker: &mut ResponseTracker, expect: Expect, conn: &mut PacketConn, sink: &mut Collect) -> Result<()> {
    use bytes::Buf;
    tracker.start(expect, 0);
    loop {
        let scan = tracker.scan(&conn.rbuf, sink).map_err(|e| Error::malformed(Side::Backend, e))?;
        conn.rbuf.advance(scan.consumed);
        match scan.state {
            State::Done => return Ok(()),
            State::Rewrite { len } => conn.rbuf.advance(len),
            State::LocalInfile => return Err(Error::backend("unexpected LOCAL INFILE request while restoring a session")),
            State::Pending => {
                conn.rbuf.reserve(BUF_SIZE);
                match conn.stream.read_buf(&mut conn.rbuf).await {
                    Ok(0) => return Err(Error::backend("the backend closed the connection while a session was restored")),
                    Ok(_) => {}
                    Err(e) => return Err(Error::io(Side::Backend, "restoring the session", e)),
                }
            }
        }
    }
}

#[derive(Default)]
struct Collect {
    error: Option<String>,
    prepared: Option<(u32, u16, u16)>,
}

impl Sink for Collect {
    fn err(&mut self, e: &sluice_proto::basic::Err<'_>) {
        self.error = Some(format!("{} {}", e.code, String::from_utf8_lossy(e.message)));
    }
    fn prepared(&mut self, id: u32, columns: u16, params: u16) {
        self.prepared = Some((id, columns, params));
    }
}

/// Variable names as the backend reports them: letters, digits and `_`.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Writes a variable's value as SQL: numbers bare, NULL as NULL, anything else as a string
/// literal in hex (no quoting or escaping to get wrong, whatever the sql_mode).
fn set_value(out: &mut Vec<u8>, value: &str) {
    let numeric = {
        let digits = value.strip_prefix('-').unwrap_or(value);
        !digits.is_empty() && digits.bytes().filter(|&c| c == b'.').count() <= 1 && digits.bytes().all(|c| c.is_ascii_digit() || c == b'.')
    };
    if numeric || value == "NULL" {
        out.extend_from_slice(value.as_bytes());
    } else if value.is_empty() {
        out.extend_from_slice(b"''");
    } else {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.extend_from_slice(b"_utf8mb4 X'");
        for b in value.bytes() {
            out.extend_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
        out.push(b'\'');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_sql_literals() {
        let lit = |v: &str| {
            let mut o = Vec::new();
            set_value(&mut o, v);
            String::from_utf8(o).unwrap()
        };
        assert_eq!(lit("28800"), "28800");
        assert_eq!(lit("-1.5"), "-1.5");
        assert_eq!(lit("NULL"), "NULL");
        assert_eq!(lit(""), "''");
        assert_eq!(lit("ON"), "_utf8mb4 X'4f4e'");
        assert_eq!(lit("1.2.3"), "_utf8mb4 X'312e322e33'");
        assert!(valid_name("sql_mode"));
        assert!(!valid_name("a; DROP"));
    }
}

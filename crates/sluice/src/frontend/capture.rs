//! What a session records while a capture runs (`crate::capture`): its state when the capture
//! first sees it (so that replay can rebuild it, whether it opened before the capture or
//! during it), each command as the client sent it, and a summary of each response.
//! Passwords and keys never reach the files: a statement that may carry one
//! (`sluice_proto::secret`) is recorded with its literals taken out, the executes of such a
//! prepared statement without their parameters, and COM_CHANGE_USER without its
//! authentication data.

use sluice_proto::consts::com;
use sluice_proto::packet::{HEADER, Header};

use super::session::{INSPECT_LIMIT, Mark, Session};
use crate::capture::Kind;
use crate::capture::record::{self, Begin, Summary, flag};
use crate::capture::sums::RowSums;
use crate::metrics::mono_ns;
use crate::worker::index as worker;

/// What the relay saw of a recorded command's response.
pub(super) struct Response {
    pub error: Option<u16>,
    /// The id a COM_STMT_PREPARE gave the client.
    pub stmt_id: Option<u32>,
    pub rows: u64,
    pub affected: u64,
    pub sums: Option<Box<RowSums>>,
}

impl Session {
    /// Waits at the gate of a consistent capture start (the command waits with it); the
    /// capture's generation once it opens.
    pub(super) async fn wait_gate(&mut self) -> u64 {
        self.handle.gated.store(true, std::sync::atomic::Ordering::Relaxed);
        self.ctx.capture.wait_gate().await;
        self.handle.gated.store(false, std::sync::atomic::Ordering::Relaxed);
        self.ctx.capture.generation()
    }

    /// Records the command whose first header is `h` (its bytes are in the client buffer), if
    /// the capture `generation` takes this session; whether it did (its response is then
    /// summed up).
    #[inline(never)]
    pub(super) fn capture_command(&mut self, generation: u64, cmd: u8, h: Header) -> bool {
        if generation & crate::capture::GATE != 0 {
            // (A session in a transaction runs on while the gate is closed, unrecorded.)
            return false;
        }
        let mark = self.capture.get_or_insert_with(Default::default);
        if mark.generation != generation {
            let on = self.ctx.capture.admits(u64::from(self.handle.id), &self.state.user, self.state.schema.as_deref());
            let mark = self.capture.as_mut().expect("inserted above");
            **mark = Mark { generation, on, ..Mark::default() };
            if on && !self.capture_begin(generation) {
                return false;
            }
        }
        let Some(mark) = self.capture.as_ref().filter(|m| m.on) else { return false };
        let number = mark.number + 1;
        let whole = h.len <= INSPECT_LIMIT;
        let Some(body) = self.client.rbuf.get(HEADER..HEADER + h.len.min(INSPECT_LIMIT)).filter(|b| !b.is_empty()) else {
            return false;
        };
        // (In any reading of its text: `sluice_proto::secret`.)
        let secret_text = matches!(cmd, com::QUERY | com::STMT_PREPARE) && sluice_proto::secret::may_carry(&body[1..]);
        let secret_execute = match cmd {
            com::STMT_EXECUTE | com::STMT_SEND_LONG_DATA | com::STMT_BULK_EXECUTE => self.executes_secret(body),
            com::QUERY => self.executes_secret_sql(&body[1..]),
            _ => false,
        };
        let mark = self.capture.as_mut().expect("checked above");
        let out = &mut mark.payload;
        out.clear();
        mark.flags = if whole { 0 } else { flag::TRUNCATED };
        match cmd {
            com::CHANGE_USER => {
                mark.flags |= flag::CHANGE_USER;
                out.push(cmd);
                out.extend_from_slice(body[1..].split(|&b| b == 0).next().unwrap_or_default());
            }
            com::QUERY | com::STMT_PREPARE if secret_text || (cmd == com::QUERY && secret_execute) => {
                mark.flags |= flag::REDACTED;
                out.push(cmd);
                sluice_proto::secret::redact_into(&body[1..], out);
            }
            _ if secret_execute => {
                mark.flags |= flag::REDACTED;
                out.extend_from_slice(&body[..body.len().min(5)]);
            }
            _ => out.extend_from_slice(body),
        }
        mark.len = h.len as u64;
        mark.number = number;
        mark.pending = true;
        mark.started_ns = 0;
        mark.summary = Summary::default();
        true
    }

    /// Whether the statement an execute (or its long data, or a bulk execute) names was
    /// recorded redacted. MariaDB's id 0xFFFFFFFF names the statement prepared last (the
    /// highest id); a command too short to name one is taken for a secret's.
    fn executes_secret(&self, body: &[u8]) -> bool {
        let Some(id) = body.get(1..5).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) else { return true };
        let id = if id == u32::MAX { self.state.prepared.keys().copied().max().unwrap_or(id) } else { id };
        self.state.prepared.get(&id).is_some_and(|p| p.secret)
    }

    /// Whether `EXECUTE name USING ...` runs an SQL-prepared statement that may carry a
    /// password (its parameters may be it).
    fn executes_secret_sql(&self, sql: &[u8]) -> bool {
        // (Most queries are not EXECUTEs: a look at the first byte first.)
        let first = sql.iter().find(|b| !b.is_ascii_whitespace()).map(|b| b | 0x20);
        first == Some(b'e')
            && self.state.readings(sql).iter().any(|m| {
                sluice_proto::sql::executed_name(sql, m)
                    .and_then(|name| self.state.sql_prepared.get(&name).map(|q| sluice_proto::secret::may_carry(q.as_bytes())))
                    .unwrap_or(false)
            })
    }

    /// The session's state as the capture first sees it; false when the capture ended.
    fn capture_begin(&mut self, generation: u64) -> bool {
        let s = &self.state;
        let pairs = |v: &crate::session::vars::Vars| v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        // (The texts of statements that may carry a password are kept with their literals taken
        // out, as their prepares are recorded.)
        let shown = |t: &str| crate::session::shown_text(t.as_bytes()).into_owned();
        let mut prepared: Vec<(u32, Vec<u8>, Vec<u8>)> =
            s.prepared.iter().map(|(id, p)| (*id, shown(&p.sql).into_bytes(), p.param_types.clone())).collect();
        prepared.sort_by_key(|p| p.0);
        let begin = Begin {
            user: s.user.to_string(),
            schema: s.schema.as_deref().map(String::from),
            client: self.handle.info.lock().client.to_string(),
            collation: s.collation,
            capabilities: self.client_caps(),
            in_transaction: s.in_transaction(),
            variables: pairs(&s.variables),
            prepared,
            sql_prepared: s.sql_prepared.iter().map(|(k, v)| (k.to_string(), shown(v))).collect(),
            user_variables: pairs(&s.user_variables),
            backend: self.backend.guard.name.clone(),
        };
        let (session, at_us) = (u64::from(self.handle.id), self.ctx.capture.at_us(mono_ns()));
        self.ctx.capture.append(worker(), generation, Kind::Begin, |out| record::put_begin(out, session, at_us, &begin))
    }

    /// The row sums for a recorded command's response.
    pub(super) fn capture_sums(&mut self) -> Box<RowSums> {
        self.capture.as_mut().and_then(|m| m.sums.take()).unwrap_or_default()
    }

    /// Notes what the response to the recorded command was: the relay forwarded the command
    /// at `started_ns` and the response ended at `ended_ns` (`mono_ns`).
    pub(super) fn capture_response(&mut self, r: Response, started_ns: u64, ended_ns: u64) {
        if let Some(m) = self.capture.as_mut().filter(|m| m.pending) {
            m.started_ns = started_ns;
            let (ordered, unordered) = match r.sums {
                Some(mut s) => {
                    let sums = s.finish();
                    m.sums = Some(s);
                    sums
                }
                None => (0, 0),
            };
            let (error, stmt_id) = (r.error.unwrap_or(0), r.stmt_id.unwrap_or(0));
            let latency_us = ended_ns.saturating_sub(started_ns) / 1000;
            m.summary = Summary { error, affected: r.affected, rows: r.rows, ordered, unordered, latency_us, stmt_id };
        }
    }

    /// An error sluice answered the recorded command with (no backend response).
    pub(super) fn capture_error(&mut self, code: u16) {
        if let Some(m) = self.capture.as_mut().filter(|m| m.pending) {
            m.summary.error = code;
        }
    }

    /// Writes the recorded command and its result, once the command is through.
    pub(super) fn capture_result(&mut self) {
        let Some(m) = self.capture.as_mut().filter(|m| m.pending) else { return };
        m.pending = false;
        if m.started_ns == 0 {
            // (Answered by sluice: no time at the server, its latency stays 0.)
            m.started_ns = mono_ns();
        }
        let (session, number, at_us) = (u64::from(self.handle.id), m.number, self.ctx.capture.at_us(m.started_ns));
        let m = &**m;
        self.ctx.capture.append(worker(), m.generation, Kind::Command, |out| {
            record::put_exchange(out, session, at_us, number, m.flags, m.len, &m.payload, &m.summary);
        });
    }

    /// The session ends: recorded when the capture took it.
    pub(super) fn capture_end(&mut self) {
        self.capture_result();
        if let Some(m) = self.capture.as_ref().filter(|m| m.on) {
            let (session, at_us) = (u64::from(self.handle.id), self.ctx.capture.at_us(mono_ns()));
            self.ctx.capture.append(worker(), m.generation, Kind::Other, |out| record::put_end(out, session, at_us));
        }
    }
}

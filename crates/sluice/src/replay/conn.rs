//! One replayed session's connection to the target: logged in as the replay user with the
//! captured session's capabilities, schema and character set, brought to its captured state,
//! then sent its commands as they were captured, with prepared statement ids mapped to the
//! target's, and each response summed up the way capture summed up the original.

use super::NotReplayed;
use crate::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf;
use rustc_hash::FxHashMap;
use sluice_proto::consts::{cap, com};
use sluice_proto::handshake::HandshakeResponse;
use sluice_proto::response::{Expect, ResponseTracker, Sink, State};
use tokio::io::AsyncReadExt;

use crate::backend::conn::{self as bconn, Credential};
use crate::backend::{Backend, restore, shared::ConnState};
use crate::capture::record::{Begin, Summary};
use crate::capture::sums::RowSums;
use crate::net::{BUF_SIZE, PacketConn};
use crate::session::SessionState;

/// A statement prepared on the target: its id there, its parameter count, and whether
/// parameter types were sent for it yet (an execute that sends none relies on them).
struct Stmt {
    id: u32,
    params: u16,
    types_sent: bool,
    /// The types the captured session had sent before the capture (from its state).
    types: Vec<u8>,
}

pub struct Conn {
    conn: PacketConn,
    caps: u32,
    tracker: ResponseTracker,
    /// Captured statement id -> the target's.
    stmts: FxHashMap<u32, Stmt>,
}

/// What a response was, as capture sums it up.
#[derive(Default)]
struct Collect {
    error: Option<u16>,
    affected: u64,
    rows: u64,
    sums: RowSums,
    prepared: Option<(u32, u16)>,
}

impl Sink for Collect {
    fn ok(&mut self, ok: &sluice_proto::basic::Ok<'_>) {
        self.affected = self.affected.saturating_add(ok.affected_rows);
    }
    fn err(&mut self, e: &sluice_proto::basic::Err<'_>) {
        self.error.get_or_insert(e.code);
    }
    fn row(&mut self, payload: &[u8]) {
        self.rows += 1;
        self.sums.row(payload);
    }
    fn row_more(&mut self, bytes: &[u8]) {
        self.sums.more(bytes);
    }
    fn prepared(&mut self, id: u32, _columns: u16, params: u16) {
        self.prepared = Some((id, params));
    }
}

/// What a command leads to: the response it expects, or none.
fn expect(payload: &[u8]) -> Option<Expect> {
    Some(Expect::of(payload)).filter(|e| *e != Expect::Nothing)
}

impl Conn {
    /// Logs in to `b` as `user` for the captured session `begin` (its capabilities, schema and
    /// character set) and brings the connection to its captured state.
    pub async fn open(b: &Arc<Backend>, user: &str, password: &str, begin: &Begin, timeout: Duration) -> Result<Conn, Error> {
        let (conn, g) = bconn::open(b, timeout, bconn::Origin::Sluice).await?;
        let tls = b.tls.decide(false, &g)?;
        let mut caps = bconn::backend_capabilities(begin.capabilities, &g, tls) & !cap::CONNECT_ATTRS;
        if begin.schema.is_some() {
            caps |= cap::CONNECT_WITH_DB;
        }
        let hr = HandshakeResponse {
            capabilities: caps,
            max_packet: 1 << 30,
            collation: if begin.collation == 0 { g.collation } else { begin.collation },
            user: user.as_bytes().to_vec(),
            database: begin.schema.as_ref().map(|s| s.as_bytes().to_vec()),
            ..Default::default()
        };
        let conn = bconn::login(b, conn, &g, hr, &Credential::Password(password.as_bytes().to_vec())).await?;
        let tracker = ResponseTracker::new(caps & cap::DEPRECATE_EOF != 0, caps & cap::SESSION_TRACK != 0);
        let mut c = Conn { conn, caps, tracker, stmts: FxHashMap::default() };
        c.restore(begin, timeout).await?;
        Ok(c)
    }

    /// Variables, user variables and SQL PREPAREs through sluice's own restore (as a moved
    /// session's), then the captured session's prepared statements.
    async fn restore(&mut self, begin: &Begin, timeout: Duration) -> Result<(), Error> {
        let mut want = SessionState {
            schema: begin.schema.as_deref().map(Into::into),
            multi_statements: self.caps & cap::MULTI_STATEMENTS != 0,
            ..Default::default()
        };
        for (k, v) in &begin.variables {
            want.variables.insert(k.clone(), v.clone());
        }
        for (k, v) in &begin.sql_prepared {
            want.sql_prepared.insert(k.clone(), v.clone());
        }
        for (k, v) in &begin.user_variables {
            want.user_variables.insert(k.clone(), v.clone());
        }
        let mut have = ConnState { schema: want.schema.clone(), multi_statements: want.multi_statements, ..Default::default() };
        restore::bring(&mut self.conn, &mut have, &want, self.caps, timeout)
            .await
            .map_err(|e| Error { message: format!("restoring the session: {}", e.message), ..e })?;
        for (id, sql, types) in &begin.prepared {
            let text = String::from_utf8_lossy(sql);
            let (new, _, params) = restore::prepare(&mut self.conn, &text, self.caps, timeout)
                .await
                .map_err(|e| Error { message: format!("preparing {text:?}: {}", e.message), ..e })?;
            self.stmts.insert(*id, Stmt { id: new, params, types_sent: false, types: types.clone() });
        }
        Ok(())
    }

    /// Runs one captured command (`captured_stmt`: the id the capture says a COM_STMT_PREPARE
    /// gave); its summary. Err: the connection failed (or the command names an unknown
    /// statement), with why.
    pub async fn run(&mut self, payload: &[u8], captured_stmt: u32) -> Result<Summary, NotReplayed> {
        let started = Instant::now();
        let mut owned;
        let mut p = payload;
        let names = matches!(p[0], com::STMT_EXECUTE | com::STMT_FETCH | com::STMT_CLOSE | com::STMT_RESET | com::STMT_SEND_LONG_DATA);
        if names && p.len() >= 5 {
            let id = u32::from_le_bytes([p[1], p[2], p[3], p[4]]);
            let Some(s) = self.stmts.get_mut(&id) else { return Err(NotReplayed::NotPrepared(id)) };
            owned = p.to_vec();
            owned[1..5].copy_from_slice(&s.id.to_le_bytes());
            if p[0] == com::STMT_EXECUTE {
                with_types(&mut owned, s);
            }
            if p[0] == com::STMT_CLOSE {
                self.stmts.remove(&id);
            }
            p = &owned;
        }
        self.conn.write_packet(p, 0).await.map_err(|e| NotReplayed::Failed(format!("sending a command: {e}")))?;
        let Some(expect) = expect(p) else { return Ok(Summary::default()) };
        let c = self.response(expect).await?;
        if let (com::STMT_PREPARE, Some((id, params))) = (p[0], c.prepared) {
            self.stmts.insert(captured_stmt, Stmt { id, params, types_sent: false, types: Vec::new() });
        }
        let mut sums = c.sums;
        let (ordered, unordered) = sums.finish();
        Ok(Summary {
            error: c.error.unwrap_or(0),
            affected: c.affected,
            rows: c.rows,
            ordered,
            unordered,
            latency_us: started.elapsed().as_micros() as u64,
            stmt_id: c.prepared.map_or(0, |p| p.0),
        })
    }

    async fn response(&mut self, expect: Expect) -> Result<Collect, NotReplayed> {
        let mut sink = Collect::default();
        self.tracker.start(expect, 0);
        loop {
            let scan =
                self.tracker.scan(&self.conn.rbuf, &mut sink).map_err(|e| NotReplayed::Failed(format!("a malformed response: {e:?}")))?;
            self.conn.rbuf.advance(scan.consumed);
            match scan.state {
                State::Done => return Ok(sink),
                State::Rewrite { len } => self.conn.rbuf.advance(len),
                // (No hold is asked for here: the scan goes on.)
                State::Held => {}
                State::LocalInfile => {
                    // The file was the client's: it is not in the capture. An empty one.
                    let seq = self.tracker.last_seq.wrapping_add(1);
                    self.conn.write_packet(&[], seq).await.map_err(|e| NotReplayed::Failed(format!("answering LOCAL INFILE: {e}")))?;
                    self.tracker.after_infile();
                }
                State::Pending => {
                    self.conn.rbuf.reserve(BUF_SIZE);
                    match self.conn.stream.read_buf(&mut self.conn.rbuf).await {
                        Ok(0) => return Err(NotReplayed::Failed("the server closed the connection".into())),
                        Ok(_) => {}
                        Err(e) => return Err(NotReplayed::Failed(format!("reading a response: {e}"))),
                    }
                }
            }
        }
    }

    pub async fn quit(mut self) {
        self.conn.write_packet(&[com::QUIT], 0).await.ok();
    }
}

/// An execute that sends no parameter types, of a statement the capture saw them sent for
/// before it started: the types go in (the target has never had them).
fn with_types(exec: &mut Vec<u8>, s: &mut Stmt) {
    let n = usize::from(s.params);
    let bound_at = 10 + n.div_ceil(8);
    if n == 0 || exec.len() <= bound_at {
        return;
    }
    if exec[bound_at] == 1 {
        s.types_sent = true;
    } else if !s.types_sent && s.types.len() == 2 * n {
        exec[bound_at] = 1;
        exec.splice(bound_at + 1..bound_at + 1, s.types.iter().copied());
        s.types_sent = true;
    }
}

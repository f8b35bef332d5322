//! Commands sluice must rewrite rather than relay as they are: KILL (client-visible ids are
//! sluice's, not the backend's) and COM_CHANGE_USER (the login is re-run against the backend).

use std::sync::atomic::Ordering;

use bytes::Buf;
use sluice_proto::consts::{cap, com, err as code};
use sluice_proto::handshake::{ChangeUser, HandshakeResponse};
use sluice_proto::packet::{HEADER, Header};
use sluice_proto::response::Expect;
use sluice_proto::sql::{self, Kill};
use tokio::io::AsyncWriteExt;

use super::relay::{Flow, Session, relay_response};
use crate::backend::conn as bconn;
use crate::error::{Error, Result, Side};
use crate::session::StateSink;

/// The plugin name that makes a backend answer with an auth switch and a fresh scramble.
const SWITCH_PLUGIN: &[u8] = b"sluice_passthrough";

impl Session<'_> {
    /// KILL [QUERY] <sluice id> and COM_PROCESS_KILL: translated to the target's backend thread.
    /// Returns None when the command is not a KILL of a connection id.
    pub(super) async fn intercept_kill(&mut self, cmd: u8, body_end: usize) -> Result<Option<Flow>> {
        let payload = &self.client.rbuf[HEADER + 1..body_end];
        let kill = if cmd == com::PROCESS_KILL {
            let Some(b) = payload.get(..4) else { return Ok(None) };
            Kill { query_only: false, id: u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64, hard: None }
        } else {
            match sql::starts_with_keyword(payload, "KILL").then(|| sql::parse_kill(payload)).flatten() {
                Some(k) => k,
                None => return Ok(None),
            }
        };
        self.skip_request().await?;
        let target = u32::try_from(kill.id).ok().and_then(|id| self.ctx.sessions.get(id));
        let Some(target) = target else {
            self.client_error(1, code::NO_SUCH_THREAD, b"HY000", &format!("Unknown thread id: {}", kill.id)).await;
            return Ok(Some(Flow::Continue));
        };
        let tid = target.backend_thread_id.load(Ordering::Relaxed);
        let tb = target.backend_index.load(Ordering::Relaxed) as usize;
        let mut q = vec![com::QUERY];
        sql::write_kill(&kill, tid as u64, &mut q);
        let ok = if tb == self.guard.index {
            let mut pkt = Vec::with_capacity(q.len() + HEADER);
            sluice_proto::packet::frame(&mut pkt, &q, 0);
            self.backend.stream.write_all(&pkt).await.map_err(|e| Error::io(Side::Backend, "sending KILL", e))?;
            let mut sink = StateSink { state: &mut self.state, preparing: None, executing: None, error: None, changed: false };
            relay_response(&mut self.tracker, Expect::Results, 0, &mut self.backend, &mut self.client, &mut sink, self.ctx).await?;
            sink.error.is_none()
        } else {
            self.kill_elsewhere(tb, &q).await?
        };
        if ok && !kill.query_only {
            target.kill();
        }
        Ok(Some(Flow::Continue))
    }

    /// Runs a KILL on another backend over a fresh connection with this session's credentials
    /// (users mode) and relays the answer.
    async fn kill_elsewhere(&mut self, backend_index: usize, query: &[u8]) -> Result<bool> {
        let Some(b) = self.ctx.backends.list.get(backend_index).cloned() else {
            self.client_error(1, code::NO_SUCH_THREAD, b"HY000", "Unknown thread id").await;
            return Ok(false);
        };
        let Some(cred) = self.credential.clone() else {
            let msg = format!(
                "sluice: that session is on backend {}; in passthrough mode sluice holds no credentials to reach it",
                b.name
            );
            self.client_error(1, 1095, b"HY000", &msg).await;
            return Ok(false);
        };
        let (conn, g) = bconn::open(&b, self.ctx.config.proxy.connect_timeout).await?;
        let hr = HandshakeResponse {
            capabilities: bconn::backend_capabilities(cap::SLUICE_SUPPORTED, &g, b.tls.is_some()),
            max_packet: 1 << 24,
            collation: self.state.collation,
            user: self.state.user.as_bytes().to_vec(),
            ..Default::default()
        };
        let mut conn = bconn::login(&b, conn, &g, hr, &cred).await?;
        conn.write_packet(query, 0).await.map_err(|e| Error::io(Side::Backend, "sending KILL", e))?;
        let (_, reply) = conn.read_packet(1 << 16).await.map_err(|e| Error::io(Side::Backend, "reading KILL result", e))?;
        bconn::quit(conn).await;
        self.client.write_packet(&reply, 1).await.map_err(|e| Error::io(Side::Client, "writing", e))?;
        Ok(reply.first() == Some(&0))
    }

    /// COM_CHANGE_USER: the client's reply was computed over sluice's scramble, so the packet is
    /// rewritten to make the backend ask again with its own; the exchange is then relayed
    /// (passthrough) or answered by sluice with the new user's credentials (users mode).
    pub(super) async fn change_user(&mut self, h: Header) -> Result<Flow> {
        if h.len + HEADER > self.client.rbuf.len() {
            self.skip_request().await?;
            self.client_error(1, code::NET_PACKET_TOO_LARGE, b"08S01", "COM_CHANGE_USER too large").await;
            return Ok(Flow::Continue);
        }
        let caps = self.client_caps();
        let parsed = ChangeUser::parse(&self.client.rbuf[HEADER..HEADER + h.len], caps);
        self.client.rbuf.advance(HEADER + h.len);
        let mut cu = match parsed {
            Ok(cu) => cu,
            Err(e) => {
                self.client_error(1, code::NET_READ_ERROR, b"08S01", &e.to_string()).await;
                return Err(Error::malformed(Side::Client, e));
            }
        };
        if !self.state.passthrough {
            self.client_error(1, code::NOT_SUPPORTED_YET, b"42000", "sluice: COM_CHANGE_USER is supported in passthrough mode only")
                .await;
            return Ok(Flow::Continue);
        }
        cu.auth_response.clear();
        cu.auth_plugin = Some(SWITCH_PLUGIN.to_vec());
        cu.collation.get_or_insert(self.state.collation as u16);
        let mut payload = Vec::new();
        cu.write(&mut payload);
        let io_b = |e| Error::io(Side::Backend, "change user", e);
        self.backend.write_packet(&payload, 0).await.map_err(io_b)?;
        loop {
            let (seq, mut p) = self.backend.read_packet(1 << 20).await.map_err(io_b)?;
            if p.first() == Some(&0) && caps & cap::SESSION_TRACK == 0 {
                p = sluice_proto::basic::strip_session_track(&p, self.mariadb).unwrap_or(p);
            }
            self.client.write_packet(&p, seq).await.map_err(|e| Error::io(Side::Client, "change user", e))?;
            match p.first() {
                Some(0x00) => {
                    self.state.reset();
                    self.state.user = String::from_utf8_lossy(&cu.user).into_owned();
                    self.state.schema = (!cu.database.is_empty()).then(|| String::from_utf8_lossy(&cu.database).into_owned());
                    if let Ok(ok) = sluice_proto::basic::Ok::parse(&p, self.backend_caps() & cap::SESSION_TRACK != 0) {
                        self.state.status = ok.status;
                    }
                    self.handle.publish(&self.state);
                    return Ok(Flow::Continue);
                }
                Some(0xff) => return Ok(Flow::Continue),
                Some(0x01) if p.get(1) == Some(&3) => {}
                Some(0xfe) | Some(0x01) => {
                    let (cseq, reply) = self.client_packet().await?;
                    self.backend.write_packet(&reply, cseq).await.map_err(io_b)?;
                }
                _ => return Err(Error::backend("unexpected packet during COM_CHANGE_USER")),
            }
        }
    }

    /// Reads one whole packet from the client (small packets of an auth exchange).
    async fn client_packet(&mut self) -> Result<(u8, Vec<u8>)> {
        loop {
            if let Some(h) = Header::parse(&self.client.rbuf) {
                if h.len > 1 << 16 {
                    return Err(Error::client("auth packet too large"));
                }
                if self.client.rbuf.len() >= HEADER + h.len {
                    let p = self.client.rbuf[HEADER..HEADER + h.len].to_vec();
                    self.client.rbuf.advance(HEADER + h.len);
                    return Ok((h.seq, p));
                }
            }
            match self.client.fill().await {
                Ok(0) => return Err(Error::client("client closed the connection during COM_CHANGE_USER")),
                Ok(_) => {}
                Err(e) => return Err(Error::io(Side::Client, "change user", e)),
            }
        }
    }
}

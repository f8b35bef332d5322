//! Sessions handed over to the process an upgrade started (`crate::control::upgrade`). Once the new
//! process accepts, each session of the old one, at its next wait for a command, sends its
//! client socket, its backend socket (when it holds one) and its whole state to the new
//! process in one message, and lets go of them without closing the connections; the new
//! process carries the session on where it was, on the same backend connection (a transaction
//! open on it stays open). The client notices nothing: no reconnect, the same connection id.
//!
//! A session stays in the old process (and ends there when its client leaves) when its
//! connection holds state no message can carry: TLS on either leg, half a compressed frame, a
//! capture recording it, a kill or a move under way, or a backend that spoke unasked.

use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use sluice_proto::compress::Algorithm;

use super::Admission;
use super::login::LoggedIn;
use super::session::Profile;
use super::session::Session;
use crate::backend::conn::Credential;
use crate::backend::pool::Fit;
use crate::backend::shared::ConnState;
use crate::ctx::Ctx;
use crate::net::{PacketConn, Stream};
use crate::session::{SessionHandle, StateParcel};

/// A session as it travels.
#[derive(Serialize, Deserialize)]
struct Parcel {
    id: u32,
    client: String,
    listener: String,
    connected_at_unix: u64,
    local: Option<std::net::SocketAddr>,
    client_unix: bool,
    /// Bytes of the client's next command read already.
    pending: Vec<u8>,
    /// The zstd level, or -1000 for zlib; None: not compressed.
    compression: Option<i32>,
    backend: String,
    /// The backend connection goes along (a Unix socket?); None: the session holds none
    /// (multiplexed, between statements).
    backend_unix: Option<bool>,
    backend_thread_id: u32,
    client_caps: u32,
    backend_caps: u32,
    mariadb: bool,
    scramble: [u8; 20],
    credential: Option<Secret>,
    profile: Option<Vec<u8>>,
    fit: Fit,
    state: StateParcel,
    conn: Option<ConnState>,
    conn_gen: u32,
    touched: bool,
    multiplex: bool,
    causal: Option<super::session::Causal>,
    /// Counted against its user's limit, and under `max_backend_connections`.
    user_slot: bool,
    slot: bool,
    queries: u64,
}

/// The credentials sluice logs in with on the session's behalf (they travel only between two
/// sluice processes, over their private socket pair; never logged).
#[derive(Serialize, Deserialize)]
enum Secret {
    Password(Vec<u8>),
    NativeStage1([u8; 20]),
}

const ZLIB: i32 = -1000;

impl Session {
    /// What keeps the session from being handed over now (None: nothing).
    fn kept_by(&self) -> Option<&'static str> {
        let h = &self.handle;
        if self.client.stream.plain_fd().is_none() {
            Some("its client connection is TLS")
        } else if self.client.holds_raw_bytes() {
            Some("part of a compressed frame is read")
        } else if !self.backend.conn.is_detached() && self.backend.conn.stream.plain_fd().is_none() {
            Some("its backend connection is TLS")
        } else if !self.backend.conn.rbuf.is_empty() || self.backend.lost.is_some() {
            Some("its backend connection spoke unasked or was lost")
        } else if self.capture.is_some() {
            Some("a capture records it")
        } else if h.killed.load(Ordering::Relaxed) || h.kill_pending.load(Ordering::Relaxed) || h.move_asked() {
            Some("a kill or a move is under way")
        } else {
            None
        }
    }

    /// Hands the session over to the new process when it can go now: true when it went (this
    /// process then lets go of its sockets without ending the connections). Between commands.
    pub(super) fn hand_off(&mut self) -> bool {
        if let Some(why) = self.kept_by() {
            tracing::debug!(session = self.handle.id, why, "upgrade: this session stays in the old process for now");
            return false;
        }
        let Some(client_fd) = self.client.stream.plain_fd() else { return false };
        let mut fds: Vec<RawFd> = vec![client_fd];
        fds.extend(self.backend.conn.stream.plain_fd());
        let text = match serde_json::to_vec(&self.parcel()) {
            Ok(t) if t.len() <= crate::sys::fdpass::MAX_MESSAGE => t,
            _ => {
                tracing::debug!(session = self.handle.id, "upgrade: this session's state is too large to hand over; it stays");
                return false;
            }
        };
        match self.ctx.handoff.send(&text, &fds) {
            Ok(()) => {
                self.ctx.metrics.sessions_handed_over.inc();
                tracing::debug!(session = self.handle.id, "upgrade: session handed over");
                true
            }
            // The new process is behind: again at the next wake.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => {
                tracing::warn!(session = self.handle.id, error = %e, "upgrade: handing the session over failed; it stays");
                false
            }
        }
    }

    fn parcel(&self) -> Parcel {
        let info = self.handle.info.lock();
        let (client, listener, connected_at_unix, local) =
            (info.client.clone(), info.listener.to_string(), info.connected_at_unix, info.local);
        drop(info);
        let credential = self.who.credential.as_ref().and_then(|c| match c {
            Credential::Password(p) => Some(Secret::Password(p.clone())),
            Credential::NativeStage1(s) => Some(Secret::NativeStage1(*s)),
            // (Only a move's login holds one, never a session.)
            Credential::SessionToken(_) => None,
        });
        Parcel {
            id: self.handle.id,
            client: client.to_string(),
            listener,
            connected_at_unix,
            local,
            client_unix: self.client.stream.is_unix(),
            pending: self.client.rbuf.to_vec(),
            compression: self.client.compression().map(|a| match a {
                Algorithm::Zlib => ZLIB,
                Algorithm::Zstd { level } => level,
            }),
            backend: self.backend.guard.name.clone(),
            backend_unix: (!self.backend.conn.is_detached()).then(|| self.backend.conn.stream.is_unix()),
            backend_thread_id: self.handle.backend_thread_id.load(Ordering::Relaxed),
            client_caps: self.client_caps(),
            backend_caps: self.backend_caps(),
            mariadb: self.backend.mariadb,
            scramble: self.who.scramble,
            credential,
            profile: self.who.profile.as_ref().map(|p| p.bytes().to_vec()),
            fit: self.backend.fit,
            state: StateParcel::from(&self.state),
            conn: self.backend.carries.as_deref().cloned(),
            conn_gen: self.backend.taken,
            touched: self.backend.touched,
            multiplex: self.route.multiplex,
            causal: self.route.causal.as_deref().cloned(),
            user_slot: self.who.user_slot.is_some(),
            slot: self.backend.slot.is_some(),
            queries: self.handle.queries.load(Ordering::Relaxed),
        }
    }
}

/// Why a session handed over cannot be carried on here.
#[derive(Debug, thiserror::Error)]
enum Unpack {
    /// The old process sent what this one does not read (another version's parcel).
    #[error("the session's state: {0}")]
    Parcel(String),
    #[error("no {0} socket came with the session")]
    Missing(&'static str),
    #[error("the {0} socket: {1}")]
    Socket(&'static str, std::io::Error),
    /// This process's configuration or state does not fit the session.
    #[error("{0}")]
    Here(String),
}

/// Carries on a session the old process handed over: `text` its parcel, `fds` its client
/// socket, then its backend socket when it held one. On a worker's runtime.
pub async fn adopt(ctx: Arc<Ctx>, text: Vec<u8>, fds: Vec<OwnedFd>) {
    match unpack(&ctx, &text, fds) {
        Ok((session, admission)) => {
            ctx.metrics.sessions_adopted.inc();
            tracing::debug!(session = session.handle.id, "upgrade: session taken over from the old process");
            super::live(session, admission, false).await;
        }
        // (The sockets were dropped: the client sees its connection close, as when a proxy
        // restarts.)
        Err(why) => tracing::warn!(error = %why, "upgrade: a session handed over could not be carried on; its connection is closed"),
    }
}

fn unpack(ctx: &Arc<Ctx>, text: &[u8], fds: Vec<OwnedFd>) -> Result<(Box<Session>, Admission), Unpack> {
    let p: Parcel = serde_json::from_slice(text).map_err(|e| Unpack::Parcel(e.to_string()))?;
    let mut fds = fds.into_iter();
    let client = fds.next().ok_or(Unpack::Missing("client"))?;
    let client = Stream::from_fd(client, p.client_unix).map_err(|e| Unpack::Socket("client", e))?;
    let backend = match p.backend_unix {
        Some(unix) => {
            let fd = fds.next().ok_or(Unpack::Missing("backend"))?;
            PacketConn::new(Stream::from_fd(fd, unix).map_err(|e| Unpack::Socket("backend", e))?)
        }
        None => PacketConn::detached(),
    };
    let list = ctx.backends.list();
    let b =
        list.iter().find(|b| b.name == p.backend).ok_or_else(|| Unpack::Here(format!("backend {} is not configured here", p.backend)))?;
    let handle = Arc::new(SessionHandle::new(p.id, p.client.clone(), p.listener.as_str().into()));
    handle.queries.store(p.queries, Ordering::Relaxed);
    {
        let mut i = handle.info.lock();
        i.connected_at_unix = p.connected_at_unix;
        i.local = p.local;
        i.compressed = p.compression.is_some();
    }
    handle.bind_backend(b.index, &b.name, p.backend_thread_id);
    if !ctx.sessions.insert_new(handle.clone()) {
        return Err(Unpack::Here(format!("session id {} is in use here", p.id)));
    }
    ctx.connections.fetch_add(1, Ordering::Relaxed);
    ctx.metrics.client_connections.inc();
    let admission = Admission { ctx: ctx.clone(), registered: Some(p.id) };
    let state: crate::session::SessionState = p.state.into();
    let user_slot = if p.user_slot { ctx.users.get(&state.user).map(|u| u.count()) } else { None };
    let slot = if p.slot && p.backend_unix.is_some() { b.shared.hold() } else { None };
    let mut client = PacketConn::new(client);
    client.rbuf.extend_from_slice(&p.pending);
    let profile = p.profile.and_then(Profile::from_bytes);
    let logged_in = LoggedIn {
        client,
        backend,
        guard: b.bind(),
        client_caps: p.client_caps,
        backend_caps: p.backend_caps,
        mariadb: p.mariadb,
        compression: p.compression.map(|l| if l == ZLIB { Algorithm::Zlib } else { Algorithm::Zstd { level: l } }),
        state,
        credential: p.credential.map(|c| match c {
            Secret::Password(pw) => Credential::Password(pw),
            Secret::NativeStage1(s) => Credential::NativeStage1(s),
        }),
        user_slot,
        scramble: p.scramble,
        conn_attrs: profile.as_ref().map_or(0, |p| crate::backend::shared::attrs_hash(&p.get().attributes)),
        profile,
        fit: p.fit,
        slot,
        conn: p.conn.map(Box::new),
    };
    let mut session = Box::new(Session::new(ctx.clone(), handle.clone(), logged_in, p.multiplex));
    session.backend.taken = p.conn_gen;
    session.backend.touched = p.touched;
    session.route.causal = p.causal.map(Box::new);
    handle.publish(&session.state);
    Ok((session, admission))
}

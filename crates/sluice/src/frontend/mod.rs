//! Client sessions: admission, login, the command relay, and clean-up.

mod capture;
mod client;
mod commands;
mod commit_mark;
pub mod handoff;
pub mod idle;
mod login;
mod multiplex;
mod optimistic;
mod relay;
mod replay_exec;
mod response;
mod retry;
mod rules;
mod session;
mod split;
mod statement;
mod statement_ids;
mod transfer;
mod trxlog;
mod verify;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_proto::consts::err as code;

use crate::config::AuthMode;
use crate::ctx::Ctx;
use crate::error::{Error, Side};
use crate::metrics::Reject;
use crate::net::{PacketConn, Stream};
use crate::session::SessionHandle;

/// What a session needs to know about the listener that accepted it.
#[derive(Debug, Clone)]
pub struct Listener {
    /// (Shared with each of its sessions' handles.)
    pub name: std::sync::Arc<str>,
    pub auth: AuthMode,
    /// Users-mode sessions give their backend connection back at every safe point.
    pub multiplex: bool,
    /// Peers whose connections begin with a PROXY protocol header.
    pub proxy_from: Vec<crate::config::Network>,
}

/// Counts a client connection for as long as it lives, and keeps its session registered from
/// its login on (the session may change tasks when it parks: this goes with it).
pub(super) struct Admission {
    ctx: Arc<Ctx>,
    registered: Option<u32>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(id) = self.registered {
            self.ctx.sessions.remove(id);
        }
        self.ctx.connections.fetch_sub(1, Ordering::Relaxed);
        self.ctx.metrics.client_connections.dec();
    }
}

/// Serves one client connection: its admission and login, then its session in a task of its
/// own ([`live`]).
pub async fn serve(ctx: Arc<Ctx>, mut stream: Stream, peer: String, listener: Arc<Listener>) {
    let peer = if listener.proxy_from.is_empty() {
        peer
    } else {
        match Box::pin(proxied(&ctx, &mut stream, peer, &listener)).await {
            Some(p) => p,
            None => return,
        }
    };
    // The login runs in its own future: its locals (the login result, LoggedIn) then take no
    // room in the task of the session that follows it, idle for hours, perhaps.
    let Some((session, admission)) = Box::pin(admit(ctx, stream, peer, listener)).await else {
        return;
    };
    // The session's commands run in a task of their own: each wake polls their future
    // directly, not through this one's.
    tokio::spawn(live(session, admission, true));
}

/// The client's address: from the PROXY protocol header when the peer is a trusted balancer
/// (a header it must send, within `handshake_timeout`), else the peer's own. None: the
/// connection is closed (no header, a bad one, or data after it before sluice's greeting).
async fn proxied(ctx: &Ctx, stream: &mut Stream, peer: String, listener: &Listener) -> Option<String> {
    let ip = peer.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
    if !ip.is_some_and(|ip| listener.proxy_from.iter().any(|n| n.contains(ip))) {
        return Some(peer);
    }
    let read = tokio::time::timeout(ctx.config().proxy.handshake_timeout, read_proxy_header(stream)).await;
    let why = match read {
        Ok(Ok(source)) => return Some(source.map_or(peer, |s| s.to_string())),
        Ok(Err(why)) => why,
        Err(_) => ProxyHeaderError::Timeout,
    };
    ctx.metrics.reject(Reject::ProxyHeader);
    ctx.metrics.error(Side::Client);
    tracing::warn!(peer = %peer, error = %why, "closing a connection from a PROXY protocol peer");
    None
}

/// Reads a PROXY protocol header off a TCP connection: the client's address it names (None:
/// LOCAL or UNKNOWN, the peer stands). Nothing may follow it before sluice's greeting.
async fn read_proxy_header(stream: &mut Stream) -> Result<Option<std::net::SocketAddr>, ProxyHeaderError> {
    use sluice_proto::proxy_header::{Parsed, V2_MAX, parse};
    use tokio::io::AsyncReadExt;
    let Stream::Tcp(tcp) = stream else { return Err(ProxyHeaderError::Bad("PROXY protocol headers are read on TCP listeners only")) };
    let mut buf = vec![0u8; V2_MAX];
    let mut n = 0;
    loop {
        let got = tcp.read(&mut buf[n..]).await.map_err(ProxyHeaderError::Io)?;
        if got == 0 {
            return Err(ProxyHeaderError::Bad("the connection closed before its PROXY protocol header ended"));
        }
        n += got;
        match parse(&buf[..n]) {
            Parsed::Incomplete if n < buf.len() => {}
            Parsed::Incomplete => return Err(ProxyHeaderError::Bad("PROXY protocol header too long")),
            Parsed::Invalid(why) => return Err(ProxyHeaderError::Bad(why)),
            Parsed::Header { len, .. } if len < n => {
                return Err(ProxyHeaderError::Bad("data after the PROXY protocol header, before the greeting"));
            }
            Parsed::Header { source, .. } => return Ok(source),
        }
    }
}

/// Why a PROXY protocol peer's connection is closed (the peer's fault).
#[derive(Debug, thiserror::Error)]
enum ProxyHeaderError {
    #[error("{0}")]
    Bad(&'static str),
    #[error("{0}")]
    Io(std::io::Error),
    #[error("no PROXY protocol header within handshake_timeout")]
    Timeout,
}

/// Admits the connection and logs the client in: its session, or None when it was refused or
/// the login failed.
async fn admit(ctx: Arc<Ctx>, stream: Stream, peer: String, listener: Arc<Listener>) -> Option<(Box<session::Session>, Admission)> {
    ctx.metrics.client_connections_total.inc();
    ctx.metrics.client_connections.inc();
    let open = ctx.connections.fetch_add(1, Ordering::Relaxed);
    let mut admission = Admission { ctx: ctx.clone(), registered: None };
    if ctx.is_draining() {
        ctx.metrics.reject(Reject::ShuttingDown);
        refuse_early(stream, code::SERVER_SHUTDOWN, "sluice is shutting down").await;
        return None;
    }
    if is_own_connection(&ctx, &peer, &stream).await {
        tracing::error!(client = %peer, "refusing a login from sluice's own backend connection: a backend leads back to sluice (a loop)");
        refuse_early(
            stream,
            code::NO_BACKEND,
            "sluice: this login comes from sluice's own backend connection: a backend leads back to sluice (a loop)",
        )
        .await;
        return None;
    }
    if open >= ctx.config().proxy.max_connections {
        ctx.metrics.reject(Reject::MaxConnections);
        tracing::warn!(client = %peer, limit = ctx.config().proxy.max_connections, "refusing client: max_connections reached");
        refuse_early(stream, code::CON_COUNT, "Too many connections").await;
        return None;
    }
    let id = ctx.sessions.next_id();
    let handle = Arc::new(SessionHandle::new(id, peer.clone(), listener.name.clone()));
    handle.info.lock().local = stream.local_addr();
    ctx.sessions.insert(handle.clone());
    admission.registered = Some(id);
    let session = start(ctx, stream, handle, &listener, &peer).await?;
    Some((session, admission))
}

/// Whether the client is one of sluice's own backend connections. (The connection is noted as
/// soon as its connect returns, in another task: a second look after a yield catches one
/// accepted before that.)
async fn is_own_connection(ctx: &Ctx, peer: &str, stream: &Stream) -> bool {
    // Over a Unix socket the peer's process says it.
    if let Stream::Unix(u) = stream {
        return u.peer_cred().is_ok_and(|c| c.pid() == Some(std::process::id() as i32));
    }
    let (Ok(peer), Some(local)) = (peer.parse::<std::net::SocketAddr>(), stream.local_addr()) else { return false };
    if ctx.own.is_own_connection(peer, local) {
        return true;
    }
    tokio::task::yield_now().await;
    ctx.own.is_own_connection(peer, local)
}

/// Serves the session's commands until it ends (then ends it) or parks (`idle/`).
///
/// The session is boxed: it stays where it is when it parks and resumes, and the task's future
/// does not hold it twice (an async fn keeps its arguments apart from its locals).
async fn live(mut session: Box<session::Session>, admission: Admission, first: bool) {
    if first {
        session.start();
    }
    let result = session.resume().await;
    let result = match result {
        Ok(session::Ended::Parked) => return idle::spawn(session, admission),
        // Its sockets are closed here without a word: the connections live on in the new
        // process.
        Ok(session::Ended::HandedOff) => return drop((session, admission)),
        Ok(session::Ended::Done) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = &result {
        let peer = session.handle.info.lock().client.clone();
        log_error(&session.ctx, session.handle.id, &peer, e, "session ended with an error");
    }
    if session.capture.is_some() {
        session.capture_end();
    }
    session.close_client().await;
    session.release_statements();
    session.who.user_slot = None;
    Box::pin(session.end_backend(result.is_ok())).await;
    drop(admission);
}

/// Logs the client in (within handshake_timeout) and makes its session; None when the login
/// failed, which is logged and counted here.
async fn start(
    ctx: Arc<Ctx>,
    stream: Stream,
    handle: Arc<SessionHandle>,
    listener: &Listener,
    peer: &str,
) -> Option<Box<session::Session>> {
    let id = handle.id;
    let tls = stream.is_tls();
    let login = tokio::time::timeout(ctx.config().proxy.handshake_timeout, login::login(&ctx, stream, &handle, listener)).await;
    let logged_in = match login {
        Err(_) => {
            ctx.metrics.reject(Reject::HandshakeTimeout);
            ctx.metrics.error(Side::Client);
            tracing::info!(session = id, client = %peer, "client did not finish logging in within handshake_timeout");
            return None;
        }
        Ok(Err(r)) => {
            if let Some(reject) = r.reject {
                ctx.metrics.reject(reject);
            }
            log_error(&ctx, id, peer, &r.error, "login failed");
            return None;
        }
        Ok(Ok(l)) => l,
    };
    {
        let mut i = handle.info.lock();
        i.tls = tls || logged_in.client.stream.is_tls();
        i.backend_tls = logged_in.backend.stream.is_tls();
        i.compressed = logged_in.compression.is_some();
    }
    tracing::debug!(session = id, client = %peer, user = %logged_in.state.user, backend = %logged_in.guard.name, "session started");
    Some(Box::new(session::Session::new(ctx, handle, logged_in, listener.multiplex)))
}

/// On whose behalf the session's backend connections are opened (what a backend with
/// `send_proxy` is told): the client's address (from its PROXY header, if any) and the address
/// of sluice it reached; sluice's own for a Unix socket client.
pub(super) fn origin(handle: &SessionHandle) -> crate::backend::conn::Origin {
    use crate::backend::conn::Origin;
    let i = handle.info.lock();
    match (i.client.parse::<std::net::SocketAddr>(), i.local) {
        (Ok(source), Some(dest)) => Origin::Client { source, dest },
        _ => Origin::Sluice,
    }
}

/// COM_RESET_CONNECTION on the way into `b`'s pool, counted; whether the backend said OK within
/// `limit`.
async fn reset_for_pool(b: &crate::backend::BackendGuard, conn: &mut PacketConn, limit: std::time::Duration) -> bool {
    b.metrics.pool_resets.inc();
    let reset = async {
        conn.write_packet(&[sluice_proto::consts::com::RESET_CONNECTION], 0).await.is_ok()
            && matches!(conn.read_packet(1 << 16).await, Ok((_, p)) if p.first() == Some(&0) && conn.rbuf.is_empty())
    };
    tokio::time::timeout(limit, reset).await.is_ok_and(|ok| ok)
}

fn log_error(ctx: &Ctx, id: u32, peer: &str, e: &Error, what: &str) {
    ctx.metrics.error(e.side);
    // (A message that quotes a statement, as a server's does, quotes no secret of it.)
    let message = crate::session::shown_text(e.message.as_bytes());
    match e.side {
        Side::Client => tracing::info!(session = id, client = %peer, side = "client", code = e.code, error = %message, "{what}"),
        Side::Backend => tracing::warn!(session = id, client = %peer, side = "backend", code = e.code, error = %message, "{what}"),
        Side::Proxy => tracing::warn!(session = id, client = %peer, side = "sluice", code = e.code, error = %message, "{what}"),
    }
}

/// Sends an ERR instead of a greeting (sequence id 0) and closes.
async fn refuse_early(stream: Stream, code: u16, msg: &str) {
    let mut conn = PacketConn::new(stream);
    let mut p = Vec::new();
    sluice_proto::basic::err_payload_pre_handshake(&mut p, code, msg);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), conn.write_packet(&p, 0)).await;
}

impl session::Session {
    /// Leaves the backend connection in its backend's pool when the session ended `clean`ly
    /// and the connection is too (nothing in flight or unread, no KILL), after
    /// COM_RESET_CONNECTION has ended whatever the session left open on it: a transaction, locks,
    /// temporary tables, however they were made. A session that ran nothing (log in, quit)
    /// left nothing to end, so its connection goes back without that round trip; the next
    /// login's COM_CHANGE_USER starts from the server's defaults in any case. Otherwise tells
    /// the backend we are leaving, so that it does not log an aborted connection.
    ///
    /// A session that multiplexes, or whose connection holds a place under
    /// `max_backend_connections`, leaves it with the shared connections of its backend as at any
    /// safe point (where it keeps its place), or closes it when it is pinned.
    async fn end_backend(mut self, clean: bool) {
        if self.backend.conn.is_detached() {
            return;
        }
        let h = self.handle.clone();
        let reusable = clean
            && self.backend.lost.is_none()
            && !self.ctx.is_draining()
            && !h.killed.load(Ordering::Relaxed)
            && !h.kill_pending.load(Ordering::Relaxed)
            && self.backend.conn.rbuf.is_empty();
        if self.route.multiplex || self.backend.slot.is_some() {
            if reusable && self.backend.key.is_some() && self.backend.guard.is_usable() && self.state.detachable() {
                self.detach();
                if self.backend.conn.is_detached() {
                    return;
                }
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), crate::backend::conn::quit(self.backend.conn)).await;
            return;
        }
        let reusable = reusable && self.backend.guard.pool_enabled();
        let backend_caps = self.backend_caps();
        let mut conn = self.backend.conn;
        let second = std::time::Duration::from_secs(1);
        if reusable && (!self.backend.touched || reset_for_pool(&self.backend.guard, &mut conn, second).await) {
            crate::net::buffers::park(&mut conn.rbuf);
            let thread_id = h.backend_thread_id.load(Ordering::Relaxed);
            let idle = crate::backend::pool::Idle::new(conn, self.backend.fit, backend_caps, thread_id, self.backend.mariadb);
            match self.backend.guard.park(idle) {
                None => return,
                Some(idle) => conn = idle.conn,
            }
        }
        let _ = tokio::time::timeout(second, crate::backend::conn::quit(conn)).await;
    }

    async fn close_client(&mut self) {
        self.client.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle session's memory is mostly its task, this future. The login's locals must not
    /// stay in it after the login, nor the session twice, and it must stay under tokio's
    /// threshold for boxing a spawned future apart from its task (2 KB); a parked session
    /// waits in a task a fraction of that.
    #[tokio::test]
    async fn a_session_task_holds_the_session_not_its_login() {
        let config = crate::config::Config::parse("[[backends]]\naddress = \"127.0.0.1:1\"\n").unwrap();
        let ctx = Ctx::new(config).unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let listener = Arc::new(Listener { name: "t".into(), auth: AuthMode::Passthrough, multiplex: false, proxy_from: Vec::new() });
        let task = serve(ctx, Stream::Tcp(c), "peer".into(), listener);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 2048, "a session's task takes {size} bytes");
        fn future_size<F: std::future::Future>(_: fn(Box<session::Session>, Admission) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let parked = future_size(idle::parked);
        assert!(parked <= 128, "a parked session's task takes {parked} bytes");
    }
}

//! Client sessions: admission, login, the command relay, and clean-up.

mod client;
mod commands;
mod login;
mod reconnect;
mod relay;
mod verify;

pub use verify::RsaKey;

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
    pub name: String,
    pub auth: AuthMode,
}

/// Counts a client connection for as long as it lives.
struct ConnectionSlot<'a>(&'a Ctx);

impl Drop for ConnectionSlot<'_> {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
        self.0.metrics.client_connections.dec();
    }
}

/// Serves one client connection from accept to close.
pub async fn serve(ctx: Arc<Ctx>, stream: Stream, peer: String, listener: Arc<Listener>) {
    let ctx = &*ctx;
    ctx.metrics.client_connections_total.inc();
    ctx.metrics.client_connections.inc();
    let open = ctx.connections.fetch_add(1, Ordering::Relaxed);
    let _slot = ConnectionSlot(ctx);
    if ctx.is_draining() {
        ctx.metrics.reject(Reject::ShuttingDown);
        refuse_early(stream, code::SERVER_SHUTDOWN, "sluice is shutting down").await;
        return;
    }
    if open >= ctx.config.proxy.max_connections {
        ctx.metrics.reject(Reject::MaxConnections);
        tracing::warn!(client = %peer, limit = ctx.config.proxy.max_connections, "refusing client: max_connections reached");
        refuse_early(stream, code::CON_COUNT, "Too many connections").await;
        return;
    }
    let id = ctx.sessions.next_id();
    let handle = Arc::new(SessionHandle::new(id, peer.clone(), listener.name.clone()));
    ctx.sessions.insert(handle.clone());
    let _registered = Registered(ctx, id);
    let tls = stream.is_tls();
    // Boxed: the login's state is freed once it is done, not kept in the session's task.
    let login = tokio::time::timeout(ctx.config.proxy.handshake_timeout, Box::pin(login::login(ctx, stream, &handle, &listener))).await;
    let logged_in = match login {
        Err(_) => {
            ctx.metrics.reject(Reject::HandshakeTimeout);
            ctx.metrics.error(Side::Client);
            tracing::info!(session = id, client = %peer, "client did not finish logging in within handshake_timeout");
            return;
        }
        Ok(Err(r)) => {
            if let Some(reject) = r.reject {
                ctx.metrics.reject(reject);
            }
            log_error(ctx, id, &peer, &r.error, "login failed");
            return;
        }
        Ok(Ok(l)) => l,
    };
    {
        let mut i = handle.info.lock();
        i.tls = tls || logged_in.client.stream.is_tls();
        i.compressed = logged_in.compression.is_some();
    }
    tracing::debug!(session = id, client = %peer, user = %logged_in.state.user, backend = %logged_in.guard.name, "session started");
    let mut session = relay::Session::new(ctx, &handle, logged_in);
    let result = session.run().await;
    if let Err(e) = &result {
        log_error(ctx, id, &peer, e, "session ended with an error");
    }
    // Tell the backend we are leaving, so it does not log an aborted connection.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), session.close_backend()).await;
    session.close_client().await;
    if let Some(u) = session.counted_user.take().and_then(|u| ctx.users.get(&u)) {
        u.release();
    }
}

/// Removes the session from the registry when it ends, however it ends.
struct Registered<'a>(&'a Ctx, u32);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.sessions.remove(self.1);
    }
}

fn log_error(ctx: &Ctx, id: u32, peer: &str, e: &Error, what: &str) {
    ctx.metrics.error(e.side);
    match e.side {
        Side::Client => tracing::info!(session = id, client = %peer, side = "client", code = e.code, error = %e.message, "{what}"),
        Side::Backend => tracing::warn!(session = id, client = %peer, side = "backend", code = e.code, error = %e.message, "{what}"),
        Side::Proxy => tracing::warn!(session = id, client = %peer, side = "sluice", code = e.code, error = %e.message, "{what}"),
    }
}

/// Sends an ERR instead of a greeting (sequence id 0) and closes.
async fn refuse_early(stream: Stream, code: u16, msg: &str) {
    let mut conn = PacketConn::new(stream);
    let mut p = Vec::new();
    sluice_proto::basic::err_payload_pre_handshake(&mut p, code, msg);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), conn.write_packet(&p, 0)).await;
}

impl relay::Session<'_> {
    async fn close_backend(&mut self) {
        use tokio::io::AsyncWriteExt;
        let _ = self.backend.write_packet(&[sluice_proto::consts::com::QUIT], 0).await;
        let _ = self.backend.stream.shutdown().await;
    }

    async fn close_client(&mut self) {
        self.client.shutdown().await;
    }
}

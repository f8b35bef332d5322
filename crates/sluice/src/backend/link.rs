//! Reaching a backend for a session: the balancer's choice (another backend when one cannot be
//! reached, or refused before anything was sent), a new connection or a pooled one, the
//! handshake response sluice sends for the client, and the set-up statements that follow a
//! login.

use std::sync::Arc;

use sluice_proto::consts::{err as code, mariadb_cap};
use sluice_proto::handshake::{Greeting, HandshakeResponse};

use super::conn::{self, Origin};
use super::pool::{Fit, Idle};
use super::{Backend, Backends};
use crate::error::{Error, Result, Side};
use crate::net::PacketConn;

/// A backend connection, opened and greeted, before login.
pub struct Opened {
    pub backend: Arc<Backend>,
    pub conn: PacketConn,
    pub greeting: Greeting,
}

/// Where a login goes on: a new connection, or a pooled one that is already logged in.
pub enum Link {
    Fresh(Opened),
    Reused(Arc<Backend>, Idle),
}

/// Opens a connection to the next usable backend, trying others when one cannot be reached.
pub async fn open_any(backends: &Backends, tried: &mut Vec<(usize, Error)>, origin: Origin) -> Result<Opened> {
    loop {
        let b = pick(backends, tried)?;
        if let Some(o) = open_on(b, tried, origin).await {
            return Ok(o);
        }
    }
}

/// A pooled connection of `b` that fits (with a `fit`), else a new one; None when `b` cannot be
/// reached (the failure is recorded in `tried`).
pub async fn link_on(b: Arc<Backend>, tried: &mut Vec<(usize, Error)>, fit: Option<Fit>, client_tls: bool, origin: Origin) -> Option<Link> {
    if let Some(fit) = fit
        && let Some(idle) = b.reuse(Fit { backend_tls: b.tls.wanted(client_tls), ..fit })
    {
        return Some(Link::Reused(b, idle));
    }
    open_on(b, tried, origin).await.map(Link::Fresh)
}

/// Plugin name sent to a backend in passthrough mode (and in COM_CHANGE_USER on a pooled
/// connection). No server has it, so the server answers with an auth switch carrying its own
/// scramble, which sluice relays to the client (or answers with the credentials it holds).
pub const PASSTHROUGH_PLUGIN: &[u8] = b"sluice_passthrough";

/// Sends COM_CHANGE_USER for the client (`hr`) on a pooled connection. An error means the
/// connection went stale while pooled (the server closed it): nothing has reached the client,
/// so the login goes on with another connection.
pub async fn send_change_user(idle: &mut Idle, hr: &HandshakeResponse) -> std::io::Result<()> {
    if !idle.conn.stream.is_quiet() {
        return Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the server spoke or closed while it was pooled"));
    }
    let mut out = Vec::with_capacity(128);
    hr.change_user(idle.backend_caps, PASSTHROUGH_PLUGIN).write(&mut out);
    idle.conn.write_packet(&out, 0).await.map(|_| ())
}

/// The balancer's choice of a primary (any backend when none is usable) among the backends not
/// tried yet, or the error for the client.
pub fn pick(backends: &Backends, tried: &[(usize, Error)]) -> Result<Arc<Backend>> {
    let exclude: Vec<usize> = tried.iter().map(|(i, _)| *i).collect();
    if let Some(b) = backends.balancer.pick(backends, &exclude, super::balance::Want::Primary) {
        return Ok(b);
    }
    // A backend that refused with its own error (1040 Too many connections, a blocked host)
    // speaks for itself: the client gets that error unchanged.
    if let Some((_, e)) = tried.iter().rev().find(|(_, e)| e.is_backend_refusal()) {
        let mut err = Error::new(Side::Backend, e.code, e.message.clone());
        err.sql_state = e.sql_state;
        return Err(err);
    }
    let what = if backends.list().is_empty() { "no backends are configured".to_string() } else { backends.describe_unusable(tried) };
    Err(Error::proxy(code::NO_BACKEND, format!("sluice: no backend available: {what}")).state(b"08S01"))
}

/// Connects to `b`; a failure is recorded in `tried`.
async fn open_on(b: Arc<Backend>, tried: &mut Vec<(usize, Error)>, origin: Origin) -> Option<Opened> {
    match conn::open(&b, b.connect_timeout, origin).await {
        Ok((conn, greeting)) => Some(Opened { backend: b, conn, greeting }),
        Err(e) => {
            tracing::warn!(backend = %b.name, error = %e.message, "backend unreachable; trying the next one");
            tried.push((b.index, e));
            None
        }
    }
}

/// The handshake response sluice sends a backend for a client's login (`hr`), with the
/// capabilities that client, sluice and the backend (`g`) share.
pub fn backend_response(hr: &HandshakeResponse, g: &Greeting, client_caps: u32, tls: bool) -> HandshakeResponse {
    HandshakeResponse {
        capabilities: conn::backend_capabilities(client_caps, g, tls),
        mariadb_capabilities: hr.mariadb_capabilities & g.mariadb_capabilities & mariadb_cap::SLUICE_SUPPORTED,
        max_packet: hr.max_packet,
        collation: hr.collation,
        user: hr.user.clone(),
        auth_response: Vec::new(),
        database: hr.database.clone(),
        auth_plugin: None,
        attributes: hr.attributes.clone(),
        zstd_level: None,
    }
}

/// What a users-mode login on a session's behalf sends: the client's handshake response (its
/// user, schema, character set and attributes; sluice holds the credentials), the capabilities
/// of the client's leg and whether it is TLS (backend TLS in "auto" mode follows it).
pub struct AsClient<'a> {
    pub hr: &'a HandshakeResponse,
    pub client_caps: u32,
    pub client_tls: bool,
    pub credential: &'a conn::Credential,
    /// A session that logged in already: the capabilities and the kind of server (MariaDB or
    /// not) its connections have, which another connection must share.
    pub same_as: Option<(u32, bool)>,
}

/// Logs in on a new connection (`conn`, greeted with `g`) as the client with the credentials
/// sluice holds, in the client's schema: the one users-mode login, at a client's login and for
/// a session that takes another connection. The connection and the capabilities in force.
pub async fn log_in_as(b: &Backend, conn: PacketConn, g: &Greeting, l: &AsClient<'_>) -> Result<(PacketConn, u32)> {
    use sluice_proto::consts::cap;
    let tls = b.tls.decide(l.client_tls, g)?;
    let mut bhr = backend_response(l.hr, g, l.client_caps, tls);
    bhr.capabilities |= if bhr.database.is_some() { cap::CONNECT_WITH_DB } else { 0 };
    let mariadb = g.capabilities & cap::LONG_PASSWORD == 0;
    // (Whether the new connection is TLS may differ: nothing after the login depends on it.)
    if let Some((caps, was_mariadb)) = l.same_as
        && ((bhr.capabilities ^ caps) & !(cap::CONNECT_WITH_DB | cap::SSL) != 0 || mariadb != was_mariadb)
    {
        return Err(Error::connect("its capabilities differ from those of the session's first backend"));
    }
    let caps = bhr.capabilities;
    Ok((conn::login(b, conn, g, bhr, l.credential).await?, caps))
}

/// Makes the backend report every session variable a statement changes (SESSION_TRACK), so
/// that a session can be recreated with them, and every change of session state (so that one
/// sluice cannot see in a statement's text, a stored routine's, is known). Sent once after a
/// users-mode login.
pub const TRACK_ALL: &[u8] = b"SET SESSION session_track_system_variables='*', session_track_state_change=ON";

/// Variables that [`TRACK_ALL`] sets, which sluice keeps as they are on every connection.
pub fn sluice_owns(variable: &str) -> bool {
    matches!(variable, "session_track_system_variables" | "session_track_state_change")
}

//! One way to a backend connection for a users-mode session, at its client's login and whenever
//! it takes another (multiplexing, a move, a lost connection replaced): a spare connection of
//! the session's key brought to its state, else a pooled one reset as its user (at a login),
//! else a new login with the credentials sluice holds; under the backend's cap, waiting in its
//! queue when the cap is reached. The frontend says what it needs ([`Request`]) and gets a
//! [`Lease`]: the connection, what it carries and its place under the cap (freed when the
//! lease drops; a multiplexed session gives its connection back to the backend's shared ones
//! at a safe point, `Spare`).

use std::sync::Arc;
use std::time::Duration;

use sluice_proto::consts::cap;
use sluice_proto::handshake::HandshakeResponse;

use super::Backend;
use super::conn::{self as bconn, Origin};
use super::link::{self, AsClient, Link, Opened};
use super::pool::{Fit, Idle};
use super::restore;
use super::shared::{ConnState, Key, Slot, Spare, Taken};
use crate::error::{Error, Result, Retry, Side};
use crate::net::PacketConn;
use crate::session::SessionState;

/// What a session needs of a connection.
pub struct Request<'a> {
    /// Which spare connections may serve it (user, TLS, collation, connection attributes).
    pub key: &'a Key,
    /// Whether a spare connection may serve (false: a new login each time).
    pub reuse: bool,
    /// The state the connection is brought to.
    pub state: &'a SessionState,
    /// The client's handshake response, which a new login repeats.
    pub hello: Hello<'a>,
    pub client_caps: u32,
    /// The client's connection to sluice is TLS (backend TLS in "auto" mode follows it).
    pub client_tls: bool,
    pub credential: &'a bconn::Credential,
    /// The capabilities and the kind of server (MariaDB or not) of the session's connections,
    /// which another must share; None: the session's first connection, at its login.
    pub same_as: Option<(u32, bool)>,
    pub origin: Origin,
    /// Pooled connections of this fit may serve, reset as the session's user (at a login).
    pub pool: Option<Fit>,
}

/// The handshake response a new login repeats: the client's own, or as a session keeps it
/// (encoded, without its auth response; decoded only when a login needs it), to log in to the
/// session's schema.
#[derive(Clone, Copy)]
pub enum Hello<'a> {
    Given(&'a HandshakeResponse),
    Encoded { bytes: &'a [u8], schema: Option<&'a str> },
}

/// A connection checked out for a session: logged in as its user, in its state.
pub struct Lease {
    pub conn: PacketConn,
    pub state: Box<ConnState>,
    /// Its place under `max_backend_connections` (freed when dropped).
    pub slot: Option<Slot>,
    /// Capabilities in force between sluice and the backend.
    pub backend_caps: u32,
    pub mariadb: bool,
}

/// Why a checkout gave no connection.
pub enum Fault {
    /// No place under the cap became free within `queue_timeout` (how long it waited).
    Queue(Duration),
    Failed(Error),
}

impl From<Error> for Fault {
    fn from(e: Error) -> Fault {
        Fault::Failed(e)
    }
}

/// A connection to `b` for `r`. None: this attempt could not serve (a connection that went
/// stale, or a backend that could not be reached or refused in a way another may not, recorded
/// in `tried`); the caller tries again. `pre`: a connection opened already (a login's first).
pub async fn checkout(
    b: &Arc<Backend>,
    r: &Request<'_>,
    pre: &mut Option<Opened>,
    tried: &mut Vec<(usize, Error)>,
) -> std::result::Result<Option<Lease>, Fault> {
    let taken = b.shared.take(r.key, r.reuse).await.map_err(Fault::Queue)?;
    Ok(ready(b, taken, r, pre, tried).await?)
}

/// Whether a spare connection may serve a session whose connections have `same_as`: open (its
/// server did not close it) and of the session's capabilities (a backend restarted in another
/// version has others).
pub fn fits(spare: &Spare, same_as: Option<(u32, bool)>) -> bool {
    same_as.is_none_or(|(caps, mariadb)| spare.backend_caps == caps && spare.mariadb == mariadb) && !spare.closed_by_server()
}

/// The connection `taken` gives, in the session's state: the spare one when it fits and can be
/// brought to the state, else a new login in its place. Given up (as an unreachable backend)
/// when failover replaces the backend meanwhile: a hung server may never answer.
pub async fn ready(
    b: &Arc<Backend>,
    taken: Taken,
    r: &Request<'_>,
    pre: &mut Option<Opened>,
    tried: &mut Vec<(usize, Error)>,
) -> Result<Option<Lease>> {
    tokio::select! {
        lease = ready_now(b, taken, r, pre, tried) => lease,
        () = b.until_replaced() => Err(Error::connect(format!("{} was replaced by a failover", b.name))),
    }
}

async fn ready_now(
    b: &Arc<Backend>,
    taken: Taken,
    r: &Request<'_>,
    pre: &mut Option<Opened>,
    tried: &mut Vec<(usize, Error)>,
) -> Result<Option<Lease>> {
    let slot = match taken {
        Taken::Conn(spare, slot) if fits(&spare, r.same_as) => match from_spare(b, spare, slot, r.state).await? {
            Ok(lease) => return Ok(Some(lease)),
            Err(slot) => slot,
        },
        // (One that does not fit is closed; its place goes to a new connection.)
        Taken::Conn(_, slot) | Taken::Open(slot) => slot,
    };
    let Some(mut lease) = log_in(b, r, pre, tried).await? else { return Ok(None) };
    lease.slot = slot;
    // (A session's first connection is in its login's state already.)
    if r.same_as.is_some() {
        restore::bring(&mut lease.conn, &mut lease.state, r.state, lease.backend_caps, b.connect_timeout).await?;
    }
    Ok(Some(lease))
}

/// A spare connection brought to `want`; its place back (Err) when the backend would not take
/// the state (the connection is closed; an error that is the session's own is returned).
async fn from_spare(
    b: &Backend,
    spare: Spare,
    slot: Option<Slot>,
    want: &SessionState,
) -> Result<std::result::Result<Lease, Option<Slot>>> {
    let (mut conn, mut state) = (spare.conn, spare.state);
    match restore::bring(&mut conn, &mut state, want, spare.backend_caps, b.connect_timeout).await {
        Ok(()) => Ok(Ok(Lease { conn, state, slot, backend_caps: spare.backend_caps, mariadb: spare.mariadb })),
        Err(e) if e.side == Side::Client => Err(e),
        Err(e) => {
            tracing::debug!(backend = %b.name, error = %e.message, "spare connection unusable; logging in anew");
            Ok(Err(slot))
        }
    }
}

/// A connection logged in as the session's user, in its schema: `pre`, a pooled one reset as
/// the user (with `r.pool`), else a new one. None: see [`checkout`].
async fn log_in(b: &Arc<Backend>, r: &Request<'_>, pre: &mut Option<Opened>, tried: &mut Vec<(usize, Error)>) -> Result<Option<Lease>> {
    let link = match pre.take() {
        Some(o) => Link::Fresh(o),
        None => match link::link_on(b.clone(), tried, r.pool, r.client_tls, r.origin).await {
            Some(link) => link,
            None => return Ok(None),
        },
    };
    let decoded;
    let hr = match r.hello {
        Hello::Given(hr) => hr,
        Hello::Encoded { bytes, schema } => {
            let database = schema.map(|s| s.as_bytes().to_vec());
            decoded = HandshakeResponse { database, ..HandshakeResponse::parse(bytes).unwrap_or_default() };
            &decoded
        }
    };
    let (mut conn, thread_id, backend_caps, mariadb) = match link {
        Link::Reused(b, idle) => match reset_as(&b, idle, hr, r.credential).await {
            Some(reused) => reused,
            None => return Ok(None),
        },
        Link::Fresh(Opened { backend, conn, greeting: g }) => {
            let l = AsClient { hr, client_caps: r.client_caps, client_tls: r.client_tls, credential: r.credential, same_as: r.same_as };
            match link::log_in_as(&backend, conn, &g, &l).await {
                Ok((conn, backend_caps)) => (conn, g.connection_id, backend_caps, g.capabilities & cap::LONG_PASSWORD == 0),
                Err(e) if e.retry == Retry::Safe => {
                    tried.push((backend.index, e));
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    };
    // A session's first connection turns on the tracking of every variable here; a later one
    // when it is brought to the session's state.
    let tracking = r.same_as.is_none() && track_all(b, &mut conn, backend_caps).await;
    let state = ConnState {
        attrs: r.key.attrs,
        schema: r.state.schema.clone(),
        multi_statements: backend_caps & cap::MULTI_STATEMENTS != 0,
        tracking,
        thread_id,
        ..Default::default()
    };
    Ok(Some(Lease { conn, state: Box::new(state), slot: None, backend_caps, mariadb }))
}

/// A pooled connection reset as the session's user (COM_CHANGE_USER with the credentials sluice
/// holds): the connection, its thread id, capabilities and whether it is MariaDB. None when it
/// went stale while pooled, or was refused (a new connection's login will say why).
async fn reset_as(b: &Backend, mut idle: Idle, hr: &HandshakeResponse, cred: &bconn::Credential) -> Option<(PacketConn, u32, u32, bool)> {
    let reset = async {
        link::send_change_user(&mut idle, hr).await.map_err(|e| Error::io(Side::Backend, "change user", e))?;
        bconn::answer_auth(b, &mut idle.conn, cred).await
    };
    match reset.await {
        Ok(_) => {
            b.metrics.pool_reused.inc();
            Some((idle.conn, idle.thread_id, idle.backend_caps, idle.mariadb))
        }
        Err(e) => {
            tracing::debug!(backend = %b.name, error = %e.message, "pooled connection unusable; taking another");
            None
        }
    }
}

/// Turns on the tracking of every session variable on a new connection (without it, a
/// session could not be recreated elsewhere with all its variables), and notes the backend's
/// defaults and lexer mode. Whether it is on.
async fn track_all(backend: &Backend, conn: &mut PacketConn, backend_caps: u32) -> bool {
    match restore::track_all(conn, backend_caps, backend.connect_timeout).await {
        Ok((defaults, sql_mode)) => {
            *backend.tracking.lock() = Some(defaults);
            *backend.lex_default.lock() = Some(sluice_proto::lexer::Mode::from_sql_mode(sql_mode.as_bytes()));
            true
        }
        Err(e) => {
            tracing::warn!(backend = %backend.name, error = %e.message, "cannot track session variables; sessions will not move");
            false
        }
    }
}

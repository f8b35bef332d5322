//! The connection phase: sluice's greeting, the client's handshake response (with the switch to
//! TLS), authentication in passthrough or users mode, and the backend connection it ends with.

use std::sync::Arc;

use sluice_proto::auth;
use sluice_proto::consts::{cap, err as code, mariadb_cap, status};
use sluice_proto::handshake::{Greeting, HandshakeResponse, is_ssl_request};

use super::Listener;
use super::session::Profile;
use super::verify::{AuthIo, Relay, Verdict, verify};
use crate::auth::UserSlot;
use crate::backend::checkout::{Fault, Hello, Request, checkout};
use crate::backend::conn::{self as bconn, Credential, Outcome};
use crate::backend::link::{self, Link, Opened, backend_response};
use crate::backend::pool::{Fit, Idle};
use crate::backend::shared::{ConnState, Key, Slot};
use crate::backend::{Backend, BackendGuard, ServerInfo};
use crate::config::AuthMode;
use crate::ctx::Ctx;
use crate::error::{Error, Result, Side};
use crate::metrics::Reject;
use crate::net::{PacketConn, Stream};
use crate::session::{SessionHandle, SessionState};

/// Largest packet a client may send before it is logged in.
const LOGIN_PACKET_LIMIT: usize = 64 * 1024;

/// The backend side of a finished login.
struct Backed {
    backend: PacketConn,
    guard: BackendGuard,
    backend_thread_id: u32,
    backend_caps: u32,
    /// The backend is MariaDB, whose OK packets carry length-encoded info in any case.
    mariadb: bool,
    credential: Option<Credential>,
    user_slot: Option<UserSlot>,
    /// Its place under `max_backend_connections`.
    slot: Option<Slot>,
    /// What the connection carries (users mode).
    conn: Option<Box<ConnState>>,
}

thread_local! {
    /// The profiles of this worker's sessions, each kept once.
    static PROFILES: std::cell::RefCell<Profiles> = std::cell::RefCell::default();
}

#[derive(Default)]
struct Profiles {
    set: std::collections::HashSet<Arc<[u8]>>,
    /// The size past which the profiles no session holds any more are let go.
    purge_at: usize,
}

impl Profiles {
    fn intern(&mut self, bytes: Vec<u8>) -> Arc<[u8]> {
        if let Some(p) = self.set.get(bytes.as_slice()) {
            return p.clone();
        }
        if self.set.len() >= self.purge_at {
            self.set.retain(|p| Arc::strong_count(p) > 1);
            self.purge_at = (2 * self.set.len()).max(64);
        }
        let p: Arc<[u8]> = bytes.into();
        self.set.insert(p.clone());
        p
    }
}

impl Profile {
    pub fn new(hr: &HandshakeResponse) -> Profile {
        let mut out = Vec::new();
        HandshakeResponse { auth_response: Vec::new(), ..hr.clone() }.write(&mut out);
        Profile(PROFILES.with(|p| p.borrow_mut().intern(out)))
    }

    /// The handshake response (written by `new`, so it parses).
    pub fn get(&self) -> HandshakeResponse {
        HandshakeResponse::parse(&self.0).unwrap_or_default()
    }

    /// As encoded (a handshake response without its auth response).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// From [`Profile::bytes`]; None when they do not parse.
    pub fn from_bytes(b: Vec<u8>) -> Option<Profile> {
        HandshakeResponse::parse(&b).ok().map(|_| Profile(PROFILES.with(|p| p.borrow_mut().intern(b))))
    }

    /// A later login is as `user` (after COM_CHANGE_USER).
    pub fn set_user(&mut self, user: &[u8]) {
        let hr = HandshakeResponse { user: user.to_vec(), ..self.get() };
        *self = Profile::new(&hr);
    }
}

/// A logged-in session, ready for the command relay.
pub struct LoggedIn {
    pub client: PacketConn,
    pub backend: PacketConn,
    pub guard: BackendGuard,
    /// Capabilities in force between client and sluice.
    pub client_caps: u32,
    /// Capabilities in force between sluice and the backend.
    pub backend_caps: u32,
    pub mariadb: bool,
    pub compression: Option<sluice_proto::compress::Algorithm>,
    pub state: SessionState,
    pub credential: Option<Credential>,
    /// The connection counted against its user's `max_connections` (users mode).
    pub user_slot: Option<UserSlot>,
    pub scramble: [u8; 20],
    /// What a new backend login on the session's behalf repeats (users mode only).
    pub profile: Option<Profile>,
    /// Which clients may reuse the backend connection once this session ends.
    pub fit: Fit,
    /// The backend connection's place under `max_backend_connections`.
    pub slot: Option<Slot>,
    /// What the backend connection carries (users mode).
    pub conn: Option<Box<ConnState>>,
    /// The client's connection attributes (`backend::shared::Key::attrs`).
    pub conn_attrs: u64,
}

/// An error for the client at a given sequence id, and what to record.
pub struct Refusal {
    pub error: Error,
    pub reject: Option<Reject>,
}

impl From<Error> for Refusal {
    fn from(error: Error) -> Self {
        Refusal { error, reject: None }
    }
}

fn refuse(reject: Reject, error: Error) -> Refusal {
    Refusal { error, reject: Some(reject) }
}

/// No backend could be reached or chosen.
fn no_backend(error: Error) -> Refusal {
    refuse(Reject::NoBackend, error)
}

/// Passthrough on a pooled connection: COM_CHANGE_USER, and the server's first answer.
async fn change_user(idle: &mut Idle, hr: &HandshakeResponse) -> std::io::Result<(u8, Vec<u8>)> {
    link::send_change_user(idle, hr).await?;
    idle.conn.read_packet(LOGIN_PACKET_LIMIT).await
}

impl AuthIo for PacketConn {
    async fn send(&mut self, payload: &[u8], seq: u8) -> std::io::Result<()> {
        self.write_packet(payload, seq).await.map(|_| ())
    }
    async fn recv(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        self.read_packet(LOGIN_PACKET_LIMIT).await
    }
    fn secure(&self) -> bool {
        self.stream.is_tls() || self.stream.is_unix()
    }
}

/// Sluice's greeting, repeating the backend's real version and capabilities.
fn greeting(tls: bool, info: &ServerInfo, id: u32, scramble: &[u8; 20], plugin: &[u8]) -> Greeting {
    let mut caps = cap::SLUICE_SUPPORTED & info.capabilities | cap::COMPRESS | cap::ZSTD_COMPRESSION;
    caps |= cap::PROTOCOL_41 | cap::SECURE_CONNECTION | cap::PLUGIN_AUTH;
    if tls {
        caps |= cap::SSL;
    }
    Greeting {
        server_version: info.version.clone(),
        connection_id: id,
        scramble: scramble.to_vec(),
        capabilities: caps,
        mariadb_capabilities: info.mariadb_capabilities & mariadb_cap::SLUICE_SUPPORTED,
        collation: info.collation,
        status: status::AUTOCOMMIT,
        auth_plugin: plugin.to_vec(),
    }
}

fn random_scramble() -> [u8; 20] {
    let mut r = [0u8; 20];
    if aws_lc_rs::rand::fill(&mut r).is_err() {
        // Never expected; fall back to time-derived bytes rather than fail the login.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        for (i, b) in r.iter_mut().enumerate() {
            *b = (t >> (i % 16 * 8)) as u8 ^ i as u8;
        }
    }
    auth::make_scramble(r)
}

/// Runs the whole connection phase. On failure the client has been sent an ERR where possible.
pub async fn login(ctx: &Ctx, stream: Stream, handle: &SessionHandle, listener: &Listener) -> std::result::Result<LoggedIn, Refusal> {
    let mut client = PacketConn::new(stream);
    let mut tried = Vec::new();
    let (info, pre) = server_info(ctx, &mut client, handle, &mut tried).await?;
    let scramble = random_scramble();
    let plugin = match listener.auth {
        AuthMode::Users => ctx.config().proxy.auth_plugin.name(),
        AuthMode::Passthrough => auth::NATIVE,
    };
    // Read once: a certificate renewed meanwhile is for the next connection.
    let tls = ctx.tls.server_config();
    let g = greeting(tls.is_some(), &info, handle.id, &scramble, plugin);
    let (mut client, seq, payload) = handshake(client, &g, tls).await?;
    let hr = HandshakeResponse::parse(&payload).map_err(|e| Error::malformed(Side::Client, e))?;
    let next = seq.wrapping_add(1);
    let client_caps = hr.capabilities & g.capabilities;
    let compression = compression_of(&hr, client_caps);
    let mut state = SessionState {
        user: String::from_utf8_lossy(&hr.user).as_ref().into(),
        schema: hr.database.as_ref().filter(|d| !d.is_empty()).map(|d| String::from_utf8_lossy(d).into()),
        collation: hr.collation,
        status: status::AUTOCOMMIT,
        multi_statements: client_caps & cap::MULTI_STATEMENTS != 0,
        ..Default::default()
    };
    // Whether a schema was named at login does not matter once logged in; COM_CHANGE_USER
    // names the client's own. Whether TLS to the backend is wanted depends on the backend: it
    // is set once one is chosen.
    let fit = Fit {
        client_caps: client_caps & !(cap::TRANSPORT | cap::CONNECT_WITH_DB),
        mariadb_caps: hr.mariadb_capabilities & g.mariadb_capabilities,
        backend_tls: false,
        // (Connections opened with a PROXY header carry the client's address.)
        source: ctx.backends.list().iter().any(|b| b.send_proxy.is_some()).then(|| super::origin(handle).source()).flatten(),
        collation: hr.collation,
    };
    let client_tls = client.stream.is_tls();
    let multiplex = listener.multiplex && listener.auth == AuthMode::Users;
    let mut attempt = Attempt { ctx, handle, hr: &hr, greeting: &g, client_caps, client_tls, pre, tried, fit, multiplex };
    let result = match listener.auth {
        AuthMode::Passthrough => {
            state.passthrough = true;
            passthrough(&mut attempt, &mut client, next).await
        }
        AuthMode::Users => users(&mut attempt, &mut client, next).await,
    };
    match result {
        Ok(b) => Ok(LoggedIn {
            // (Passthrough on TiDB: a move logs in with a session token as the same client.)
            profile: (listener.auth == AuthMode::Users || b.guard.is_tidb()).then(|| Profile::new(&hr)),
            // (Users mode: the server's sql_mode for a new session; passthrough: unknown.)
            state: SessionState { tracked: tracked_by(&b, client_caps), lex: lex_by(&b), handed_over: b.guard.is_tidb(), ..state },
            fit: Fit { backend_tls: b.guard.tls.wanted(client_tls), ..fit },
            client,
            backend: b.backend,
            guard: b.guard,
            client_caps,
            backend_caps: b.backend_caps,
            mariadb: b.mariadb,
            compression,
            credential: b.credential,
            user_slot: b.user_slot,
            scramble,
            slot: b.slot,
            conn: b.conn,
            conn_attrs: crate::backend::shared::attrs_hash(&hr.attributes),
        }),
        Err((r, seq)) => {
            if let Some(seq) = seq {
                send_error(&mut client, seq, &r.error).await;
            }
            Err(r)
        }
    }
}

/// What the greeting repeats of a backend: its version, from a connection opened now when none
/// is known yet (that connection is then the login's first choice). A failure is sent to the
/// client.
async fn server_info(
    ctx: &Ctx,
    client: &mut PacketConn,
    handle: &SessionHandle,
    tried: &mut Vec<(usize, Error)>,
) -> std::result::Result<(ServerInfo, Option<Opened>), Refusal> {
    if let Some(i) = ctx.backends.server_info() {
        return Ok((i, None));
    }
    match link::open_any(&ctx.backends, tried, super::origin(handle)).await.map_err(no_backend) {
        Ok(o) => {
            let info = o.backend.info.lock().clone().unwrap_or_default();
            Ok((info, Some(o)))
        }
        Err(r) => {
            send_error(client, 0, &r.error).await;
            Err(r)
        }
    }
}

/// Sends the greeting `g` and reads the client's handshake response, over TLS when the client
/// asks for it first: the client's connection, the response's sequence number and payload.
async fn handshake(
    mut client: PacketConn,
    g: &Greeting,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::result::Result<(PacketConn, u8, Vec<u8>), Refusal> {
    let mut out = Vec::with_capacity(128);
    g.write(&mut out);
    client.write_packet(&out, 0).await.map_err(|e| Error::io(Side::Client, "sending greeting", e))?;
    // With TLS configured this may be an SSL request, after which the TLS handshake must see
    // every byte: read exactly one packet. Without, one buffered read takes it all.
    let first =
        if tls.is_some() { client.read_packet_exact(LOGIN_PACKET_LIMIT).await } else { client.read_packet(LOGIN_PACKET_LIMIT).await };
    let (seq, payload) = first.map_err(|e| Error::io(Side::Client, "reading handshake response", e))?;
    if !is_ssl_request(&payload) {
        return Ok((client, seq, payload));
    }
    let Some(tls) = tls else {
        return Err(Error::client("client asked for TLS, which is off (tls = \"off\")").into());
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let s = acceptor.accept(client.stream).await.map_err(|e| Error::client(format!("TLS handshake: {e}")))?;
    let mut client = PacketConn::new(Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(s))));
    let (seq, payload) = read_client(&mut client).await?;
    Ok((client, seq, payload))
}

/// The compression the client and sluice agreed to.
fn compression_of(hr: &HandshakeResponse, client_caps: u32) -> Option<sluice_proto::compress::Algorithm> {
    if client_caps & cap::ZSTD_COMPRESSION != 0 {
        Some(sluice_proto::compress::Algorithm::Zstd { level: hr.zstd_level.unwrap_or(3).clamp(1, 22) as i32 })
    } else if client_caps & cap::COMPRESS != 0 {
        Some(sluice_proto::compress::Algorithm::Zlib)
    } else {
        None
    }
}

/// What the client's own session tracks, where sluice's tracking on its behalf hides it (users
/// mode, a client with CLIENT_SESSION_TRACK): the server's defaults at first.
/// The lexer mode of a new session: its server's default sql_mode's in users mode, unknown in
/// passthrough.
fn lex_by(b: &Backed) -> Option<sluice_proto::lexer::Mode> {
    b.credential.as_ref().and(*b.guard.lex_default.lock())
}

fn tracked_by(b: &Backed, client_caps: u32) -> Option<Box<sluice_proto::basic::Tracked>> {
    (b.credential.is_some() && client_caps & cap::SESSION_TRACK != 0).then(|| Box::new(b.guard.tracking.lock().clone().unwrap_or_default()))
}

async fn read_client(client: &mut PacketConn) -> Result<(u8, Vec<u8>)> {
    client.read_packet(LOGIN_PACKET_LIMIT).await.map_err(|e| Error::io(Side::Client, "reading handshake response", e))
}

async fn send_error(client: &mut PacketConn, seq: u8, e: &Error) {
    let mut p = Vec::new();
    // Codes from 2000 are the client library's own (2013: lost connection), which clients do
    // not expect from a server during login (the MariaDB client calls it a malformed packet):
    // a backend that failed the login is told as a connection the server ended.
    let code = if (2000..3000).contains(&e.code) { code::CONNECTION_KILLED } else { e.code };
    if seq == 0 {
        sluice_proto::basic::err_payload_pre_handshake(&mut p, code, &e.message);
    } else {
        sluice_proto::basic::err_payload(&mut p, code, &e.sql_state, &e.message);
    }
    let _ = client.write_packet(&p, seq).await;
}

/// A failure and the sequence id at which the client should get the error (None: already sent).
type Fail = (Refusal, Option<u8>);

/// The error a login gets when no connection to `b` became free within `queue_timeout`.
fn queue_full(b: &Backend, waited: std::time::Duration, ctx: &Ctx) -> Refusal {
    let msg = super::multiplex::queue_message(ctx, b, waited);
    refuse(Reject::NoBackend, Error::new(Side::Proxy, code::CON_COUNT, msg).state(b"08004"))
}

/// What both authentication modes work from.
struct Attempt<'a> {
    ctx: &'a Ctx,
    handle: &'a SessionHandle,
    hr: &'a HandshakeResponse,
    greeting: &'a Greeting,
    client_caps: u32,
    /// The client's connection to sluice is TLS (backend TLS in "auto" mode follows it).
    client_tls: bool,
    /// A backend connection opened before the greeting (no server version was known yet).
    pre: Option<Opened>,
    /// Backends that could not be reached, and why.
    tried: Vec<(usize, Error)>,
    /// Which pooled connections this client may take.
    fit: Fit,
    /// The listener multiplexes: a spare connection of the user may serve the login.
    multiplex: bool,
}

/// Passthrough: the backend authenticates the client; sluice relays the exchange.
async fn passthrough(a: &mut Attempt<'_>, client: &mut PacketConn, cseq: u8) -> std::result::Result<Backed, Fail> {
    let (ctx, handle, hr, client_caps) = (a.ctx, a.handle, a.hr, a.client_caps);
    if client_caps & cap::PLUGIN_AUTH == 0 {
        let e = Error::new(Side::Client, code::NOT_SUPPORTED_YET, "sluice passthrough needs a client with plugin authentication");
        return Err((e.into(), Some(cseq)));
    }
    let io_b = |e| (Refusal::from(Error::io(Side::Backend, "login", e)), Some(cseq));
    // The backend's first answer comes from a new connection's login or a pooled one's
    // COM_CHANGE_USER; the exchange that follows is the same.
    let (mut backend, b, thread_id, backend_caps, mariadb, first, slot) = loop {
        let b = match &a.pre {
            Some(o) => o.backend.clone(),
            None => link::pick(&ctx.backends, &a.tried).map_err(|e| (no_backend(e), Some(cseq)))?,
        };
        let slot = b.shared.place().await.map_err(|w| (queue_full(&b, w, ctx), Some(cseq)))?;
        let link = match a.pre.take() {
            Some(o) => Link::Fresh(o),
            None => match link::link_on(b, &mut a.tried, Some(a.fit), a.client_tls, super::origin(a.handle)).await {
                Some(link) => link,
                None => continue,
            },
        };
        match link {
            Link::Reused(b, mut idle) => match change_user(&mut idle, hr).await {
                Ok(first) => {
                    b.metrics.pool_reused.inc();
                    break (idle.conn, b, idle.thread_id, idle.backend_caps, idle.mariadb, first, slot);
                }
                Err(e) => tracing::debug!(backend = %b.name, error = %e, "pooled connection went stale; taking another"),
            },
            Link::Fresh(o) => {
                let tls = match o.backend.tls.decide(a.client_tls, &o.greeting) {
                    Ok(tls) => tls,
                    Err(e) => {
                        a.tried.push((o.backend.index, e));
                        continue;
                    }
                };
                let mut bhr = backend_response(hr, &o.greeting, client_caps, tls);
                bhr.auth_plugin = Some(link::PASSTHROUGH_PLUGIN.to_vec());
                let (mut backend, bseq) = bconn::maybe_tls(&o.backend, o.conn, &bhr).await.map_err(|e| (e.into(), Some(cseq)))?;
                let mut out = Vec::new();
                bhr.write(&mut out);
                backend.write_packet(&out, bseq).await.map_err(io_b)?;
                let first = backend.read_packet(LOGIN_PACKET_LIMIT).await.map_err(io_b)?;
                let mariadb = o.greeting.capabilities & cap::LONG_PASSWORD == 0;
                break (backend, o.backend, o.greeting.connection_id, bhr.capabilities, mariadb, first, slot);
            }
        }
    };
    let guard = b.bind();
    handle.bind_backend(b.index, &b.name, thread_id);
    let mut relay = Relay { client, seq: cseq, strip_track: (client_caps & cap::SESSION_TRACK == 0).then_some(mariadb) };
    match bconn::exchange(&mut backend, Some(first), &mut relay).await {
        Ok(Outcome::Ok(_)) => Ok(Backed {
            backend,
            guard,
            backend_thread_id: thread_id,
            backend_caps,
            mariadb,
            credential: None,
            user_slot: None,
            slot,
            conn: None,
        }),
        // The client has the backend's answer already.
        Ok(Outcome::Refused(p)) => {
            let e = sluice_proto::basic::Err::parse(&p).map_err(|e| (Error::malformed(Side::Backend, e).into(), None))?;
            let mut err = Error::new(Side::Client, e.code, String::from_utf8_lossy(e.message).into_owned());
            err.sql_state = e.sql_state;
            let reject = (e.code == code::ACCESS_DENIED).then_some(Reject::AccessDenied);
            Err((Refusal { error: err, reject }, None))
        }
        Err(e) if e.side == Side::Client => Err((e.into(), None)),
        Err(e) => Err((e.into(), Some(relay.seq))),
    }
}

/// Users mode: sluice checks the password, then logs in to a backend as the same user.
async fn users(a: &mut Attempt<'_>, client: &mut PacketConn, cseq: u8) -> std::result::Result<Backed, Fail> {
    let (slot, credential, cseq) = authenticate(a, client, cseq).await?;
    let b = connect_as(a, &credential).await.map_err(|r| (r, Some(cseq)))?;
    a.handle.bind_backend(b.guard.index, &b.guard.name, b.backend_thread_id);
    let mut ok = Vec::new();
    sluice_proto::basic::ok_payload(&mut ok, 0, 0, 0, status::AUTOCOMMIT, 0);
    client.write_packet(&ok, cseq).await.map_err(|e| (Refusal::from(Error::io(Side::Client, "login", e)), None))?;
    Ok(Backed { user_slot: Some(slot), ..b })
}

/// Users mode: checks the client's password (and its TLS, and its user's connection limit).
/// The user's place among its connections, the credentials sluice logs in with, and the
/// client's next sequence number.
async fn authenticate(a: &Attempt<'_>, client: &mut PacketConn, cseq: u8) -> std::result::Result<(UserSlot, Credential, u8), Fail> {
    let (ctx, hr, g) = (a.ctx, a.hr, a.greeting);
    let name = String::from_utf8_lossy(&hr.user).into_owned();
    let plugin = hr.auth_plugin.clone().unwrap_or_else(|| auth::NATIVE.to_vec());
    let io_c = |e| (Refusal::from(Error::io(Side::Client, "login", e)), None);
    let (verdict, cseq) =
        verify(client, cseq, &ctx.users, ctx.rsa.as_ref(), &name, &plugin, &hr.auth_response, &g.scramble).await.map_err(io_c)?;
    let user = match verdict {
        Verdict::Accepted(u) => u,
        Verdict::Denied { used_password } => {
            let msg = format!("Access denied for user '{}' (using password: {})", name, if used_password { "YES" } else { "NO" });
            let e = Error::new(Side::Client, code::ACCESS_DENIED, msg).state(b"28000");
            return Err((refuse(Reject::AccessDenied, e), Some(cseq)));
        }
    };
    if user.require_tls && !client.stream.is_tls() {
        let e = Error::new(Side::Client, code::SECURE_TRANSPORT_REQUIRED, format!("user '{name}' must connect with TLS"));
        return Err((refuse(Reject::TlsRequired, e.state(b"HY000")), Some(cseq)));
    }
    // Given back when dropped: on an error below, or when handshake_timeout drops this future.
    let Some(slot) = user.acquire() else {
        let msg = format!("User '{name}' has exceeded the 'max_user_connections' resource");
        let e = Error::new(Side::Client, code::TOO_MANY_USER_CONNECTIONS, msg).state(b"42000");
        return Err((refuse(Reject::MaxUserConnections, e), Some(cseq)));
    };
    let Some(credential) = user.credential() else {
        return Err((Error::proxy(code::UNKNOWN_ERROR, "no credential for backend login").into(), Some(cseq)));
    };
    Ok((slot, credential.clone(), cseq))
}

/// Users mode: a backend connection logged in as the client's user, in the login's schema
/// (`backend::checkout`: a spare connection of the user's when multiplexing, a pooled one, or
/// a new login); the next backend when one cannot be reached.
async fn connect_as(a: &mut Attempt<'_>, credential: &Credential) -> std::result::Result<Backed, Refusal> {
    let (ctx, hr) = (a.ctx, a.hr);
    let attrs = crate::backend::shared::attrs_hash(&hr.attributes);
    let key = Key { user: std::sync::Arc::from(String::from_utf8_lossy(&hr.user).as_ref()), fit: a.fit, collation: hr.collation, attrs };
    let want = SessionState {
        schema: hr.database.as_ref().filter(|d| !d.is_empty()).map(|d| String::from_utf8_lossy(d).into()),
        // (A spare connection goes back to the character set of this login, not the server's.)
        collation: hr.collation,
        multi_statements: a.client_caps & cap::MULTI_STATEMENTS != 0,
        ..Default::default()
    };
    loop {
        let backend = match &a.pre {
            Some(o) => o.backend.clone(),
            None => link::pick(&ctx.backends, &a.tried).map_err(no_backend)?,
        };
        let key = Key { fit: Fit { backend_tls: backend.tls.wanted(a.client_tls), ..key.fit }, ..key.clone() };
        let r = Request {
            key: &key,
            reuse: a.multiplex,
            state: &want,
            hello: Hello::Given(hr),
            client_caps: a.client_caps,
            client_tls: a.client_tls,
            credential,
            same_as: None,
            origin: super::origin(a.handle),
            pool: Some(a.fit),
        };
        let lease = match checkout(&backend, &r, &mut a.pre, &mut a.tried).await {
            Ok(Some(lease)) => lease,
            Ok(None) => continue,
            Err(Fault::Queue(waited)) => return Err(queue_full(&backend, waited, ctx)),
            Err(Fault::Failed(e)) => return Err(e.into()),
        };
        return Ok(Backed {
            backend: lease.conn,
            guard: backend.bind(),
            backend_thread_id: lease.state.thread_id,
            backend_caps: lease.backend_caps,
            mariadb: lease.mariadb,
            credential: Some(credential.clone()),
            user_slot: None,
            slot: lease.slot,
            conn: Some(lease.state),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_keeps_what_a_later_login_repeats_but_not_the_auth_response() {
        let hr = HandshakeResponse {
            capabilities: cap::PROTOCOL_41 | cap::SECURE_CONNECTION | cap::PLUGIN_AUTH | cap::CONNECT_ATTRS | cap::CONNECT_WITH_DB,
            mariadb_capabilities: 0,
            max_packet: 1 << 24,
            collation: 45,
            user: b"app".to_vec(),
            auth_response: vec![7; 20],
            database: Some(b"shop".to_vec()),
            auth_plugin: Some(b"mysql_native_password".to_vec()),
            attributes: vec![(b"_client_name".to_vec(), b"pymysql".to_vec()), (b"program_name".to_vec(), b"bench".to_vec())],
            zstd_level: None,
        };
        let mut p = Profile::new(&hr);
        let back = p.get();
        assert_eq!(back, HandshakeResponse { auth_response: Vec::new(), ..hr.clone() });
        // Sessions that log in alike share one copy; one that changed user has its own.
        let q = Profile::new(&hr);
        assert!(Arc::ptr_eq(&p.0, &q.0));
        p.set_user(b"other");
        assert_eq!(p.get(), HandshakeResponse { auth_response: Vec::new(), user: b"other".to_vec(), ..hr.clone() });
        assert!(!Arc::ptr_eq(&p.0, &q.0));
        assert_eq!(q.get().user, b"app");
    }

    #[test]
    fn profiles_no_session_holds_are_let_go() {
        let mut set = Profiles::default();
        let kept = set.intern(b"kept".to_vec());
        for i in 0..200u32 {
            set.intern(i.to_le_bytes().to_vec());
        }
        // (Each purge keeps the held one and the few made since the last.)
        assert!(set.set.len() < 100, "{}", set.set.len());
        assert!(set.set.contains(&kept[..]));
        assert!(Arc::ptr_eq(&set.intern(b"kept".to_vec()), &kept));
    }
}

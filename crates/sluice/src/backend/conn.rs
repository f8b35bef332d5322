//! Opening a connection to a backend: connect, read its greeting, optionally switch to TLS,
//! and log in either with credentials sluice holds or by relaying a client's login.

use std::time::Duration;

use sluice_proto::auth;
use sluice_proto::consts::cap;
use sluice_proto::handshake::{AuthSwitch, Greeting, HandshakeResponse, write_ssl_request};
use tokio::net::{TcpStream, UnixStream};

use super::Backend;
use crate::config::Address;
use crate::error::{Error, Result, Side};
use crate::net::{PacketConn, Stream, tune_tcp};

/// Largest packet accepted from a backend during the connection phase.
const LOGIN_PACKET_LIMIT: usize = 1 << 20;

/// On whose behalf sluice opens a connection to a backend: what the PROXY protocol header says
/// to a backend with `send_proxy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Sluice's own (health checks, one-off connections), or a client of a Unix socket: v2
    /// LOCAL, v1 UNKNOWN (the server keeps sluice's address).
    Sluice,
    /// A client's session: where the client connected from, and the address it reached.
    Client { source: std::net::SocketAddr, dest: std::net::SocketAddr },
}

impl Origin {
    /// The client's address, when the connection is a client's.
    pub fn source(self) -> Option<std::net::IpAddr> {
        match self {
            Origin::Sluice => None,
            Origin::Client { source, .. } => Some(source.ip()),
        }
    }
}

/// The PROXY protocol header `b` is sent first on a connection for `origin` (none when `b` is
/// not configured to get one).
fn proxy_header(b: &Backend, origin: Origin) -> Option<Vec<u8>> {
    use sluice_proto::proxy_header::{write_local, write_v1, write_v2};
    let v2 = b.send_proxy? == crate::config::SendProxy::V2;
    let mut out = Vec::with_capacity(64);
    match origin {
        Origin::Sluice => write_local(&mut out, v2),
        Origin::Client { source, dest } if v2 => write_v2(&mut out, source, dest),
        Origin::Client { source, dest } => write_v1(&mut out, source, dest),
    }
    Some(out)
}

/// Connects and reads the greeting, all within `timeout`. Failures are retry-safe. A backend
/// with `send_proxy` is first sent the PROXY protocol header for `origin`.
///
/// A backend at its connection limit (1040 Too many connections) while sluice keeps idle
/// connections to it gets those back first ([`Backend::release_idle`]): they are closed with
/// COM_QUIT and the connection is tried again a few times while the server frees their places.
pub async fn open(b: &Backend, timeout: Duration, origin: Origin) -> Result<(PacketConn, Greeting)> {
    let first = open_once(b, timeout, origin).await;
    let full = |r: &Result<(PacketConn, Greeting)>| matches!(r, Err(e) if e.code == sluice_proto::consts::err::CON_COUNT);
    if !full(&first) {
        return first;
    }
    let idle = b.release_idle();
    if idle.is_empty() {
        return first;
    }
    tracing::info!(backend = %b.name, closed = idle.len(), "backend refused a connection (too many connections): closing the idle connections sluice keeps to it");
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        for c in idle {
            quit(c).await;
        }
    })
    .await;
    let mut res = first;
    for pause_ms in [0, 5, 20, 50, 100] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        res = open_once(b, timeout, origin).await;
        if !full(&res) {
            break;
        }
    }
    res
}

async fn open_once(b: &Backend, timeout: Duration, origin: Origin) -> Result<(PacketConn, Greeting)> {
    let res = tokio::time::timeout(timeout, async {
        let stream = match &b.address {
            Address::Tcp(a) => {
                let s = TcpStream::connect(a).await.map_err(|e| Error::from_connect(&e))?;
                if let (Ok(local), Ok(remote)) = (s.local_addr(), s.peer_addr()) {
                    b.own.note(local, remote);
                }
                tune_tcp(socket2::SockRef::from(&s));
                Stream::Tcp(s)
            }
            Address::Unix(p) => Stream::Unix(UnixStream::connect(p).await.map_err(|e| Error::from_connect(&e))?),
        };
        let mut conn = PacketConn::new(stream);
        if let Some(header) = proxy_header(b, origin) {
            conn.stream
                .write_within(Duration::ZERO, &header)
                .await
                .map_err(|e| Error::connect(format!("sending the PROXY header: {e}")))?;
        }
        let (_, payload) = conn.read_packet(LOGIN_PACKET_LIMIT).await.map_err(|e| Error::connect(format!("reading greeting: {e}")))?;
        if payload.first() == Some(&0xff) {
            // The backend refused the connection (e.g. 1040 Too many connections): keep its code
            // and message so that a client that cannot be served elsewhere gets them unchanged.
            let e = sluice_proto::basic::Err::parse(&payload).map_err(|e| Error::connect(e.to_string()))?;
            let mut err = Error::connect(String::from_utf8_lossy(e.message).into_owned());
            err.code = e.code;
            err.sql_state = e.sql_state;
            return Err(err);
        }
        let g = Greeting::parse(&payload).map_err(|e| Error::connect(format!("greeting: {e}")))?;
        if g.capabilities & cap::PROTOCOL_41 == 0 {
            return Err(Error::connect("backend does not speak protocol 4.1"));
        }
        Ok((conn, g))
    })
    .await;
    let res = match res {
        Ok(r) => r,
        Err(_) => Err(Error::connect(format!("no greeting within {timeout:?}"))),
    };
    match &res {
        Ok((_, g)) => b.remember_greeting(g),
        Err(_) => {
            b.metrics.connect_errors.inc();
        }
    }
    res
}

/// Switches to TLS when the handshake response asks for it (CLIENT_SSL, set by
/// [`backend_capabilities`] after [`super::BackendTls::decide`]): sends the SSL request and
/// makes the TLS handshake. Returns the connection and the sequence id the handshake response
/// must use.
pub async fn maybe_tls(b: &Backend, conn: PacketConn, hr: &HandshakeResponse) -> Result<(PacketConn, u8)> {
    if hr.capabilities & cap::SSL == 0 {
        return Ok((conn, 1));
    }
    let Some((config, server_name)) = b.tls.connector() else {
        return Err(Error::connect("TLS to this backend is off"));
    };
    let mut conn = conn;
    let mut req = Vec::with_capacity(32);
    write_ssl_request(&mut req, hr.capabilities, hr.mariadb_capabilities, hr.max_packet, hr.collation);
    conn.write_packet(&req, 1).await.map_err(|e| Error::connect(format!("SSL request: {e}")))?;
    let connector = tokio_rustls::TlsConnector::from(config.clone());
    let s = connector.connect(server_name.clone(), conn.stream).await.map_err(|e| Error::connect(format!("TLS handshake: {e}")))?;
    Ok((PacketConn::new(Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(s)))), 2))
}

/// The capabilities sluice asks a backend for on behalf of a client.
/// SESSION_TRACK is always asked for when the backend has it: sluice follows schema and
/// variable changes through it even for clients that did not ask (their OKs are rewritten).
pub fn backend_capabilities(client: u32, g: &Greeting, tls: bool) -> u32 {
    let mut c = (client | cap::SESSION_TRACK) & g.capabilities & !cap::TRANSPORT;
    if tls {
        c |= cap::SSL;
    }
    c | cap::PROTOCOL_41 | cap::SECURE_CONNECTION | cap::PLUGIN_AUTH
}

/// Credentials sluice holds for logging in as a user.
#[derive(Clone)]
pub enum Credential {
    /// The clear-text password.
    Password(Vec<u8>),
    /// SHA1(password), recovered from a client's mysql_native_password reply.
    NativeStage1([u8; 20]),
    /// A TiDB session token (`backend::tidb`): the auth data of a `tidb_session_token` login.
    SessionToken(Vec<u8>),
}

impl Credential {
    fn reply(&self, plugin: &[u8], scramble: &[u8], tls: bool) -> Result<Vec<u8>> {
        match (plugin, self) {
            (p, Credential::Password(pw)) if p == auth::NATIVE => {
                Ok(if pw.is_empty() { vec![] } else { auth::native_reply_from_stage1(scramble, &auth::native_stage1(pw)).to_vec() })
            }
            (p, Credential::SessionToken(t)) if p == auth::TIDB_SESSION_TOKEN => Ok(t.clone()),
            (p, Credential::NativeStage1(s1)) if p == auth::NATIVE => Ok(auth::native_reply_from_stage1(scramble, s1).to_vec()),
            (p, Credential::Password(pw)) if p == auth::CACHING_SHA2 => Ok(auth::sha2_reply(scramble, pw).to_vec()),
            // (TiDB then asks for the clear password, as for caching_sha2's full authentication.)
            (p, Credential::Password(pw)) if p == auth::TIDB_SM3 => Ok(auth::sm3_reply(scramble, pw)),
            (p, Credential::Password(pw)) if p == auth::CLEAR && tls => {
                let mut v = pw.clone();
                v.push(0);
                Ok(v)
            }
            (p, _) => Err(Error::backend(format!(
                "backend asks for auth plugin {} which sluice cannot use with the credentials it holds",
                String::from_utf8_lossy(p)
            ))),
        }
    }
}

/// Logs in to a backend with credentials sluice holds (health checks, users mode), within the
/// backend's exchange timeout. `hr` carries the user, schema, collation, attributes and
/// capabilities (CLIENT_SSL among them when the connection is to switch to TLS).
pub async fn login(b: &Backend, conn: PacketConn, g: &Greeting, mut hr: HandshakeResponse, cred: &Credential) -> Result<PacketConn> {
    bounded(b.connect_timeout, "login", async {
        let plugin = match cred {
            Credential::SessionToken(_) => auth::TIDB_SESSION_TOKEN.to_vec(),
            _ if g.auth_plugin.is_empty() => auth::NATIVE.to_vec(),
            _ => g.auth_plugin.clone(),
        };
        let (mut conn, seq) = maybe_tls(b, conn, &hr).await?;
        let tls = conn.stream.is_tls();
        hr.auth_response = cred.reply(&plugin, &g.scramble, tls)?;
        // A reply longer than a one-byte length allows (a TiDB session token) goes with a
        // length-encoded one, which servers read whether or not they offer the flag.
        if hr.auth_response.len() > 250 {
            hr.capabilities |= cap::PLUGIN_AUTH_LENENC_DATA;
        }
        hr.auth_plugin = Some(plugin);
        let mut out = Vec::new();
        hr.write(&mut out);
        conn.write_packet(&out, seq).await.map_err(|e| Error::io(Side::Backend, "login", e))?;
        auth_exchange(b, &mut conn, cred).await?;
        Ok(conn)
    })
    .await
}

/// Who a one-off connection logs in as ([`run_once`]).
pub struct As<'a> {
    pub user: &'a str,
    pub collation: u8,
    pub cred: &'a Credential,
    /// The client's own connection is TLS (a user that requires TLS gets it here too).
    pub client_tls: bool,
}

/// Opens a connection logged in as `who`; returns it with the capabilities in force.
pub async fn login_as(b: &Backend, who: &As<'_>) -> Result<(PacketConn, u32)> {
    let (conn, g) = open(b, b.connect_timeout, Origin::Sluice).await?;
    let tls = b.tls.decide(who.client_tls, &g)?;
    let caps = backend_capabilities(cap::SLUICE_SUPPORTED, &g, tls);
    let hr = HandshakeResponse {
        capabilities: caps,
        max_packet: 1 << 24,
        collation: who.collation,
        user: who.user.as_bytes().to_vec(),
        ..Default::default()
    };
    Ok((login(b, conn, &g, hr, who.cred).await?, caps))
}

/// Runs one command (`command`: its payload) on a fresh connection logged in as `who`, and
/// returns the first packet of the answer (KILL on another backend, a rule's KILL QUERY).
pub async fn run_once(b: &Backend, who: &As<'_>, command: &[u8]) -> Result<Vec<u8>> {
    let (mut conn, _) = login_as(b, who).await?;
    let reply = bounded(b.connect_timeout, "a one-off command", async {
        conn.write_packet(command, 0).await.map_err(|e| Error::io(Side::Backend, "sending a command", e))?;
        conn.read_packet(1 << 16).await.map_err(|e| Error::io(Side::Backend, "reading its answer", e))
    })
    .await?
    .1;
    quit(conn).await;
    Ok(reply)
}

/// Runs one exchange with a backend within `limit` (zero: no limit). A backend that accepted
/// the connection and then went silent fails it instead of hanging the session.
pub async fn bounded<T>(limit: Duration, what: &str, f: impl Future<Output = Result<T>>) -> Result<T> {
    if limit.is_zero() {
        return f.await;
    }
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => Err(Error::backend(format!("{what}: no answer within {limit:?}"))),
    }
}

/// Answers the backend's side of an authentication exchange (auth switches, caching_sha2
/// requests) with `cred` until it says OK (returned) or ERR (an error with its code), within
/// the backend's exchange timeout.
pub async fn answer_auth(b: &Backend, conn: &mut PacketConn, cred: &Credential) -> Result<Vec<u8>> {
    bounded(b.connect_timeout, "login", auth_exchange(b, conn, cred)).await
}

async fn auth_exchange(b: &Backend, conn: &mut PacketConn, cred: &Credential) -> Result<Vec<u8>> {
    let mut held = Held { cred, tls: conn.stream.is_tls(), unix: b.address_is_unix() };
    match exchange(conn, None, &mut held).await? {
        Outcome::Ok(ok) => Ok(ok),
        Outcome::Refused(err) => Err(Error::from_backend_err(&err)),
    }
}

/// Who answers what a backend asks during authentication (an auth switch, more data): sluice
/// with the credentials it holds, or the client through sluice.
pub trait Answer {
    /// The reply to the backend's request `p`.
    fn answer(&mut self, p: &[u8]) -> impl Future<Output = Result<Vec<u8>>>;
    /// Sees each of the backend's packets before it is acted on (a relay passes it on, and may
    /// rewrite it first).
    fn seen(&mut self, _p: &mut Vec<u8>) -> impl Future<Output = Result<()>> {
        async { Ok(()) }
    }
}

/// How an authentication exchange ended.
pub enum Outcome {
    /// The backend's OK.
    Ok(Vec<u8>),
    /// The backend's ERR.
    Refused(Vec<u8>),
}

/// The authentication exchange with a backend, whoever answers it: reads the backend's packets
/// (`first`, when already read) until OK or ERR, and sends `who`'s answers to its requests.
pub async fn exchange(conn: &mut PacketConn, first: Option<(u8, Vec<u8>)>, who: &mut impl Answer) -> Result<Outcome> {
    let io = |e| Error::io(Side::Backend, "login", e);
    let mut next = first;
    loop {
        let (seq, mut p) = match next.take() {
            Some(f) => f,
            None => conn.read_packet(LOGIN_PACKET_LIMIT).await.map_err(io)?,
        };
        who.seen(&mut p).await?;
        match p.first() {
            Some(0x00) => return Ok(Outcome::Ok(p)),
            Some(0xff) => return Ok(Outcome::Refused(p)),
            // caching_sha2: fast authentication succeeded; the OK follows.
            Some(0x01) if p.get(1) == Some(&3) => {}
            Some(0xfe | 0x01) => {
                let reply = who.answer(&p).await?;
                conn.write_packet(&reply, seq.wrapping_add(1)).await.map_err(io)?;
            }
            _ => return Err(Error::backend("unexpected packet during login")),
        }
    }
}

/// Sluice answers with credentials it holds (users mode, health checks).
struct Held<'a> {
    cred: &'a Credential,
    tls: bool,
    unix: bool,
}

impl Answer for Held<'_> {
    async fn answer(&mut self, p: &[u8]) -> Result<Vec<u8>> {
        match p {
            [0xfe, ..] => {
                let sw = AuthSwitch::parse(p).map_err(|e| Error::malformed(Side::Backend, e))?;
                self.cred.reply(sw.plugin, sw.data, self.tls)
            }
            // caching_sha2's (or tidb_sm3_password's) full authentication: the clear password,
            // over TLS or a Unix socket.
            [0x01, 4, ..] => {
                let Credential::Password(pw) = self.cred else {
                    return Err(Error::backend("backend wants full authentication (caching_sha2); sluice holds no clear password"));
                };
                if !self.tls && !self.unix {
                    return Err(Error::backend("backend wants the clear password over an unencrypted connection; configure tls"));
                }
                let mut v = pw.clone();
                v.push(0);
                Ok(v)
            }
            _ => Err(Error::backend("unexpected packet during login")),
        }
    }
}

impl Backend {
    fn address_is_unix(&self) -> bool {
        matches!(self.address, Address::Unix(_))
    }
}

/// Sends COM_QUIT (so the server does not count an aborted connection) and closes.
pub async fn quit(mut conn: PacketConn) {
    use tokio::io::AsyncWriteExt;
    let _ = conn.write_packet(&[sluice_proto::consts::com::QUIT], 0).await;
    let _ = conn.stream.shutdown().await;
}

//! A small client of etcd's v3 JSON API (its gRPC gateway, `POST /v3/...`): calls, and the
//! streams of watch and lease keep-alive, over HTTP/1.1, in TLS (`https://`, verified against
//! `[cluster] tls_ca`, with a client certificate when one is given) or plain. With `[cluster]
//! user`, it authenticates (`/v3/auth/authenticate`) and sends the token with every request,
//! authenticating again when etcd says the token is no longer good. Keys and values travel in
//! base64, as the gateway wants them.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::ClusterConfig;

/// How long a call (or the start of a stream) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Etcd {
    /// `HOST:PORT` of each endpoint, tried in turn.
    endpoints: Vec<String>,
    /// For `https://` endpoints: the TLS client and the name etcd's certificate must carry
    /// (the endpoint's host).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// etcd's user and password, and the token last given for them.
    login: Option<(String, String)>,
    token: parking_lot::Mutex<Option<String>>,
}

/// A connection to etcd, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub fn b64(s: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

pub fn unb64(v: &Value) -> Vec<u8> {
    v.as_str().and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok()).unwrap_or_default()
}

/// The end of the range of keys that begin with `prefix` (its last byte plus one).
pub fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// What went wrong with etcd, and whose fault: `[cluster]`'s (`Config`, `Pem`, `Tls`), or the
/// store's and the network's (the rest).
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error(transparent)]
    Config(#[from] crate::config::InvalidValue),
    #[error(transparent)]
    Pem(#[from] crate::config::PemError),
    #[error("{what}: {source}")]
    Tls { what: &'static str, source: rustls::Error },
    #[error("TLS: {0}")]
    TlsHandshake(std::io::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}: timed out")]
    Timeout(String),
    /// etcd refused the request: its HTTP status and answer (never the password).
    #[error("HTTP {status}: {body}")]
    Refused { status: String, body: String },
    /// etcd answered what sluice cannot read, or too little.
    #[error("{0}")]
    Answer(String),
    /// An endpoint's failure, named.
    #[error("{at}: {source}")]
    At { at: String, source: Box<EtcdError> },
}

fn invalid(message: String) -> EtcdError {
    EtcdError::Config(crate::config::InvalidValue(message))
}

impl Etcd {
    pub fn new(c: &ClusterConfig) -> Result<Etcd, EtcdError> {
        let mut tls_wanted = None;
        let endpoints: Vec<String> = c
            .etcd
            .iter()
            .map(|u| {
                let (tls, hostport) = match (u.strip_prefix("https://"), u.strip_prefix("http://")) {
                    (Some(h), _) => (true, h),
                    (None, Some(h)) => (false, h),
                    _ => return Err(invalid(format!("cluster.etcd: {u:?}: an https:// or http:// endpoint"))),
                };
                if tls_wanted.replace(tls).is_some_and(|t| t != tls) {
                    return Err(invalid("cluster.etcd: all endpoints https://, or all http://".into()));
                }
                Ok(hostport.trim_end_matches('/').to_string())
            })
            .collect::<Result<_, EtcdError>>()?;
        if endpoints.is_empty() {
            return Err(invalid("cluster.etcd names no endpoint".into()));
        }
        let tls = if tls_wanted == Some(true) { Some(client_config(c)?) } else { None };
        let login = match (&c.user, &c.password) {
            (Some(u), Some(p)) => Some((u.clone(), p.clone())),
            (None, None) => None,
            _ => return Err(invalid("cluster.user and cluster.password go together".into())),
        };
        Ok(Etcd { endpoints, tls, login, token: parking_lot::Mutex::new(None) })
    }

    /// One call; its JSON answer.
    pub async fn call(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let mut s = self.stream(path, body).await?;
        tokio::time::timeout(CALL_TIMEOUT, s.next())
            .await
            .map_err(|_| EtcdError::Timeout(format!("etcd {path}")))??
            .ok_or_else(|| EtcdError::Answer(format!("etcd {path}: empty answer")))
    }

    /// A request whose answer is a stream of JSON messages (or one). With a user, it carries
    /// a token (asked for first, and again once if etcd refuses the one it has).
    pub async fn stream(&self, path: &str, body: &Value) -> Result<Stream, EtcdError> {
        if self.login.is_none() {
            return self.send(path, body, None).await;
        }
        for again in [false, true] {
            let token = self.token(again).await?;
            match self.send(path, body, Some(&token)).await {
                Err(e) if !again && e.to_string().contains("auth") => continue,
                r => return r,
            }
        }
        unreachable!("the second try returns")
    }

    /// The token to send: the one held, or a new one (`fresh`, or none held yet).
    async fn token(&self, fresh: bool) -> Result<String, EtcdError> {
        if !fresh && let Some(t) = self.token.lock().clone() {
            return Ok(t);
        }
        let (user, password) = self.login.as_ref().expect("called with a login");
        let mut s = self.send("/v3/auth/authenticate", &serde_json::json!({ "name": user, "password": password }), None).await?;
        let answer = tokio::time::timeout(CALL_TIMEOUT, s.next()).await.map_err(|_| EtcdError::Timeout("etcd authentication".into()))??;
        let token = answer
            .as_ref()
            .and_then(|a| a["token"].as_str())
            .ok_or_else(|| EtcdError::Answer("etcd authentication: no token in the answer".into()))?
            .to_string();
        *self.token.lock() = Some(token.clone());
        Ok(token)
    }

    /// Sends the request to each endpoint in turn until one answers it.
    async fn send(&self, path: &str, body: &Value, token: Option<&str>) -> Result<Stream, EtcdError> {
        let mut last = EtcdError::Answer("etcd: no endpoint".into());
        for e in &self.endpoints {
            let at = |source| EtcdError::At { at: format!("etcd {e}{path}"), source: Box::new(source) };
            match tokio::time::timeout(CALL_TIMEOUT, self.open(e, path, body, token)).await {
                Ok(Ok(s)) => return Ok(s),
                // (etcd's answer says what went wrong; the password is never in it.)
                Ok(Err(err)) => last = at(err),
                Err(_) => last = EtcdError::Timeout(format!("etcd {e}{path}")),
            }
        }
        Err(last)
    }

    async fn open(&self, endpoint: &str, path: &str, body: &Value, token: Option<&str>) -> Result<Stream, EtcdError> {
        let tcp = TcpStream::connect(endpoint).await?;
        let conn: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(config) => {
                let host = endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
                let name =
                    rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| invalid(format!("TLS name {host:?}: {e}")))?;
                let tls = tokio_rustls::TlsConnector::from(config.clone()).connect(name, tcp).await.map_err(EtcdError::TlsHandshake)?;
                Box::new(tls)
            }
        };
        Stream::open(conn, endpoint, path, body, token).await
    }

    /// The keys that begin with `prefix`: the store's revision, and each (key, value).
    pub async fn range(&self, prefix: &str) -> Result<(u64, Vec<(String, Vec<u8>)>), EtcdError> {
        let answer =
            self.call("/v3/kv/range", &serde_json::json!({ "key": b64(prefix.as_bytes()), "range_end": b64(&range_end(prefix)) })).await?;
        let revision = answer["header"]["revision"].as_str().and_then(|r| r.parse().ok()).unwrap_or(0);
        let kvs = answer["kvs"].as_array().map(|a| a.as_slice()).unwrap_or_default();
        Ok((revision, kvs.iter().map(|kv| (String::from_utf8_lossy(&unb64(&kv["key"])).into_owned(), unb64(&kv["value"]))).collect()))
    }
}

/// The TLS client of `https://` endpoints: etcd's certificate verified against `tls_ca`, and
/// sluice's client certificate presented when one is given.
fn client_config(c: &ClusterConfig) -> Result<Arc<rustls::ClientConfig>, EtcdError> {
    let ca = c
        .tls_ca
        .as_ref()
        .ok_or_else(|| invalid("cluster.etcd: https:// endpoints need cluster.tls_ca (etcd's certificate is verified)".into()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in crate::config::load_certs(ca)? {
        roots.add(cert).map_err(|source| EtcdError::Tls { what: "cluster.tls_ca", source })?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|source| EtcdError::Tls { what: "TLS", source })?
        .with_root_certificates(roots);
    let config = match (&c.tls_cert, &c.tls_key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(crate::config::load_certs(cert)?, crate::config::load_key(key)?)
            .map_err(|source| EtcdError::Tls { what: "cluster.tls_cert", source })?,
        (None, None) => builder.with_no_client_auth(),
        _ => return Err(invalid("cluster.tls_cert and cluster.tls_key go together".into())),
    };
    Ok(Arc::new(config))
}

/// The answer of a streaming call, message by message.
pub struct Stream {
    conn: Box<dyn Io>,
    /// Bytes read and not yet taken apart.
    raw: Vec<u8>,
    /// The body so far (chunks joined), not yet split into messages.
    body: Vec<u8>,
    chunked: bool,
    /// Content-Length of an answer that is not chunked (None once it was read).
    length: Option<usize>,
}

impl Stream {
    async fn open(mut conn: Box<dyn Io>, endpoint: &str, path: &str, body: &Value, token: Option<&str>) -> Result<Stream, EtcdError> {
        let body = body.to_string();
        let auth = token.map(|t| format!("Authorization: {t}\r\n")).unwrap_or_default();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(req.as_bytes()).await?;
        let mut s = Stream { conn, raw: Vec::new(), body: Vec::new(), chunked: false, length: None };
        let head = loop {
            if let Some(i) = s.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&s.raw[..i]).into_owned();
                s.raw.drain(..i + 4);
                break head;
            }
            s.fill().await?;
        };
        let status = head.split_whitespace().nth(1).unwrap_or("");
        let lower = head.to_ascii_lowercase();
        s.chunked = lower.contains("transfer-encoding: chunked");
        s.length = lower.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok());
        if status != "200" {
            let mut more = Vec::new();
            let _ = tokio::time::timeout(Duration::from_millis(200), s.conn.read_to_end(&mut more)).await;
            s.raw.extend_from_slice(&more);
            return Err(EtcdError::Refused { status: status.to_string(), body: String::from_utf8_lossy(&s.raw).into_owned() });
        }
        Ok(s)
    }

    async fn fill(&mut self) -> Result<usize, EtcdError> {
        let mut buf = [0u8; 16 << 10];
        let n = self.conn.read(&mut buf).await?;
        if n == 0 {
            return Err(EtcdError::Answer("etcd closed the connection".into()));
        }
        self.raw.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    /// The next message; None when the answer ended.
    pub async fn next(&mut self) -> Result<Option<Value>, EtcdError> {
        loop {
            if let Some(i) = self.body.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.body.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| EtcdError::Answer(format!("etcd answered something that is not JSON: {e}")));
            }
            if !self.chunked {
                // One message: the whole body.
                let Some(len) = self.length.take() else { return Ok(None) };
                while self.raw.len() < len {
                    self.fill().await?;
                }
                return serde_json::from_slice(&self.raw[..len]).map(Some).map_err(|e| EtcdError::Answer(format!("etcd: {e}")));
            }
            match self.take_chunk()? {
                Some(0) => return Ok(None),
                Some(_) => {}
                None => {
                    self.fill().await?;
                }
            }
        }
    }

    /// Moves one whole chunk from `raw` to `body`: its size, or None when it is not all there.
    fn take_chunk(&mut self) -> Result<Option<usize>, EtcdError> {
        let Some(eol) = self.raw.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let size_text = String::from_utf8_lossy(&self.raw[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| EtcdError::Answer("etcd: a bad chunk".into()))?;
        if self.raw.len() < eol + 2 + size + 2 {
            return Ok(None);
        }
        self.body.extend_from_slice(&self.raw[eol + 2..eol + 2 + size]);
        self.raw.drain(..eol + 2 + size + 2);
        Ok(Some(size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_endpoints() {
        assert_eq!(range_end("/sluice/"), b"/sluice0");
        assert_eq!(range_end("a\u{7f}"), b"a\x80");
        let with = |urls: &[&str]| ClusterConfig { etcd: urls.iter().map(|u| u.to_string()).collect(), ..ClusterConfig::default() };
        let e = Etcd::new(&with(&["https://x:1"])).err().unwrap().to_string();
        assert!(e.contains("tls_ca"), "{e}");
        assert!(Etcd::new(&with(&["ftp://x:1"])).is_err());
        assert!(Etcd::new(&with(&["http://x:1", "https://y:1"])).is_err());
        assert_eq!(Etcd::new(&with(&["http://127.0.0.1:2379/"])).unwrap().endpoints, ["127.0.0.1:2379"]);
        let half = ClusterConfig { user: Some("u".into()), ..with(&["http://x:1"]) };
        assert!(Etcd::new(&half).is_err());
        assert_eq!(unb64(&Value::String(b64(b"key"))), b"key");
    }
}

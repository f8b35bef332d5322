//! TiDB backends, and moving a session between them the way TiDB offers (TiProxy's way), which
//! needs no password, so passthrough sessions move too:
//!
//! 1. `SHOW SESSION_STATES` on the session's connection, at a safe point: the session's state
//!    (variables, schema, prepared statements, bindings, ...) as JSON, and a session token,
//!    signed with the certificate every TiDB server of the cluster shares and valid a minute;
//!    TiDB refuses with an error what it cannot carry (a temporary table, a lock);
//! 2. a new connection to the other server, logged in as the session's user with the
//!    `tidb_session_token` plugin and the token as its auth data;
//! 3. `SET SESSION_STATES '<json>'` there.
//!
//! Prepared statements keep their ids, so a client's statement ids need no mapping. Any failure
//! leaves the session on its connection as it was.

use std::time::Duration;

use sluice_proto::consts::com;
use sluice_proto::handshake::HandshakeResponse;
use sluice_proto::packet::Reader;
use sluice_proto::uservar::row_values;

use super::Backend;
use super::conn::{self as bconn, Credential, Origin};
use crate::error::{Error, Result, Side};
use crate::net::PacketConn;

/// Whether a greeting's server version is TiDB's (`8.0.11-TiDB-v8.4.0`).
pub fn is_tidb(server_version: &[u8]) -> bool {
    memchr::memmem::find(server_version, b"-TiDB-").is_some()
}

/// A session's state as TiDB gives it, and the token that logs in as its user elsewhere.
pub struct States {
    json: Vec<u8>,
    token: Vec<u8>,
}

/// Reads the session's states off its connection (`caps`: the capabilities in force on it),
/// within `limit`. The server's refusal is an error with its message.
pub async fn read_states(conn: &mut PacketConn, caps: u32, limit: Duration) -> Result<States> {
    bconn::bounded(limit, "SHOW SESSION_STATES", async {
        let mut q = vec![com::QUERY];
        q.extend_from_slice(b"SHOW SESSION_STATES");
        conn.write_packet(&q, 0).await.map_err(|e| Error::io(Side::Backend, "SHOW SESSION_STATES", e))?;
        let packets = super::restore::read_text_result(conn, caps, "SHOW SESSION_STATES").await?;
        states_of(&packets)
    })
    .await
}

/// The states and token in `SHOW SESSION_STATES`'s result packets.
fn states_of(packets: &[Vec<u8>]) -> Result<States> {
    let first = packets.first().ok_or_else(|| Error::backend("SHOW SESSION_STATES: no answer"))?;
    if first.first() == Some(&0xff) {
        return Err(Error::backend(format!("SHOW SESSION_STATES: {}", super::manage::error_message(first))));
    }
    let columns = Reader::new(first).lenenc("column count").map_err(|e| Error::malformed(Side::Backend, e))? as usize;
    let row = packets.get(columns + 1).filter(|_| columns == 2);
    let values = row.and_then(|r| row_values(r, 2)).ok_or_else(|| Error::backend("SHOW SESSION_STATES: not the two columns TiDB gives"))?;
    match (values[0], values[1]) {
        (Some(json), Some(token)) => Ok(States { json: json.to_vec(), token: token.to_vec() }),
        _ => Err(Error::backend("SHOW SESSION_STATES: a NULL state or token")),
    }
}

/// `SET SESSION_STATES '<json>'`: the JSON quoted for a session in TiDB's default SQL mode
/// (a new session's, before the states set its own).
fn set_states_statement(json: &[u8]) -> Vec<u8> {
    let mut q = Vec::with_capacity(json.len() + 32);
    q.push(com::QUERY);
    q.extend_from_slice(b"SET SESSION_STATES '");
    for &b in json {
        match b {
            b'\\' => q.extend_from_slice(b"\\\\"),
            b'\'' => q.extend_from_slice(b"\\'"),
            0 => q.extend_from_slice(b"\\0"),
            _ => q.push(b),
        }
    }
    q.push(b'\'');
    q
}

/// Who the new connection logs in as: the session's login (user, collation, attributes), the
/// capabilities its client agreed to and whether its leg is TLS, and the capabilities its
/// connection has (the new one must have the same).
pub struct Resume<'a> {
    pub login: &'a HandshakeResponse,
    pub client_caps: u32,
    pub client_tls: bool,
    pub backend_caps: u32,
    pub origin: Origin,
}

/// A connection to `b` in the session's state: logged in with the session's token, its states
/// set. Its greeting's thread id comes with it.
pub async fn resume(b: &Backend, who: &Resume<'_>, states: States) -> Result<(PacketConn, u32)> {
    let (conn, g) = bconn::open(b, b.connect_timeout, who.origin).await?;
    if !is_tidb(&g.server_version) {
        return Err(Error::connect("it is not a TiDB server"));
    }
    // (The states name the schema; a TiDB server is no MariaDB.)
    let login = HandshakeResponse { database: None, ..who.login.clone() };
    let credential = Credential::SessionToken(states.token);
    let as_client = super::link::AsClient {
        hr: &login,
        client_caps: who.client_caps,
        client_tls: who.client_tls,
        credential: &credential,
        same_as: Some((who.backend_caps, false)),
    };
    let (mut conn, _) = super::link::log_in_as(b, conn, &g, &as_client).await?;
    run(b, &mut conn, &set_states_statement(&states.json), "SET SESSION_STATES").await?;
    if let Some(set) = collation_statement(&states.json) {
        run(b, &mut conn, &set, "SET collation_connection").await?;
    }
    Ok((conn, g.connection_id))
}

/// Runs a statement answered by OK.
async fn run(b: &Backend, conn: &mut PacketConn, statement: &[u8], what: &'static str) -> Result<()> {
    bconn::bounded(b.connect_timeout, what, async {
        conn.write_packet(statement, 0).await.map_err(|e| Error::io(Side::Backend, what, e))?;
        let (_, p) = conn.read_packet(1 << 16).await.map_err(|e| Error::io(Side::Backend, what, e))?;
        match p.first() {
            Some(0) => Ok(()),
            _ => Err(Error::backend(format!("{what}: {}", super::manage::error_message(&p)))),
        }
    })
    .await
}

/// TiDB sets the states' variables in an order that may put `character_set_connection` after
/// `collation_connection`, which resets the latter to the character set's default: the
/// collation is set again after them.
fn collation_statement(json: &[u8]) -> Option<Vec<u8>> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let name = v.get("sys-vars")?.get("collation_connection")?.as_str()?;
    if name.is_empty() || !name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
        return None;
    }
    let mut q = vec![com::QUERY];
    q.extend_from_slice(format!("SET SESSION collation_connection = '{name}'").as_bytes());
    Some(q)
}

/// Whether a TiDB server's status address (`HOST:PORT`) says it is shutting down: `/status`
/// answers 500 during its graceful wait after SIGTERM. A status address that does not answer
/// within `limit` says so too (the server is going, or the address is wrong: the reason says).
pub async fn status_closing(addr: &str, limit: Duration) -> Option<String> {
    match http_get(addr, "/status", limit, 1 << 16).await {
        Ok((200, _)) => None,
        Ok((code, _)) => Some(format!("its status address answers {code}")),
        Err(e) => Some(format!("its status address {addr}: {e}")),
    }
}

/// A TiDB server's `/metrics` (for the latency-aware policy's readings, `load.rs`).
pub async fn metrics(addr: &str, limit: Duration) -> std::io::Result<String> {
    match http_get(addr, "/metrics", limit, 8 << 20).await? {
        (200, body) => Ok(String::from_utf8_lossy(&body).into_owned()),
        (code, _) => Err(std::io::Error::other(format!("/metrics answered {code}"))),
    }
}

/// `GET path` over HTTP/1.0 within `limit`: the status code and at most `max` bytes of body.
async fn http_get(addr: &str, path: &str, limit: Duration, max: usize) -> std::io::Result<(u16, Vec<u8>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: tidb\r\n\r\n").as_bytes()).await?;
        let mut all = Vec::new();
        (&mut s).take(max as u64 + 4096).read_to_end(&mut all).await?;
        Ok::<_, std::io::Error>(all)
    };
    let all = tokio::time::timeout(limit, ask).await.map_err(|_| std::io::Error::other(format!("no answer within {limit:?}")))??;
    let code = all.get(9..12).and_then(|c| std::str::from_utf8(c).ok()).and_then(|c| c.parse().ok());
    let code = code.filter(|_| all.starts_with(b"HTTP/1.")).ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    let body = memchr::memmem::find(&all, b"\r\n\r\n").map_or(Vec::new(), |i| all[i + 4..].to_vec());
    Ok((code, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidb_is_told_by_its_version() {
        assert!(is_tidb(b"8.0.11-TiDB-v8.4.0-this-is-a-placeholder"));
        assert!(!is_tidb(b"10.11.6-MariaDB-0+deb12u1"));
        assert!(!is_tidb(b"8.0.36"));
    }

    #[test]
    fn states_are_quoted_for_the_default_sql_mode() {
        let q = set_states_statement(br#"{"a": "it's \"x\"\n"}"#);
        assert_eq!(&q[1..], br#"SET SESSION_STATES '{"a": "it\'s \\"x\\"\\n"}'"#);
    }

    #[test]
    fn the_collation_is_set_again_only_when_named_plainly() {
        let q = collation_statement(br#"{"sys-vars": {"collation_connection": "utf8_general_ci"}}"#).expect("named");
        assert_eq!(&q[1..], b"SET SESSION collation_connection = 'utf8_general_ci'");
        assert!(collation_statement(br#"{"sys-vars": {"collation_connection": "x' OR 1"}}"#).is_none());
        assert!(collation_statement(br#"{"sys-vars": {}}"#).is_none());
        assert!(collation_statement(b"not json").is_none());
    }
}

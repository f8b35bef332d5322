//! Sluice's own connection to a backend, logged in with an account of the configuration (the
//! health checks' monitor user, failover's user), for text statements whose answers sluice
//! reads: replication state, and the statements that change it. Every step is bounded.

use std::time::Duration;

use sluice_proto::consts::{cap, com};
use sluice_proto::handshake::HandshakeResponse;
use sluice_proto::packet::Reader;
use sluice_proto::replication::{self, ReplicaStatus};
use sluice_proto::uservar::row_values;

use super::Backend;
use super::conn::{self as bconn, Credential};
use crate::net::PacketConn;

/// Why a management step failed, and whose fault it was.
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct Failure {
    pub reason: String,
    /// Sluice's own want of descriptors or memory, not the backend's doing.
    pub local: bool,
    /// The backend never greeted: it refused the connection, or did not answer it.
    pub unanswered: bool,
}

impl Failure {
    /// The backend's failure.
    pub fn of_backend(reason: impl Into<String>) -> Failure {
        Failure { reason: reason.into(), local: false, unanswered: false }
    }

    /// A connection that failed before the backend's greeting.
    pub fn of_open(e: crate::error::Error) -> Failure {
        let local = e.side == crate::error::Side::Proxy;
        Failure { local, unanswered: !local, reason: e.message }
    }
}

/// A logged-in connection for management statements.
pub struct Manage {
    conn: PacketConn,
    caps: u32,
    /// Bound on each statement's answer.
    timeout: Duration,
}

impl Manage {
    /// Connects to `b` and logs in as `user` (TLS as a session's would be), all within
    /// `timeout`; each later statement is bounded by `timeout` too.
    pub async fn open(b: &Backend, user: &str, password: &str, timeout: Duration) -> Result<Manage, Failure> {
        let work = async {
            let (conn, g) = bconn::open(b, timeout, bconn::Origin::Sluice).await.map_err(Failure::of_open)?;
            let tls = b.tls.decide(true, &g).map_err(|e| Failure::of_backend(e.message))?;
            let caps = bconn::backend_capabilities(cap::SLUICE_SUPPORTED, &g, tls) & !(cap::CONNECT_WITH_DB | cap::NO_SCHEMA);
            let hr = HandshakeResponse {
                capabilities: caps,
                max_packet: 1 << 24,
                collation: g.collation,
                user: user.as_bytes().to_vec(),
                ..Default::default()
            };
            let cred = Credential::Password(password.as_bytes().to_vec());
            let conn =
                bconn::login(b, conn, &g, hr, &cred).await.map_err(|e| Failure::of_backend(format!("login as {user}: {}", e.message)))?;
            Ok(Manage { conn, caps, timeout })
        };
        match tokio::time::timeout(timeout + Duration::from_millis(100), work).await {
            Ok(r) => r,
            Err(_) => Err(Failure::of_backend(format!("no answer within {timeout:?}"))),
        }
    }

    /// The bound on each statement's answer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// Whether the server answers a ping with OK.
    pub async fn ping(&mut self) -> Result<(), Failure> {
        let ping = |e| Failure::of_backend(format!("ping: {e}"));
        let timeout = self.timeout;
        let work = async {
            self.conn.write_packet(&[com::PING], 0).await.map_err(ping)?;
            let (_, p) = self.conn.read_packet(1 << 16).await.map_err(ping)?;
            if p.first() == Some(&0) { Ok(()) } else { Err(Failure::of_backend("ping was not answered with OK")) }
        };
        bounded(timeout, work).await
    }

    /// Runs one statement: its result's packets (the column count, definitions and rows; or
    /// the OK), or the server's error as a failure (which names the statement up to its first
    /// quoted value).
    pub async fn query(&mut self, sql: &str) -> Result<Vec<Vec<u8>>, Failure> {
        let packets = self.query_raw(sql.as_bytes()).await?;
        match packets.first().map(|p| p.first()) {
            // (The statement up to its first quoted value: a password is never repeated.)
            Some(Some(0xff)) => {
                Err(Failure::of_backend(format!("{}: {}", sql.split('\'').next().unwrap_or_default().trim(), error_message(&packets[0]))))
            }
            _ => Ok(packets),
        }
    }

    /// Runs one statement and keeps the server's error among the packets (`SHOW SLAVE STATUS`
    /// without its privilege is no failure of the connection).
    pub async fn query_raw(&mut self, sql: &[u8]) -> Result<Vec<Vec<u8>>, Failure> {
        let mut payload = Vec::with_capacity(sql.len() + 1);
        payload.push(com::QUERY);
        payload.extend_from_slice(sql);
        let (caps, timeout) = (self.caps, self.timeout);
        let conn = &mut self.conn;
        let work = async move {
            conn.write_packet(&payload, 0).await.map_err(|e| Failure::of_backend(format!("sending a statement: {e}")))?;
            super::restore::read_text_result(conn, caps, "a management statement").await.map_err(|e| Failure::of_backend(e.message))
        };
        bounded(timeout, work).await
    }

    /// The first column of the first row of a statement's result (None: no row, or NULL).
    pub async fn value(&mut self, sql: &str) -> Result<Option<String>, Failure> {
        let packets = self.query(sql).await?;
        let columns = Reader::new(&packets[0]).lenenc("column count").map_or(0, |n| n as usize);
        let Some(row) = packets.get(columns + 1) else { return Ok(None) };
        let v = row_values(row, columns).ok_or_else(|| Failure::of_backend(format!("{sql}: a malformed row")))?;
        Ok(v.first().copied().flatten().map(|v| String::from_utf8_lossy(v).into_owned()))
    }

    /// `SHOW SLAVE STATUS` (None: it replicates from nobody).
    pub async fn replica_status(&mut self) -> Result<Option<ReplicaStatus>, Failure> {
        let status = self.query(std::str::from_utf8(replication::REPLICA_QUERY).unwrap_or_default()).await?;
        Ok(replica_status_of(&status))
    }

    /// Says goodbye.
    pub async fn quit(self) {
        bconn::quit(self.conn).await;
    }
}

async fn bounded<T>(timeout: Duration, f: impl Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, f).await {
        Ok(r) => r,
        Err(_) => Err(Failure::of_backend(format!("no answer within {timeout:?}"))),
    }
}

/// The replica status in the packets of [`replication::REPLICA_QUERY`]'s result.
pub fn replica_status_of(status: &[Vec<u8>]) -> Option<ReplicaStatus> {
    let columns = Reader::new(status.first()?).lenenc("column count").map_or(0, |n| n as usize).min(status.len() - 1);
    replication::replica_status(&status[1..=columns], &status[columns + 1..])
}

/// The message and code of an ERR packet.
pub fn error_message(p: &[u8]) -> String {
    match sluice_proto::basic::Err::parse(p) {
        Ok(e) => format!("{} ({})", String::from_utf8_lossy(e.message), e.code),
        Err(_) => "a malformed error".to_string(),
    }
}

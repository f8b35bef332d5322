//! The statements failover, switchover and rejoin run on a backend, over a management
//! connection logged in as `[failover] user`.

use std::time::Duration;

use sluice_proto::gtid::Position;

use crate::backend::Backend;
use crate::backend::manage::{Failure, Manage};
use crate::config::{Address, FailoverConfig};

/// What a server says of its place in replication, read just before acting.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// `Gtid_IO_Pos` (empty when it replicates from nobody).
    pub received: Position,
    /// `@@gtid_current_pos`.
    pub applied: Position,
    /// `@@gtid_binlog_pos`.
    pub logged: Position,
    pub replica: Option<sluice_proto::replication::ReplicaStatus>,
}

/// Logs in to `b` as failover's user.
pub async fn connect(b: &Backend, cfg: &FailoverConfig, timeout: Duration) -> Result<Manage, Failure> {
    let (user, password) = (cfg.user.as_deref().unwrap_or_default(), cfg.password.as_deref().unwrap_or_default());
    Manage::open(b, user, password, timeout).await
}

/// Reads a server's positions and replication status.
pub async fn observe(m: &mut Manage) -> Result<Seen, Failure> {
    let position = |what: &str, text: Option<String>| {
        let text = text.unwrap_or_default();
        Position::parse(&text).ok_or_else(|| Failure::of_backend(format!("{what} is not a GTID position: {text:?}")))
    };
    let applied = position("@@gtid_current_pos", m.value("SELECT @@gtid_current_pos").await?)?;
    let logged = position("@@gtid_binlog_pos", m.value("SELECT @@gtid_binlog_pos").await?)?;
    let replica = m.replica_status().await?;
    let received = position("Gtid_IO_Pos", replica.as_ref().map(|r| r.gtid_io_pos.clone()))?;
    Ok(Seen { received, applied, logged, replica })
}

/// Makes a replica the primary: [`take_over`], then [`forget_source`].
pub async fn promote(m: &mut Manage, received: &Position, catch_up: Duration) -> Result<(), Failure> {
    take_over(m, received, catch_up).await?;
    forget_source(m, catch_up).await
}

/// Makes a replica writable: it applies what it has received (`received`, within `catch_up`),
/// stops applying (its SQL thread: at once, even while its receiving thread waits for a hung
/// primary) and becomes writable. What it receives from now on is never applied.
pub async fn take_over(m: &mut Manage, received: &Position, catch_up: Duration) -> Result<(), Failure> {
    if !received.is_empty() {
        wait_for(m, received, catch_up).await?;
    }
    m.query("STOP SLAVE SQL_THREAD").await?;
    m.query("SET GLOBAL read_only = 0").await?;
    Ok(())
}

/// Stops a promoted server's replication (within `patience`) and forgets its source.
pub async fn forget_source(m: &mut Manage, patience: Duration) -> Result<(), Failure> {
    stop_replicating(m, patience).await?;
    m.query("RESET SLAVE ALL").await?;
    Ok(())
}

/// `STOP SLAVE`, given `limit`: its receiving thread may be waiting for a hung primary.
async fn stop_replicating(m: &mut Manage, limit: Duration) -> Result<(), Failure> {
    let bound = m.timeout();
    m.set_timeout(bound.max(limit));
    let started = std::time::Instant::now();
    let stopped = m.query("STOP SLAVE").await;
    m.set_timeout(bound);
    tracing::debug!(took_ms = started.elapsed().as_millis() as u64, "failover: STOP SLAVE");
    stopped.map(drop)
}

/// Waits until the server has applied `pos` (`MASTER_GTID_WAIT`), for at most `limit`.
pub async fn wait_for(m: &mut Manage, pos: &Position, limit: Duration) -> Result<(), Failure> {
    let secs = limit.as_secs_f64().max(0.001);
    let sql = format!("SELECT MASTER_GTID_WAIT('{pos}', {secs:.3})");
    let bound = m.timeout();
    m.set_timeout(bound + limit);
    let waited = m.value(&sql).await;
    m.set_timeout(bound);
    match waited?.as_deref() {
        Some("0") => Ok(()),
        _ => Err(Failure::of_backend(format!("it did not apply {pos} within {limit:?}"))),
    }
}

/// Makes the server replicate from `primary` (GTID from what it has applied). `account`: the
/// replication user and password, for a server that replicated from nobody (a former primary);
/// `demote`: its own transactions count as replicated (`MASTER_DEMOTE_TO_SLAVE`), as a former
/// primary's must. It is made read-only first. Stopping its replication may take `patience`
/// (its receiving thread may be waiting for a hung primary).
pub async fn follow(
    m: &mut Manage,
    primary: &Backend,
    account: Option<(&str, &str)>,
    demote: bool,
    patience: Duration,
) -> Result<(), Failure> {
    let Address::Tcp(a) = primary.address else {
        return Err(Failure::of_backend(format!("{} is not at a TCP address that a replica can connect to", primary.name)));
    };
    m.query("SET GLOBAL read_only = 1").await?;
    stop_replicating(m, patience).await?;
    let mut sql = format!("CHANGE MASTER TO MASTER_HOST = {}, MASTER_PORT = {}", quote(&a.ip().to_string()), a.port());
    if let Some((user, password)) = account {
        sql += &format!(", MASTER_USER = {}, MASTER_PASSWORD = {}", quote(user), quote(password));
    }
    sql += ", MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1";
    if demote {
        sql += ", MASTER_DEMOTE_TO_SLAVE = 1";
    }
    m.query(&sql).await?;
    m.query("START SLAVE").await?;
    Ok(())
}

/// `host:port` of a backend as `SHOW SLAVE STATUS` names a primary (`Master_Host:Master_Port`).
pub fn source_name(b: &Backend) -> Option<String> {
    match b.address {
        Address::Tcp(a) => Some(format!("{}:{}", a.ip(), a.port())),
        Address::Unix(_) => None,
    }
}

/// A string literal of SQL (quotes and backslashes escaped).
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn literals_are_quoted() {
        assert_eq!(super::quote(r"it's a\b"), r"'it\'s a\\b'");
    }
}

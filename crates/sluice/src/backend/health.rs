//! Health checks: every `interval` each backend is probed; `fall` failures in a row take it out
//! of rotation and `rise` successes in a row bring it back (HAProxy's semantics).
//!
//! With a monitor user the probe logs in, pings and quits, which no server logs. Without one it
//! reads the greeting and closes; MariaDB logs such a pre-authentication close as an aborted
//! connection, so a backend that served a session successfully since the last probe is counted
//! healthy without being probed at all (passive check), and only idle backends are probed.
//!
//! The monitor user also reads the backend's place in replication at each probe: `@@read_only`
//! (which makes a backend of role "auto" the primary or a replica), its GTID position and, for a
//! replica, its replication status and lag.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::replication;

use super::conn as bconn;
use super::manage::{Manage, error_message, replica_status_of};
use super::{Backend, Replication};
use crate::config::{HealthConfig, Live};

/// Starts the checks of every backend (tasks that run until the backend is retired). A replica
/// further behind than `routing.max_replica_lag` serves no reads. Each round reads the
/// configuration in force, so that a reload changes the checks.
pub fn spawn(backends: &[Arc<Backend>], config: &Arc<Live>) {
    for b in backends {
        let (b, config) = (b.clone(), config.clone());
        tokio::spawn(async move { check_loop(&b, &config).await });
    }
}

async fn check_loop(b: &Backend, config: &Live) {
    let mut every = Duration::ZERO;
    let mut metrics_asked = None;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        let c = config.get();
        let (cfg, max_lag) = (&c.health, c.routing.max_replica_lag);
        if cfg.interval != every {
            every = cfg.interval;
            ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        ticker.tick().await;
        if b.is_retired() {
            return;
        }
        let monitor = match (&cfg.user, &cfg.password) {
            (Some(u), p) => Some((u.clone(), p.clone().unwrap_or_default())),
            _ => None,
        };
        let now = crate::metrics::mono_ns() / 1_000_000;
        // (The latency-aware policy times every probe: none is skipped.)
        let timed = c.proxy.balance == crate::config::Policy::LeastLatency;
        let passive = !timed && b.is_up() && monitor.is_none() && b.activity.since_ms(now) < cfg.interval.as_millis() as u64;
        let began = Instant::now();
        let result = if passive { Ok(()) } else { probe(b, cfg, monitor.as_ref(), max_lag).await };
        if timed && result.is_ok() {
            b.load.add_rtt(began.elapsed());
        }
        if let Some(addr) = &b.status {
            status(b, addr, cfg.timeout).await;
            if timed && super::load::metrics_due(&mut metrics_asked, Instant::now()) {
                match super::tidb::metrics(addr, cfg.timeout).await {
                    Ok(text) => b.load.add_metrics(&text, Instant::now()),
                    Err(e) => tracing::debug!(backend = %b.name, error = %e, "no metrics from the status address"),
                }
            }
        }
        match result {
            // Sluice's own want of descriptors or memory says nothing of the backend.
            Err(Failure { reason, local: true, .. }) => {
                tracing::warn!(side = "sluice", backend = %b.name, error = %reason, "health check not made: the backend's state stays as it was");
            }
            r => apply(b, cfg, r),
        }
    }
}

pub use super::manage::Failure;

/// Reads a TiDB server's status address: one shutting down is kept out like a drained one
/// (the rebalancer moves its sessions off), and serves again once it answers 200.
async fn status(b: &Backend, addr: &str, timeout: Duration) {
    let closing = super::tidb::status_closing(addr, timeout).await;
    if b.set_closing(closing.is_some()) {
        match closing {
            Some(why) => {
                tracing::warn!(backend = %b.name, reason = %why, "backend is shutting down: no new session goes there, its sessions leave")
            }
            None => tracing::info!(backend = %b.name, "backend's status address answers again: it serves"),
        }
    }
}

/// One probe.
pub async fn probe(b: &Backend, cfg: &HealthConfig, monitor: Option<&(String, String)>, max_lag: Duration) -> Result<(), Failure> {
    let Some((user, password)) = monitor else {
        return greets(b, cfg.timeout).await;
    };
    let work = async {
        let epoch = b.assumed();
        let mut m = Manage::open(b, user, password, cfg.timeout).await?;
        m.ping().await?;
        let replication = Replication { epoch, ..observe(&mut m).await? };
        m.quit().await;
        if let Some(role) = b.observed(replication, max_lag) {
            tracing::warn!(backend = %b.name, address = %b.address, role = role.name(), "backend changed role");
        }
        Ok(())
    };
    match tokio::time::timeout(cfg.timeout + Duration::from_millis(100), work).await {
        Ok(r) => r,
        Err(_) => Err(Failure::of_backend(format!("no answer within {:?}", cfg.timeout))),
    }
}

/// Without a monitor user: whether the backend greets, and could serve a session (a backend
/// with backend_tls "on" that does not offer TLS cannot serve anyone).
async fn greets(b: &Backend, timeout: Duration) -> Result<(), Failure> {
    let (conn, g) = bconn::open(b, timeout, bconn::Origin::Sluice).await.map_err(Failure::of_open)?;
    drop(conn);
    b.tls.decide(true, &g).map_err(|e| Failure::of_backend(e.message))?;
    Ok(())
}

/// Reads the backend's place in replication on the monitor's connection. A server that cannot
/// say whether it is read-only fails the check; one whose replication status the monitor may not
/// read has an unknown lag.
async fn observe(m: &mut Manage) -> Result<Replication, Failure> {
    let server = m.query_raw(replication::SERVER_QUERY).await?;
    let role = match &server[..] {
        [_, _, _, _, row] => replication::server_role(row),
        _ => None,
    }
    .ok_or_else(|| Failure::of_backend(format!("unexpected answer to {}", String::from_utf8_lossy(replication::SERVER_QUERY))))?;
    let mut r = Replication {
        read_only: Some(role.read_only),
        gtid_binlog_pos: role.gtid_binlog_pos,
        gtid_current_pos: role.gtid_current_pos,
        ..Default::default()
    };
    let status = m.query_raw(replication::REPLICA_QUERY).await?;
    match status.first().map(|p| p.first()) {
        Some(Some(0xff)) => r.unreadable = Some(error_message(&status[0])),
        Some(_) => r.replica = replica_status_of(&status),
        None => {}
    }
    Ok(r)
}

/// Applies a probe result with rise/fall hysteresis.
pub fn apply(b: &Backend, cfg: &HealthConfig, result: Result<(), Failure>) {
    let mut h = b.health.lock();
    h.checks += 1;
    h.last_check = Some(Instant::now());
    match result {
        Ok(()) => {
            h.unanswered = false;
            h.consecutive_ok += 1;
            h.consecutive_fail = 0;
            if b.is_up() {
                h.reason = None;
            } else if h.consecutive_ok >= cfg.rise {
                b.set_up(true);
                h.reason = None;
                h.since = Instant::now();
                tracing::info!(backend = %b.name, address = %b.address, "backend is up again");
            }
        }
        Err(Failure { reason, unanswered, .. }) => {
            h.unanswered = unanswered;
            h.consecutive_fail += 1;
            h.consecutive_ok = 0;
            if b.is_up() && h.consecutive_fail >= cfg.fall {
                b.set_up(false);
                h.since = Instant::now();
                tracing::warn!(backend = %b.name, address = %b.address, reason = %reason, "backend is down: no new sessions go to it");
            }
            h.reason = Some(reason);
        }
    }
}

//! The control plane: the admin HTTP API (`admin`), the SQL admin (`sqladmin`), reloads,
//! upgrades, the etcd cluster, rebalancing; and here the operations they share: backends added,
//! drained, undrained and removed.

pub mod admin;
pub mod cluster;
pub mod failover;
pub mod rebalance;
pub mod reload;
pub mod sqladmin;
pub mod upgrade;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::backend::Backend;
use crate::config::BackendConfig;
use crate::ctx::Ctx;
use crate::metrics::MoveReason;

/// Adds a backend (its name must be new: checked by the caller) and starts its health checks.
pub fn add_backend(ctx: &Arc<Ctx>, c: &BackendConfig) -> Result<Arc<Backend>, crate::backend::SetupError> {
    c.check_names()?;
    let name = c.display_name();
    let config = ctx.config();
    if let Ok(a) = crate::config::parse_address(c.address.get_ref())
        && ctx.own.is_listener(&a)
    {
        let msg = format!("backend {name} at {a} is sluice's own listener: every login would connect to sluice again");
        return Err(crate::config::InvalidValue(msg).into());
    }
    let b = Backend::from_config(ctx.backends.next_index(), c, ctx.metrics.backend(&name), &config.proxy, config.lanes())?;
    let b = Arc::new(b.noting_to(ctx.own.clone()));
    ctx.backends.add(b.clone());
    crate::backend::health::spawn(std::slice::from_ref(&b), &ctx.config);
    tracing::info!(backend = %name, address = %b.address, "backend added");
    Ok(b)
}

/// Removes a backend: drains it, and takes it out once its sessions left (or, for those that
/// could not, once `drain_timeout` passed). Returns how many sessions were asked to move.
pub fn remove_backend(ctx: &Arc<Ctx>, b: &Arc<Backend>) -> usize {
    let asked = start_drain(ctx, b);
    let (ctx, b) = (ctx.clone(), b.clone());
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + ctx.config().proxy.drain_timeout + std::time::Duration::from_secs(1);
        while b.sessions.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        ctx.backends.remove(b.index);
        b.retire();
        ctx.metrics.remove_backend(&b.name);
        tracing::info!(backend = %b.name, sessions_left = b.sessions.load(Ordering::Relaxed), "backend removed");
    });
    asked
}

/// Marks `b` draining and asks its sessions to move; returns how many were asked.
pub fn start_drain(ctx: &Arc<Ctx>, b: &Arc<Backend>) -> usize {
    b.set_draining(true);
    let mut asked = 0;
    ctx.sessions.for_each(|h| {
        if h.backend_index.load(Ordering::Relaxed) as usize == b.index {
            h.ask_move(None, MoveReason::Drain);
            asked += 1;
        }
    });
    tracing::info!(backend = %b.name, sessions = asked, "draining backend");
    // Once drain_timeout passed, the sessions that could not move are woken to close.
    let (ctx, b) = (ctx.clone(), b.clone());
    tokio::spawn(async move {
        tokio::time::sleep(ctx.config().proxy.drain_timeout).await;
        if b.is_draining() {
            ctx.sessions.for_each(|h| {
                if h.backend_index.load(Ordering::Relaxed) as usize == b.index {
                    h.wake.notify();
                }
            });
        }
    });
    asked
}

/// Ends a drain: the backend takes new sessions again; moves not made yet are called off.
pub fn undrain(ctx: &Ctx, b: &Backend) {
    b.set_draining(false);
    ctx.sessions.for_each(|h| {
        if h.backend_index.load(Ordering::Relaxed) as usize == b.index {
            h.cancel_move(MoveReason::Drain);
        }
    });
}

//! Rebalancing: sessions move from the backends that hold more than their weighted share to
//! those that hold less, until each holds its share within one session. It runs on the control
//! thread once a second, so it follows a backend that joined, came back up or was undrained.
//! Moves are asked of the sessions (`SessionHandle::ask_move`) and made at their next safe
//! point; at most `rebalance_rate` per second per worker, and a session that moved is left
//! alone for `rebalance_interval`. Sessions sluice cannot move (passthrough) stay, but count.
//! The same pass follows a failover: sessions leave a backend that stopped being the primary.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::config::Role;
use crate::ctx::Ctx;
use crate::metrics::MoveReason;

/// Runs until the process ends.
pub async fn run(ctx: &Ctx) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if ctx.is_draining() {
            continue;
        }
        follow_roles(ctx);
        leave_closing(ctx);
        if ctx.backends.balancer.policy() == crate::config::Policy::LeastLatency && ctx.backends.refresh_load() {
            tracing::debug!("backends' balance factors changed");
        }
        let c = ctx.config.get();
        if c.proxy.rebalance {
            once(ctx, c.proxy.rebalance_rate as usize * c.lanes());
            ctx.metrics.rebalance_runs.inc();
        }
    }
}

/// After a failover: sessions on a backend that no longer serves as the primary (or that
/// failover fenced) move to the one that does, at their next safe point (all of them: a failover does not wait for a rate).
/// Split sessions choose at every statement and are left alone. Returns how many were asked.
pub fn follow_roles(ctx: &Ctx) -> usize {
    let list = ctx.backends.list();
    let replicas: Vec<u32> = list.iter().filter(|b| b.serves_as() == Role::Replica || b.is_fenced()).map(|b| b.index as u32).collect();
    // (Without replicas, or without a primary to go to, there is nothing to walk.)
    if replicas.is_empty() || !list.iter().any(|b| b.is_usable() && b.serves_as() == Role::Primary) {
        return 0;
    }
    let demoted = |i: u32| replicas.contains(&i);
    let mut asked = 0;
    for h in ctx.sessions.all() {
        let stays = h.split.load(Ordering::Relaxed) || h.move_asked() || !h.can_move.load(Ordering::Relaxed);
        if !stays && demoted(h.backend_index.load(Ordering::Relaxed)) {
            h.ask_move(None, MoveReason::Role);
            asked += 1;
        }
    }
    if asked > 0 {
        tracing::info!(moves = asked, "moving sessions off backends that no longer serve as the primary");
    }
    asked
}

/// Sessions on a backend that reports itself shutting down (a TiDB server's status address,
/// `backend::health`) move off at their next safe point, all of them, as from a drained one.
/// Returns how many were asked.
pub fn leave_closing(ctx: &Ctx) -> usize {
    let list = ctx.backends.list();
    let closing: Vec<u32> = list.iter().filter(|b| b.is_closing()).map(|b| b.index as u32).collect();
    if closing.is_empty() {
        return 0;
    }
    let mut asked = 0;
    for h in ctx.sessions.all() {
        let stays = h.move_asked() || !h.can_move.load(Ordering::Relaxed);
        if !stays && closing.contains(&h.backend_index.load(Ordering::Relaxed)) {
            h.ask_move(None, MoveReason::Drain);
            asked += 1;
        }
    }
    if asked > 0 {
        tracing::info!(moves = asked, "moving sessions off backends that are shutting down");
    }
    asked
}

/// Asks at most `budget` moves; returns how many it asked. Sessions are spread over the
/// backends serving as the primary (split sessions route each statement and are left alone).
pub fn once(ctx: &Ctx, budget: usize) -> usize {
    let list = ctx.backends.list();
    let usable: Vec<_> = list.iter().filter(|b| b.is_usable() && b.serves_as() == Role::Primary).collect();
    if usable.len() < 2 || budget == 0 {
        return 0;
    }
    // Sessions per backend as they will be once the moves already asked are made.
    let mut count: Vec<i64> = usable.iter().map(|b| b.sessions.load(Ordering::Relaxed) as i64).collect();
    let slot = |index: usize| usable.iter().position(|b| b.index == index);
    let now_ms = crate::metrics::mono_ns() / 1_000_000;
    let interval_ms = ctx.config().proxy.rebalance_interval.as_millis() as u64;
    let mut candidates: Vec<(usize, std::sync::Arc<crate::session::SessionHandle>)> = Vec::new();
    for h in ctx.sessions.all() {
        let Some(at) = slot(h.backend_index.load(Ordering::Relaxed) as usize) else { continue };
        if h.split.load(Ordering::Relaxed) {
            continue;
        }
        let can_move = h.can_move.load(Ordering::Relaxed);
        if !can_move && h.move_reason() == Some(MoveReason::Rebalance) {
            // Pinned since it was asked: another session goes instead.
            h.cancel_move(MoveReason::Rebalance);
        }
        if let Some(to) = h.move_target().and_then(slot) {
            count[at] -= 1;
            count[to] += 1;
            continue;
        }
        let moved = h.moved_at_ms.load(Ordering::Relaxed);
        let rested = moved == 0 || now_ms.saturating_sub(moved) >= interval_ms;
        if can_move && !h.move_asked() && rested {
            candidates.push((at, h));
        }
    }
    let total: i64 = count.iter().sum();
    // (Weights per mille: the latency-aware policy scales them by what backends report.)
    let policy = ctx.backends.balancer.policy();
    let weight = |i: usize| usable[i].balance_weight(policy) as i64;
    let weights: i64 = (0..usable.len()).map(weight).sum();
    // A backend's share, in sessions times the total weight (no rounding).
    let excess = |i: usize, count: &[i64]| count[i] * weights - total * weight(i);
    let mut asked = 0;
    while asked < budget {
        // The most loaded and the least loaded, by share.
        let from = (0..usable.len()).max_by_key(|&i| excess(i, &count)).unwrap_or(0);
        let to = (0..usable.len()).min_by_key(|&i| excess(i, &count)).unwrap_or(0);
        // A move takes one session from one and gives it to the other: worth it while they
        // are more than one session apart from their shares.
        if excess(from, &count) - excess(to, &count) <= weights {
            break;
        }
        let Some(pos) = candidates.iter().position(|(at, _)| *at == from) else { break };
        let (_, h) = candidates.swap_remove(pos);
        h.ask_move(Some(usable[to].index), MoveReason::Rebalance);
        count[from] -= 1;
        count[to] += 1;
        asked += 1;
    }
    if asked > 0 {
        tracing::info!(moves = asked, "rebalancing sessions");
    }
    asked
}

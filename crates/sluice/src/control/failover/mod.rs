//! Failover, switchover and rejoin (`[failover]`), on the control thread.
//!
//! Each health interval the loop looks at what the health checks read (with the monitor user):
//! - The primary is the one writable backend (once known, sluice keeps it until it promotes
//!   another). While it is up, its GTID position is noted: a failover must not lose what
//!   sluice saw committed there.
//! - Another writable backend is fenced: no session goes there until it is rejoined.
//! - A primary down for `after` (in failed checks) is replaced (`enabled = true`): the
//!   replicas are read afresh, one is chosen ([`choose`]), it applies what it received and is
//!   made writable, and the other replicas replicate from it. The old primary is fenced. A
//!   promotion that would lose transactions, or with replicas that disagree, or with the old
//!   primary still answering sluice, is refused (and said once, until the reason changes).
//! - A fenced server that is up is rejoined: made a replica of the primary when what it has
//!   applied is a prefix of the primary's log, else kept out as diverged, its extra
//!   transactions named. A replica still following a former primary is pointed at the new one.
//!
//! A switchover ([`switchover`], asked through the admin API) makes the primary read-only,
//! lets the chosen replica catch up, promotes it and makes the old primary its replica.

mod choose;
mod follow;
pub mod marks;
mod steps;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::gtid::{Position, describe};

use crate::backend::manage::Manage;
use crate::backend::topology::Event;
use crate::backend::{Backend, Fence, FenceKind};
use crate::config::{Config, Role};
use crate::ctx::Ctx;
use steps::Seen;

/// Runs until the process ends.
pub async fn run(ctx: &Ctx) {
    ctx.backends.topology.set_strict(ctx.config().failover.enabled);
    let mut table = marks::CommitTable::default();
    loop {
        let c = ctx.config();
        ctx.backends.topology.set_strict(c.failover.enabled);
        tokio::time::sleep(c.health.interval.max(Duration::from_millis(50))).await;
        if !c.failover.manages() || ctx.is_draining() {
            continue;
        }
        if !acts(ctx, &c) {
            follow::tick(ctx, &c);
            continue;
        }
        // (A switchover asked through the admin API holds it: this pass is skipped.)
        let Ok(_busy) = ctx.backends.topology.busy.try_lock() else { continue };
        tick(ctx, &c, &mut table).await;
    }
}

/// Whether this instance acts on the topology: always when alone; with `[cluster]`, while it
/// holds the failover lease.
fn acts(ctx: &Ctx, c: &Config) -> bool {
    c.cluster.etcd.is_empty() || ctx.backends.topology.leads()
}

async fn tick(ctx: &Ctx, c: &Config, table: &mut marks::CommitTable) {
    let list: Vec<Arc<Backend>> = ctx.backends.list().iter().cloned().collect();
    give_up_replaced(ctx, &list);
    let Some(primary) = known_primary(ctx, &list) else { return };
    let topo = &ctx.backends.topology;
    if primary.is_up() {
        if topo.is_held() {
            topo.release();
        }
        if let Some(pos) = Position::parse(&primary.replication.lock().gtid_binlog_pos) {
            ctx.backends.topology.saw(pos);
        }
        fence_writable(&list, &primary);
        if c.failover.rejoin {
            rejoin_all(ctx, c, &list, &primary).await;
        }
        table.tend(c, &primary).await;
    } else if c.failover.enabled {
        // Sessions hold their next command until a replica is promoted (or that is refused).
        topo.hold();
        if primary.health.lock().consecutive_fail >= c.failover.failed_checks(&c.health) {
            failover(ctx, c, &list, &primary).await;
            topo.release();
        }
    }
}

/// Ends the response waits on the servers a failover replaced: a hung one may never answer,
/// and the sessions waiting there replay their transaction at the new primary.
fn give_up_replaced(ctx: &Ctx, list: &[Arc<Backend>]) {
    for b in list.iter().filter(|b| b.fence().is_some_and(|f| f.kind == FenceKind::Replaced)) {
        let n = crate::session::deadline::abandon(&ctx.sessions, b.index);
        if n > 0 {
            tracing::warn!(backend = %b.name, sessions = n, "failover: gave up waiting for the replaced primary's answers");
        }
    }
}

/// The backend sluice knows as the primary; the first time, the one writable backend, or the
/// lost one the replicas name ([`lost_source`]); None while there is none, or more than one.
fn known_primary(ctx: &Ctx, list: &[Arc<Backend>]) -> Option<Arc<Backend>> {
    let topo = &ctx.backends.topology;
    if let Some(i) = topo.primary() {
        return list.iter().find(|b| b.index == i).cloned();
    }
    let writable: Vec<&Arc<Backend>> =
        list.iter().filter(|b| b.is_up() && !b.is_fenced() && b.replication.lock().read_only == Some(false)).collect();
    if let [p] = writable[..] {
        topo.set_primary(p.index);
        tracing::info!(backend = %p.name, "failover: the primary is the one writable backend");
        return Some(p.clone());
    }
    let p = lost_source(list)?;
    topo.set_primary(p.index);
    tracing::warn!(backend = %p.name, "failover: no backend is writable, and every replica replicates from this one, which is down: it is the primary");
    Some(p)
}

/// A sluice started after the primary was lost finds no writable backend: the primary is then
/// the backend every replica that is up names as its source, when that one is down.
fn lost_source(list: &[Arc<Backend>]) -> Option<Arc<Backend>> {
    let mut source: Option<String> = None;
    for b in list.iter().filter(|b| b.is_up()) {
        let r = b.replication.lock();
        // (Any up backend not read as a read-only replica: no inference.)
        let named = &r.replica.as_ref().filter(|_| r.read_only == Some(true))?.source;
        match &source {
            Some(s) if s != named => return None,
            Some(_) => {}
            None => source = Some(named.clone()),
        }
    }
    let source = source?;
    list.iter().find(|b| !b.is_up() && !b.is_fenced() && steps::source_name(b).as_ref() == Some(&source)).cloned()
}

/// Fences every other writable backend: two writable servers would diverge.
fn fence_writable(list: &[Arc<Backend>], primary: &Backend) {
    for b in list.iter().filter(|b| b.index != primary.index && b.is_up() && !b.is_fenced()) {
        if b.replication.lock().read_only == Some(false) {
            let reason = format!("writable, but {} is the primary: kept out until it is rejoined as its replica", primary.name);
            tracing::warn!(backend = %b.name, "{reason}");
            b.set_fence(Some(fence(FenceKind::Writable, reason)));
        }
    }
}

fn fence(kind: FenceKind, reason: String) -> Fence {
    Fence { kind, reason, since: std::time::SystemTime::now() }
}

/// Records an operation's outcome: logged and counted unless it repeats the refusal before.
fn record(ctx: &Ctx, started: Instant, operation: &'static str, result: &'static str, backend: Option<&Backend>, message: String) {
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let backend = backend.map(|b| b.name.clone());
    let e =
        Event { at, operation, result, backend: backend.clone(), message: message.clone(), took_ms: started.elapsed().as_millis() as u64 };
    if !ctx.backends.topology.record(e) {
        return;
    }
    ctx.metrics.cluster_operation(operation, result);
    let backend = backend.unwrap_or_default();
    match result {
        "done" => tracing::warn!(operation, backend, "{message}"),
        _ => tracing::error!(operation, result, backend, "{message}"),
    }
}

/// A replica as read just before a failover or switchover, with the connection to act on it.
struct Replica {
    b: Arc<Backend>,
    m: Option<Manage>,
    seen: Seen,
    candidate: choose::Candidate,
}

/// Reads every up, unfenced backend but `except`, as failover's user.
async fn read_replicas(c: &Config, list: &[Arc<Backend>], except: &Backend) -> Vec<Replica> {
    let mut out = Vec::new();
    for b in list.iter().filter(|b| b.index != except.index && b.is_up() && !b.is_fenced()) {
        let read = async {
            let mut m = steps::connect(b, &c.failover, c.health.timeout).await?;
            let seen = steps::observe(&mut m).await?;
            Ok::<_, crate::backend::manage::Failure>((m, seen))
        };
        let (m, seen, out_why) = match read.await {
            Ok((m, seen)) => {
                let why = match &seen.replica {
                    _ if !b.candidate => Some("candidate = false".to_string()),
                    None => Some("it replicates from nobody".to_string()),
                    Some(r) if r.delay > 0 => Some(format!("a delayed replica (SQL_Delay {} s)", r.delay)),
                    Some(_) => None,
                };
                (Some(m), seen, why)
            }
            Err(e) => (None, Seen::default(), Some(format!("unreadable: {e}"))),
        };
        let candidate = choose::Candidate {
            name: b.name.clone(),
            out: out_why,
            priority: b.priority,
            received: seen.received.clone(),
            applied: seen.applied.clone(),
        };
        out.push(Replica { b: b.clone(), m, seen, candidate });
    }
    out
}

/// Replaces a lost primary.
async fn failover(ctx: &Ctx, c: &Config, list: &[Arc<Backend>], old: &Arc<Backend>) {
    let started = Instant::now();
    let (failed, unanswered) = {
        let h = old.health.lock();
        (h.consecutive_fail, h.unanswered)
    };
    // Whether the old primary still answers sluice's connections, when its checks failed for
    // another reason (when they went unanswered, they said so already); read together with the
    // replicas: against a hung server it takes the whole timeout.
    let answers = async {
        match unanswered {
            true => false,
            false => crate::backend::conn::open(old, c.health.timeout, crate::backend::conn::Origin::Sluice).await.is_ok(),
        }
    };
    let (answers, mut replicas) = tokio::join!(answers, read_replicas(c, list, old));
    if answers {
        let why = format!("{} fails its checks ({}) but still answers sluice's connections: not promoting", old.name, old.out_reason());
        return record(ctx, started, "failover", "refused", Some(old), why);
    }
    let candidates: Vec<choose::Candidate> = replicas.iter().map(|r| r.candidate.clone()).collect();
    let chosen = match choose::choose(&ctx.backends.topology.last_seen(), &candidates) {
        Ok(i) => i,
        Err(refusal) => return record(ctx, started, "failover", "refused", Some(old), refusal.to_string()),
    };
    let new = replicas[chosen].b.clone();
    let received = replicas[chosen].seen.received.clone();
    let Some(mut m) = replicas[chosen].m.take() else { return };
    if let Err(e) = steps::take_over(&mut m, &received, c.failover.catch_up_timeout).await {
        return record(ctx, started, "failover", "failed", Some(&new), format!("promoting {}: {e}", new.name));
    }
    let reason = format!("the primary until a failover promoted {}: it rejoins as a replica when it returns", new.name);
    old.set_fence(Some(fence(FenceKind::Replaced, reason)));
    new.assume(Role::Primary);
    ctx.backends.topology.promoted(new.index, received.clone());
    crate::control::rebalance::follow_roles(ctx);
    give_up_replaced(ctx, list);
    // Sessions go on at the new primary while it forgets its source (stopping replication from
    // a hung primary takes seconds) and the other replicas are pointed at it.
    ctx.backends.topology.release();
    let patience = c.failover.catch_up_timeout;
    let (forgot, following) = tokio::join!(steps::forget_source(&mut m, patience), repoint(&mut replicas, &new, patience));
    m.quit().await;
    let forgot = match forgot {
        Ok(()) => String::new(),
        Err(e) => format!("; its replication could not be reset ({e}): RESET SLAVE ALL there by hand"),
    };
    let msg = format!("{} promoted after {} failed {failed} checks (it had received {received}){forgot}; {following}", new.name, old.name);
    record(ctx, started, "failover", "done", Some(&new), msg);
}

/// Points every replica but `new` at it, all at once (each may take `patience` to stop
/// replicating from a hung primary); says which follow it and which could not be made to.
async fn repoint(replicas: &mut [Replica], new: &Arc<Backend>, patience: Duration) -> String {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    let mut set = tokio::task::JoinSet::new();
    for r in replicas.iter_mut() {
        let m = r.m.take();
        if r.b.index == new.index {
            if let Some(m) = m {
                m.quit().await;
            }
            continue;
        }
        let Some(mut m) = m else {
            failed.push(format!("{} (unreadable)", r.b.name));
            continue;
        };
        let (new, name) = (new.clone(), r.b.name.clone());
        set.spawn(async move {
            let done = steps::follow(&mut m, &new, None, false, patience).await;
            m.quit().await;
            (name, done)
        });
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((name, Ok(()))) => ok.push(name),
            Ok((name, Err(e))) => failed.push(format!("{name} ({e})")),
            Err(e) => failed.push(format!("a replica's task ended: {e}")),
        }
    }
    ok.sort();
    failed.sort();
    let mut s = format!("replicas following it: {}", if ok.is_empty() { "none".into() } else { ok.join(", ") });
    if !failed.is_empty() {
        s += &format!("; not following it: {}", failed.join(", "));
    }
    s
}

/// Rejoins fenced servers that are up, and points replicas still following a former primary
/// at the primary.
async fn rejoin_all(ctx: &Ctx, c: &Config, list: &[Arc<Backend>], primary: &Arc<Backend>) {
    let primary_at = steps::source_name(primary);
    for b in list.iter().filter(|b| b.index != primary.index && b.is_up()) {
        let follows_another = {
            let r = b.replication.lock();
            let source = r.replica.as_ref().map(|s| s.source.clone());
            source.is_some_and(|s| Some(&s) != primary_at.as_ref() && list.iter().any(|o| steps::source_name(o).as_ref() == Some(&s)))
        };
        if b.is_fenced() || follows_another {
            rejoin(ctx, c, b, primary).await;
        }
    }
}

/// Makes `b` a replica of `primary` when what it applied is a prefix of the primary's log;
/// else fences it as diverged.
async fn rejoin(ctx: &Ctx, c: &Config, b: &Arc<Backend>, primary: &Arc<Backend>) {
    let started = Instant::now();
    let read = async {
        let mut pm = steps::connect(primary, &c.failover, c.health.timeout).await?;
        let p = steps::observe(&mut pm).await?;
        pm.quit().await;
        let mut m = steps::connect(b, &c.failover, c.health.timeout).await?;
        let seen = steps::observe(&mut m).await?;
        Ok::<_, crate::backend::manage::Failure>((p.logged, m, seen))
    };
    let (primary_log, mut m, seen) = match read.await {
        Ok(r) => r,
        Err(e) => return record(ctx, started, "rejoin", "failed", Some(b), format!("reading {} and {}: {e}", b.name, primary.name)),
    };
    let extra = beyond_history(&seen.applied, &primary_log, ctx.backends.topology.history().as_ref());
    if !extra.is_empty() {
        m.quit().await;
        let why = format!("diverged: it has transactions the primary {} lacks: {}", primary.name, describe(&extra));
        b.set_fence(Some(fence(FenceKind::Diverged, why.clone())));
        return record(ctx, started, "rejoin", "diverged", Some(b), why);
    }
    // A server that replicated from nobody (a former primary) gets the replication account,
    // and its own transactions count as replicated.
    let alone = seen.replica.is_none();
    let account = alone.then(|| c.failover.replication_account());
    let done = steps::follow(&mut m, primary, account, alone, c.failover.catch_up_timeout).await;
    m.quit().await;
    if let Err(e) = done {
        return record(ctx, started, "rejoin", "failed", Some(b), format!("making {} a replica of {}: {e}", b.name, primary.name));
    }
    b.assume(Role::Replica);
    b.set_fence(None);
    let msg = format!("{} replicates from {} (it had applied {})", b.name, primary.name, seen.applied);
    record(ctx, started, "rejoin", "done", Some(b), msg);
}

/// What a server applied that is not in the primary's history: past the primary's log in a
/// domain, or, in a domain whose last transaction another server wrote, past what the
/// primary held of its predecessor's log when it was promoted (`history`). Sequence numbers
/// alone cannot tell: a new primary that wrote more has larger ones than a diverged old one.
fn beyond_history(applied: &Position, log: &Position, history: Option<&Position>) -> Vec<sluice_proto::gtid::Beyond> {
    let mut out = applied.beyond(log);
    if let (true, Some(h)) = (out.is_empty(), history) {
        for g in applied.gtids() {
            if log.get(g.domain).is_some_and(|p| p.server != g.server) {
                out.extend(applied.only(g.domain).beyond(h));
            }
        }
    }
    out
}

/// Why a switchover was not made, and whose doing: the request's (`Refused`: nothing was
/// changed, and the same request would be refused again), or a server's (`Failed`: a step
/// failed; the old primary takes writes again unless the message says otherwise).
#[derive(Debug, thiserror::Error)]
pub enum SwitchoverError {
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
}

/// Makes `to` the primary (the admin API's switchover): the primary is made read-only, `to`
/// applies everything it logged, is promoted, and the old primary becomes its replica.
pub async fn switchover(ctx: &Ctx, to: &str) -> Result<String, SwitchoverError> {
    let c = ctx.config();
    if !c.failover.manages() {
        return Err(SwitchoverError::Refused("switchover needs [failover] user and password".into()));
    }
    if !acts(ctx, &c) {
        let leader = ctx.backends.topology.lead().leader.unwrap_or_else(|| "no instance (none is elected yet)".into());
        return Err(SwitchoverError::Refused(format!("this instance does not act on failovers: {leader} does; ask it")));
    }
    let _busy = ctx.backends.topology.busy.lock().await;
    let started = Instant::now();
    let list: Vec<Arc<Backend>> = ctx.backends.list().iter().cloned().collect();
    let refuse = |why: String| {
        record(ctx, started, "switchover", "refused", None, why.clone());
        Err(SwitchoverError::Refused(why))
    };
    let Some(new) = list.iter().find(|b| b.name == to).cloned() else { return refuse(format!("no backend is named {to:?}")) };
    let Some(old) = known_primary(ctx, &list) else { return refuse("no primary is known".into()) };
    if old.index == new.index {
        return refuse(format!("{to} is the primary already"));
    }
    if let Some(why) =
        old.why_unusable().or_else(|| new.why_unusable()).or_else(|| (!new.candidate).then(|| format!("{to} has candidate = false")))
    {
        return refuse(why);
    }
    // Sessions hold their next command; those running a command or a transaction finish it.
    let topo = &ctx.backends.topology;
    topo.hold();
    let busy = quiet(ctx, c.failover.hold_timeout).await;
    if !busy.is_empty() {
        tracing::warn!(sessions = ?busy, "switchover: sessions still in a transaction go on; their next writes may fail");
    }
    let switched = switch(ctx, &c, &list, &old, &new).await;
    topo.release();
    match switched {
        Ok(msg) => {
            record(ctx, started, "switchover", "done", Some(&new), msg.clone());
            Ok(msg)
        }
        Err(e) => {
            record(ctx, started, "switchover", "failed", Some(&new), e.to_string());
            Err(e)
        }
    }
}

/// Waits (at most `limit`) until no users-mode session runs a command or a transaction
/// outside the hold; the sessions that still do.
async fn quiet(ctx: &Ctx, limit: Duration) -> Vec<u32> {
    use std::sync::atomic::Ordering;
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let mut busy = Vec::new();
        ctx.sessions.for_each(|h| {
            let in_trans = h.status.load(Ordering::Relaxed) & sluice_proto::consts::status::IN_TRANS != 0;
            let running = !h.gated.load(Ordering::Relaxed) && (h.busy.load(Ordering::Relaxed) || in_trans);
            if running && !h.info.lock().state.passthrough {
                busy.push(h.id);
            }
        });
        if busy.is_empty() || tokio::time::Instant::now() >= deadline {
            return busy;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn switch(ctx: &Ctx, c: &Config, list: &[Arc<Backend>], old: &Arc<Backend>, new: &Arc<Backend>) -> Result<String, SwitchoverError> {
    let timeout = c.health.timeout;
    let failed = |b: &Backend, e: crate::backend::manage::Failure| SwitchoverError::Failed(format!("{}: {e}", b.name));
    let mut om = steps::connect(old, &c.failover, timeout).await.map_err(|e| failed(old, e))?;
    let mut replicas = read_replicas(c, list, old).await;
    let Some(ni) = replicas.iter().position(|r| r.b.index == new.index && r.m.is_some()) else {
        return Err(SwitchoverError::Failed(format!("{} could not be read", new.name)));
    };
    om.query("SET GLOBAL read_only = 1").await.map_err(|e| failed(old, e))?;
    let catch_up = async {
        let pos = steps::observe(&mut om).await?.logged;
        let m = replicas[ni].m.as_mut().expect("read");
        steps::wait_for(m, &pos, c.failover.catch_up_timeout).await?;
        steps::promote(m, &Position::default(), c.failover.catch_up_timeout).await?;
        Ok::<_, crate::backend::manage::Failure>(pos)
    };
    let pos = match catch_up.await {
        Ok(pos) => pos,
        Err(e) => {
            // The old primary takes writes again.
            let undone = om.query("SET GLOBAL read_only = 0").await;
            let undone = if undone.is_ok() { "it is writable again" } else { "it could not be made writable again" };
            return Err(SwitchoverError::Failed(format!("{} did not take over: {e} ({} {undone})", new.name, old.name)));
        }
    };
    new.assume(Role::Primary);
    old.assume(Role::Replica);
    ctx.backends.topology.promoted(new.index, pos.clone());
    crate::control::rebalance::follow_roles(ctx);
    let demoted = steps::follow(&mut om, new, Some(c.failover.replication_account()), true, c.failover.catch_up_timeout).await;
    om.quit().await;
    let following = repoint(&mut replicas, new, c.failover.catch_up_timeout).await;
    let old_state = match demoted {
        Ok(()) => format!("{} replicates from it", old.name),
        Err(e) => {
            let why = format!("the primary until a switchover; making it a replica failed: {e}");
            old.set_fence(Some(fence(FenceKind::Replaced, why.clone())));
            why
        }
    };
    Ok(format!("{} is the primary (at {pos}); {old_state}; {following}", new.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Position {
        Position::parse(s).unwrap()
    }

    #[test]
    fn a_server_is_in_the_primarys_history_up_to_the_promotion() {
        // The old primary had 0-1-10 when a replica holding all of it was promoted; the new
        // primary wrote 0-2-15 since.
        let history = p("0-1-10");
        assert!(beyond_history(&p("0-1-10"), &p("0-2-15"), Some(&history)).is_empty());
        assert!(beyond_history(&p("0-1-8"), &p("0-2-15"), Some(&history)).is_empty());
        // Two more of its own after the promotion: diverged, though 12 < 15.
        let extra = beyond_history(&p("0-1-12"), &p("0-2-15"), Some(&history));
        assert_eq!(describe(&extra), "0-*-11..0-1-12 (2 transactions)");
        // Past the primary's log in a domain, with or without a history.
        assert_eq!(describe(&beyond_history(&p("0-1-17"), &p("0-2-15"), None)), "0-*-16..0-1-17 (2 transactions)");
        // The same server's transactions are one history.
        assert!(beyond_history(&p("0-2-14"), &p("0-2-15"), Some(&history)).is_empty());
    }
}

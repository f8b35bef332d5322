//! Backends: their addresses, health state and load, and connecting to them.

pub mod balance;
pub mod checkout;
pub mod conn;
pub mod health;
pub mod link;
pub mod load;
pub mod manage;
pub mod mirror;
pub mod pool;
pub mod restore;
pub mod shared;
pub mod tidb;
mod tls;
pub mod topology;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use crate::config::{Address, BackendConfig, ProxyConfig, Role, parse_address};
use crate::metrics::BackendMetrics;
use crate::net::PacketConn;

pub use tls::BackendTls;

/// Why a backend cannot be set up from its configuration (the fault of whoever configured it).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Its name, group, address or TLS settings cannot be used.
    #[error(transparent)]
    Invalid(#[from] crate::config::InvalidValue),
    /// Its CA file cannot be read.
    #[error(transparent)]
    Pem(#[from] crate::config::PemError),
    /// A certificate of its CA file is not one rustls takes.
    #[error("{}: {source}", path.display())]
    Ca { path: std::path::PathBuf, source: rustls::Error },
    #[error("TLS: {0}")]
    Tls(rustls::Error),
}
/// What the last greeting told about a backend.
#[derive(Debug, Clone, Default)]
pub struct ServerInfo {
    pub version: Vec<u8>,
    pub capabilities: u32,
    pub mariadb_capabilities: u32,
    pub collation: u8,
}

/// Health bookkeeping, changed by the health checker.
#[derive(Debug, Clone)]
pub struct HealthState {
    /// Why the backend is out, or the last check's failure while it is still in.
    pub reason: Option<String>,
    pub consecutive_ok: u32,
    pub consecutive_fail: u32,
    pub checks: u64,
    pub since: Instant,
    pub last_check: Option<Instant>,
    /// The last check failed before the backend greeted (refused, or no answer).
    pub unanswered: bool,
}

/// What the health checks last read of a backend's place in replication (with a monitor user).
#[derive(Debug, Clone, Default)]
pub struct Replication {
    /// `@@read_only` (None: not read yet, or no monitor user).
    pub read_only: Option<bool>,
    /// `@@gtid_binlog_pos`: the last transaction in its own binary log.
    pub gtid_binlog_pos: String,
    /// `@@gtid_current_pos`: the last transaction it applied (its own, or replicated).
    pub gtid_current_pos: String,
    /// How it replicates, when it does (None: from nobody, or unreadable).
    pub replica: Option<sluice_proto::replication::ReplicaStatus>,
    /// Why its replication status could not be read (the monitor user lacks `SLAVE MONITOR`).
    pub unreadable: Option<String>,
    /// Why, as a replica, it serves no reads of the split (lag, replication stopped).
    pub reads_out: Option<String>,
    /// The backend's [`Backend::assumed`] count when the check began: a check that began
    /// before a promotion or demotion does not undo it.
    pub epoch: u64,
}

impl Replication {
    /// Why a replica in this state should serve no reads: it does not replicate, or lags more
    /// than `max_lag` (zero: no bound). A status the monitor may not read does not count.
    fn why_no_reads(&self, max_lag: std::time::Duration) -> Option<String> {
        if self.unreadable.is_some() {
            return None;
        }
        let Some(s) = &self.replica else { return Some("it replicates from nobody".into()) };
        if !s.running {
            let error = if s.last_error.is_empty() { String::new() } else { format!(": {}", s.last_error) };
            return Some(format!("replication stopped{error}"));
        }
        match s.seconds_behind {
            None => Some("lag unknown (Seconds_Behind_Master is NULL)".into()),
            Some(l) if !max_lag.is_zero() && l > max_lag.as_secs() => {
                Some(format!("{l} s behind its primary (max_replica_lag {} s)", max_lag.as_secs()))
            }
            Some(_) => None,
        }
    }
}

/// Why sluice's failover keeps a backend out of service until it is rejoined.
#[derive(Debug, Clone)]
pub struct Fence {
    pub kind: FenceKind,
    pub reason: String,
    pub since: std::time::SystemTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceKind {
    /// A primary that a failover replaced: it must not take writes when it returns.
    Replaced,
    /// A writable server that is not the primary (two writable servers would diverge).
    Writable,
    /// It holds transactions the primary lacks: it cannot replicate from it.
    Diverged,
}

/// When a backend last served traffic successfully (passive health): milliseconds of the
/// monotonic clock ([`crate::metrics::mono_ns`] / 10^6).
pub struct Activity {
    last_ok_ms: AtomicU64,
}

impl Activity {
    /// Counted from `now_ms`, as if the backend had just served: health checks start passive,
    /// as they did when this clock began with the process.
    pub fn since(now_ms: u64) -> Activity {
        Activity { last_ok_ms: AtomicU64::new(now_ms) }
    }

    /// Records success at `now_ms` (cheap: stores only when the stored value is stale).
    #[inline]
    pub fn record(&self, now_ms: u64) {
        if now_ms.saturating_sub(self.last_ok_ms.load(Ordering::Relaxed)) > 100 {
            self.last_ok_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    pub fn since_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.last_ok_ms.load(Ordering::Relaxed))
    }
}

pub struct Backend {
    /// Sluice's own addresses: connections to this backend note theirs (`net::Own`).
    pub own: Arc<crate::net::Own>,
    pub index: usize,
    pub name: String,
    pub address: Address,
    /// Its share of sessions, relative to the others (changed through the admin API).
    weight: AtomicU32,
    /// When and how sluice's connections to this backend use TLS.
    pub tls: BackendTls,
    /// Its configured part in replication.
    pub role: Role,
    /// A failover may promote it; among equally advanced replicas, the highest priority wins.
    pub candidate: bool,
    pub priority: u32,
    /// Connections to it begin with a PROXY protocol header of this version.
    pub send_proxy: Option<crate::config::SendProxy>,
    /// The part it plays now (a [`Role`] as u8: never `Auto`).
    serving: AtomicU8,
    /// As a replica, it may serve the split's reads (lag and replication as last read).
    reads_ok: AtomicBool,
    pub replication: Mutex<Replication>,
    /// Bound on connecting (TCP and greeting) and on each login exchange after it
    /// (`proxy.connect_timeout`): authentication, COM_CHANGE_USER, session set-up and restore.
    pub connect_timeout: std::time::Duration,
    up: AtomicBool,
    /// Drained: no new session comes here and every session leaves at its next safe point.
    draining: AtomicBool,
    /// A TiDB server's status address (`tidb.rs`), read by each health check.
    pub status: Option<String>,
    /// Its status address says it is shutting down (or does not answer): like a drain.
    closing: AtomicBool,
    /// What the latency-aware policy weighs (`load.rs`).
    pub load: load::Readings,
    /// When the drain began (milliseconds of [`crate::metrics::mono_ns`]).
    drain_since_ms: AtomicU64,
    /// Removed at run time: its health checks stop.
    retired: AtomicBool,
    /// Kept out of service by failover ([`Fence`]).
    fenced: AtomicBool,
    /// See [`Backend::assumed`].
    assumed: AtomicU64,
    fence: Mutex<Option<Fence>>,
    /// Told when failover replaced the backend ([`Backend::until_replaced`]).
    replaced: tokio::sync::Notify,
    /// Client sessions currently bound to this backend.
    pub sessions: AtomicUsize,
    pub metrics: BackendMetrics,
    /// When the backend last served traffic (passive health).
    pub activity: Activity,
    pub health: Mutex<HealthState>,
    pub info: Mutex<Option<ServerInfo>>,
    /// What a session's own settings track on this server until it changes them (its
    /// `session_track_*` defaults, read at each users-mode login that set up tracking).
    pub tracking: Mutex<Option<sluice_proto::basic::Tracked>>,
    /// How a new session's `sql_mode` on this server has quoted text read (read with
    /// `tracking`).
    pub lex_default: Mutex<Option<sluice_proto::lexer::Mode>>,
    /// Idle logged-in connections kept for reuse.
    pool: pool::Pool,
    /// Connections multiplexed sessions share, and the cap on connections to this backend.
    pub shared: Arc<shared::Lanes>,
}

impl Backend {
    /// The part the backend plays now: its configured role, or with "auto" what it last said
    /// (the primary until it says it is read-only).
    pub fn serves_as(&self) -> Role {
        if self.serving.load(Ordering::Relaxed) == Role::Replica as u8 { Role::Replica } else { Role::Primary }
    }

    /// A replica that may serve the split's reads now: up, not draining, replicating within
    /// `max_replica_lag` as the health checks last read it.
    #[inline]
    pub fn fit_for_reads(&self) -> bool {
        self.is_usable() && self.serving.load(Ordering::Relaxed) == Role::Replica as u8 && self.reads_ok.load(Ordering::Relaxed)
    }

    /// Records what the health checks read (a replica lagging more than `max_lag` serves no
    /// reads); returns the part it plays now when that changed. A check that began before
    /// failover set the backend's role is dropped.
    pub fn observed(&self, mut r: Replication, max_lag: std::time::Duration) -> Option<Role> {
        if r.epoch != self.assumed() {
            return None; // read before failover changed its role: stale
        }
        let role = match (self.role, r.read_only) {
            (Role::Auto, Some(true)) => Role::Replica,
            (Role::Auto, _) => Role::Primary,
            (configured, _) => configured,
        };
        let lag = r.replica.as_ref().and_then(|s| s.seconds_behind);
        self.metrics.replica_lag.set(lag.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX)));
        self.metrics.primary.set(i64::from(role == Role::Primary));
        r.reads_out = if role == Role::Replica { r.why_no_reads(max_lag) } else { None };
        let reads_ok = r.reads_out.is_none();
        if reads_ok != self.reads_ok.swap(reads_ok, Ordering::Relaxed) && role == Role::Replica {
            match &r.reads_out {
                Some(why) => tracing::warn!(backend = %self.name, reason = %why, "replica serves no reads"),
                None => tracing::info!(backend = %self.name, "replica serves reads again"),
            }
        }
        self.metrics.serving_reads.set(i64::from(role == Role::Replica && reads_ok));
        *self.replication.lock() = r;
        let before = self.serving.swap(role as u8, Ordering::Relaxed);
        (before != role as u8).then_some(role)
    }

    /// The backend, its connections noting their local addresses in `own`.
    pub fn noting_to(mut self, own: Arc<crate::net::Own>) -> Backend {
        self.own = own;
        self
    }

    /// `lanes`: how many workers own connections apart ([`crate::config::Config::lanes`]).
    pub fn from_config(
        index: usize,
        c: &BackendConfig,
        metrics: BackendMetrics,
        p: &ProxyConfig,
        lanes: usize,
    ) -> Result<Backend, SetupError> {
        c.check_names()?;
        let address = parse_address(c.address.get_ref())?;
        if let Some(st) = &c.status
            && !matches!(parse_address(st), Ok(Address::Tcp(_)))
        {
            let why = format!("backend {}: status must be HOST:PORT, not {st:?}", c.display_name());
            return Err(SetupError::Invalid(crate::config::InvalidValue(why)));
        }
        let tls = BackendTls::new(c, c.tls_mode(p), &address)?;
        metrics.up.set(1);
        metrics.primary.set(i64::from(c.role != Role::Replica));
        metrics.replica_lag.set(-1);
        metrics.serving_reads.set(i64::from(c.role == Role::Replica));
        Ok(Backend {
            own: Arc::default(),
            index,
            name: c.display_name(),
            address,
            weight: AtomicU32::new(c.weight.max(1)),
            tls,
            role: c.role,
            candidate: c.candidate,
            priority: c.priority,
            send_proxy: c.send_proxy,
            serving: AtomicU8::new(if c.role == Role::Replica { Role::Replica as u8 } else { Role::Primary as u8 }),
            reads_ok: AtomicBool::new(true),
            replication: Mutex::new(Replication::default()),
            connect_timeout: p.connect_timeout,
            up: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            status: c.status.clone(),
            closing: AtomicBool::new(false),
            load: load::Readings::default(),
            drain_since_ms: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            assumed: AtomicU64::new(0),
            fence: Mutex::new(None),
            replaced: tokio::sync::Notify::new(),
            sessions: AtomicUsize::new(0),
            activity: Activity::since(crate::metrics::mono_ns() / 1_000_000),
            health: Mutex::new(HealthState {
                reason: None,
                consecutive_ok: 0,
                consecutive_fail: 0,
                checks: 0,
                since: Instant::now(),
                last_check: None,
                unanswered: false,
            }),
            info: Mutex::new(None),
            tracking: Mutex::new(None),
            lex_default: Mutex::new(None),
            pool: pool::Pool::new(p.pool_idle_max, p.pool_idle_timeout),
            shared: shared::Lanes::new(
                p.max_backend_connections,
                lanes,
                p.queue_timeout,
                if p.pool_idle_timeout.is_zero() { std::time::Duration::from_secs(60) } else { p.pool_idle_timeout },
                metrics.clone(),
            ),
            metrics,
        })
    }

    /// Leaves an idle connection for reuse. Returns the connection for the caller to close:
    /// this one when the pool does not want it (disabled, or the backend is down), or the one
    /// idle longest when it made room for this one.
    pub fn park(&self, c: pool::Idle) -> Option<pool::Idle> {
        if !self.is_up() {
            return Some(c);
        }
        let close = self.pool.put(c);
        if close.is_none() {
            // One in, none out; an eviction leaves the count as it was.
            self.metrics.pool_idle.inc();
        }
        close
    }

    pub fn pool_enabled(&self) -> bool {
        self.pool.enabled()
    }

    /// A pooled connection of this worker for a client with `fit`, if one is kept.
    pub fn reuse(&self, fit: pool::Fit) -> Option<pool::Idle> {
        let c = self.pool.take(fit)?;
        self.metrics.pool_idle.dec();
        Some(c)
    }

    /// This worker's pooled connections to close now: those idle too long, or all of them
    /// with `all` or when the backend is down.
    pub fn expired(&self, all: bool) -> Vec<pool::Idle> {
        let v = self.pool.expired(all || !self.is_up());
        self.metrics.pool_idle.dec_by(v.len() as i64);
        v
    }

    /// Takes every idle connection sluice keeps to this backend, on every worker (pooled ones
    /// and multiplexing's spare ones), for the caller to close: the backend refused a
    /// connection with 1040 Too many connections, and connections nobody uses must not be what
    /// keeps a client out. (A connection belongs to its worker's event loop, but another
    /// worker may write its COM_QUIT and close it.)
    pub fn release_idle(&self) -> Vec<PacketConn> {
        let pooled = self.pool.take_all();
        self.metrics.pool_idle.dec_by(pooled.len() as i64);
        let conns: Vec<PacketConn> = pooled.into_iter().map(|i| i.conn).chain(self.shared.take_all().into_iter().map(|s| s.conn)).collect();
        self.metrics.idle_released.inc_by(conns.len() as u64);
        conns
    }

    pub fn pooled(&self) -> usize {
        self.pool.count()
    }

    #[inline]
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Its weight as `policy` balances by (per mille: the latency-aware policy scales it by
    /// what the backend reports, `load.rs`).
    pub fn balance_weight(&self, policy: crate::config::Policy) -> u64 {
        let factor = if policy == crate::config::Policy::LeastLatency { self.load.factor() } else { 1000 };
        u64::from(self.weight()) * u64::from(factor)
    }

    pub fn set_weight(&self, w: u32) {
        self.weight.store(w.max(1), Ordering::Relaxed);
    }

    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Its status address says it is shutting down.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Records what its status address said; true when that changed.
    pub fn set_closing(&self, closing: bool) -> bool {
        self.closing.swap(closing, Ordering::Relaxed) != closing
    }

    pub fn set_draining(&self, on: bool) {
        self.drain_since_ms.store(crate::metrics::mono_ns() / 1_000_000, Ordering::Relaxed);
        self.draining.store(on, Ordering::SeqCst);
    }

    /// How long the backend has been draining.
    pub fn drained_for(&self) -> Option<std::time::Duration> {
        let since = self.drain_since_ms.load(Ordering::Relaxed);
        self.is_draining().then(|| std::time::Duration::from_millis((crate::metrics::mono_ns() / 1_000_000).saturating_sub(since)))
    }

    /// Up, not draining and not fenced: the balancer may send sessions here.
    pub fn is_usable(&self) -> bool {
        self.is_up() && !self.is_draining() && !self.is_fenced() && !self.is_closing()
    }

    /// How many times failover set its role ([`Backend::assume`]).
    pub fn assumed(&self) -> u64 {
        self.assumed.load(Ordering::SeqCst)
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Relaxed)
    }

    /// Why failover keeps it out, if it does.
    pub fn fence(&self) -> Option<Fence> {
        self.fence.lock().clone()
    }

    /// Keeps it out of service (Some) or lets it serve again (None).
    pub fn set_fence(&self, f: Option<Fence>) {
        let replaced = f.as_ref().is_some_and(|f| f.kind == FenceKind::Replaced);
        {
            let mut g = self.fence.lock();
            self.fenced.store(f.is_some(), Ordering::SeqCst);
            *g = f;
        }
        if replaced {
            self.replaced.notify_waiters();
        }
    }

    /// Returns once failover replaced the backend (at once when it is so now): a hung server
    /// may never answer what is asked of it.
    pub async fn until_replaced(&self) {
        let notified = self.replaced.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.fence.lock().as_ref().is_some_and(|f| f.kind == FenceKind::Replaced) {
            return;
        }
        notified.await;
    }

    /// Serves as `role` from now on (a promotion, a demotion), before the health checks read it.
    pub fn assume(&self, role: Role) {
        self.assumed.fetch_add(1, Ordering::SeqCst);
        let role = if role == Role::Replica { Role::Replica } else { Role::Primary };
        self.serving.store(role as u8, Ordering::Relaxed);
        self.metrics.primary.set(i64::from(role == Role::Primary));
    }

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        self.metrics.up.set(up as i64);
    }

    /// Records that a session is bound here; the guard unbinds it when dropped.
    pub fn bind(self: &Arc<Self>) -> BackendGuard {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        self.metrics.sessions.inc();
        BackendGuard(self.clone())
    }

    /// Whether its last greeting was TiDB's (`tidb.rs`).
    pub fn is_tidb(&self) -> bool {
        self.info.lock().as_ref().is_some_and(|i| tidb::is_tidb(&i.version))
    }

    pub fn remember_greeting(&self, g: &sluice_proto::handshake::Greeting) {
        *self.info.lock() = Some(ServerInfo {
            version: g.server_version.clone(),
            capabilities: g.capabilities,
            mariadb_capabilities: g.mariadb_capabilities,
            collation: g.collation,
        });
    }

    /// Why the balancer sends it nothing now ("draining", "down: ..."); None when it is usable.
    pub fn why_unusable(&self) -> Option<String> {
        if let Some(f) = self.fence() {
            Some(format!("fenced: {}", f.reason))
        } else if self.is_closing() {
            Some("closing: its status address reports it shutting down".into())
        } else if self.is_draining() {
            Some("draining".into())
        } else if !self.is_up() {
            Some(format!("down: {}", self.out_reason()))
        } else {
            None
        }
    }

    /// Why this backend cannot take a session, for error messages and the admin API.
    pub fn out_reason(&self) -> String {
        self.health.lock().reason.clone().unwrap_or_else(|| "marked down".into())
    }
}

/// A session's claim on a backend, released on drop.
pub struct BackendGuard(pub Arc<Backend>);

impl Drop for BackendGuard {
    fn drop(&mut self) {
        self.0.sessions.fetch_sub(1, Ordering::Relaxed);
        self.0.metrics.sessions.dec();
    }
}

impl std::ops::Deref for BackendGuard {
    type Target = Arc<Backend>;
    fn deref(&self) -> &Arc<Backend> {
        &self.0
    }
}

/// The backends: those configured, and those added at run time (admin API).
pub struct Backends {
    /// Swapped whole when a backend is added or removed; readers take a snapshot.
    list: arc_swap::ArcSwap<Vec<Arc<Backend>>>,
    /// The index the next backend added gets (indexes are never reused).
    next_index: std::sync::atomic::AtomicUsize,
    /// Chooses among them for each new session.
    pub balancer: balance::Balancer,
    /// Which one is the primary, for failover.
    pub topology: topology::Topology,
}

impl Backends {
    pub fn new(list: Vec<Backend>, policy: crate::config::Policy) -> Backends {
        let n = list.len();
        Backends {
            list: arc_swap::ArcSwap::from_pointee(list.into_iter().map(Arc::new).collect()),
            next_index: std::sync::atomic::AtomicUsize::new(n),
            balancer: balance::Balancer::new(policy),
            topology: Default::default(),
        }
    }

    /// The backends now.
    pub fn list(&self) -> arc_swap::Guard<Arc<Vec<Arc<Backend>>>> {
        self.list.load()
    }

    /// Sets each backend's factor for the latency-aware policy from its readings, against the
    /// fastest usable backend's response time (`load.rs`); whether one changed.
    pub fn refresh_load(&self) -> bool {
        let list = self.list();
        let fastest = list.iter().filter(|b| b.is_usable()).filter_map(|b| b.load.rtt_us()).min();
        // (Every backend's: no short cut.)
        list.iter().map(|b| b.load.refresh(fastest)).filter(|&changed| changed).count() > 0
    }

    /// The backend of `index`, if it is still there.
    pub fn get(&self, index: usize) -> Option<Arc<Backend>> {
        self.list().iter().find(|b| b.index == index).cloned()
    }

    pub fn by_name(&self, name: &str) -> Option<Arc<Backend>> {
        self.list().iter().find(|b| b.name == name).cloned()
    }

    /// The index a backend added now gets.
    pub fn next_index(&self) -> usize {
        self.next_index.fetch_add(1, Ordering::Relaxed)
    }

    /// Adds a backend (its name must be new: checked by the caller).
    pub fn add(&self, b: Arc<Backend>) {
        self.list.rcu(|l| {
            let mut l = Vec::clone(l);
            l.push(b.clone());
            l
        });
    }

    /// Removes a backend: no session is sent there any more; sessions still on it keep it.
    pub fn remove(&self, index: usize) {
        self.list.rcu(|l| l.iter().filter(|b| b.index != index).cloned().collect::<Vec<_>>());
    }

    /// The server facts sluice's own greeting repeats: those of an up backend if one has been
    /// seen, else of any backend that has greeted once.
    pub fn server_info(&self) -> Option<ServerInfo> {
        let mut fallback = None;
        for b in self.list().iter() {
            if let Some(i) = b.info.lock().clone() {
                if b.is_up() {
                    return Some(i);
                }
                fallback.get_or_insert(i);
            }
        }
        fallback
    }

    /// One line per backend saying why it is not usable (for "no backend" errors).
    pub fn describe_unusable(&self, tried: &[(usize, crate::error::Error)]) -> String {
        self.list()
            .iter()
            .map(|b| {
                let why = tried
                    .iter()
                    .find(|(i, _)| *i == b.index)
                    .map(|(_, e)| if e.is_backend_refusal() { format!("refused: {} {}", e.code, e.message) } else { e.message.clone() })
                    .unwrap_or_else(|| if b.is_up() { "not tried".into() } else { format!("down: {}", b.out_reason()) });
                format!("{} ({}): {}", b.name, b.address, why)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

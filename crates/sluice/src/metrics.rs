//! Metrics: plain atomics on the hot path, exported in the Prometheus text format through
//! `prometheus-client`. Every labelled series is resolved once at start-up, so recording a
//! query is a few relaxed atomic adds and never takes a lock. The per-query series are sharded:
//! each worker thread adds to its own cache line, and the export sums the shards, so workers do
//! not bounce cache lines between cores on every query.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use sluice_proto::consts::com;

use crate::error::Side;
use crate::worker::{SHARDS, shard};

/// Latency buckets in seconds: 50 µs to 10 s.
const BUCKETS: [f64; 16] = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot(AtomicU64);

/// A counter with one cache line per shard.
#[derive(Debug, Default, Clone)]
pub struct ShardedCounter(Arc<[Slot; SHARDS]>);

impl ShardedCounter {
    #[inline]
    pub fn inc_by(&self, n: u64) {
        self.0[shard()].0.fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn get(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for ShardedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for ShardedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// The counters every relayed command adds to: its command's, and the bytes from and to the
/// client. Laid out by shard, each shard's counters side by side, so that a worker's adds for
/// one command land in one or two cache lines of its own block. (As a counter apiece they were
/// as many allocations, each line cold again at the session's next command.)
#[derive(Debug, Clone)]
pub struct RelayCounters(Arc<[RelayShard]>);

/// A shard's cells: the bytes from and to clients, then one per command name
/// (`com::name_index`: the commonest commands' first, so that their adds and the bytes' share
/// the first cache line).
#[derive(Debug)]
#[repr(C, align(64))]
pub struct RelayShard([AtomicU64; COMMAND_CELLS + com::NAMES.len()]);

const FROM_CLIENTS_CELL: usize = 0;
const TO_CLIENTS_CELL: usize = 1;
const COMMAND_CELLS: usize = 2;

impl RelayCounters {
    fn new() -> RelayCounters {
        RelayCounters((0..SHARDS).map(|_| RelayShard(std::array::from_fn(|_| AtomicU64::new(0)))).collect())
    }

    #[inline]
    fn add(&self, cell: usize, n: u64) {
        self.0[shard()].0[cell].fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub fn command(&self, cmd: u8) {
        self.add(COMMAND_CELLS + com::name_index(cmd), 1);
    }

    #[inline]
    pub fn bytes_from_clients(&self, n: usize) {
        self.add(FROM_CLIENTS_CELL, n as u64);
    }

    #[inline]
    pub fn bytes_to_clients(&self, n: usize) {
        self.add(TO_CLIENTS_CELL, n as u64);
    }

    fn sum(&self, cell: usize) -> u64 {
        self.0.iter().map(|s| s.0[cell].load(Ordering::Relaxed)).sum()
    }
}

/// Exposed as two counter families, `commands` (by command) and `bytes` (by direction).
impl Collector for RelayCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = |name, help, series: &mut dyn Iterator<Item = (Labels, u64)>| {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, v) in series {
                e.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
            }
            Ok::<_, std::fmt::Error>(())
        };
        let mut commands = com::NAMES.iter().enumerate().map(|(i, n)| (vec![("command", n.to_string())], self.sum(COMMAND_CELLS + i)));
        family("commands", "Client commands relayed, by command", &mut commands)?;
        let mut bytes = [("from_clients", FROM_CLIENTS_CELL), ("to_clients", TO_CLIENTS_CELL)]
            .into_iter()
            .map(|(d, cell)| (vec![("direction", d.to_string())], self.sum(cell)));
        family("bytes", "Bytes relayed, by direction", &mut bytes)
    }
}

/// A histogram of fixed buckets kept in atomics, one set per shard (the crate's own histogram
/// takes a mutex).
#[derive(Debug, Default, Clone)]
pub struct AtomicHistogram(Arc<[HistInner; SHARDS]>);

/// The sum first: with the buckets up to 5 ms (most queries') it shares the first cache line.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct HistInner {
    sum_nanos: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len() + 1],
}

impl AtomicHistogram {
    #[inline]
    pub fn observe_nanos(&self, nanos: u64) {
        let secs = nanos as f64 / 1e9;
        let i = BUCKETS.iter().position(|&b| secs <= b).unwrap_or(BUCKETS.len());
        let h = &self.0[shard()];
        h.buckets[i].fetch_add(1, Ordering::Relaxed);
        h.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn bucket(&self, i: usize) -> u64 {
        self.0.iter().map(|h| h.buckets[i].load(Ordering::Relaxed)).sum()
    }

    pub fn count(&self) -> u64 {
        (0..=BUCKETS.len()).map(|i| self.bucket(i)).sum()
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // (Each bucket's own count: the encoder writes them cumulated.)
        let buckets: Vec<(f64, u64)> =
            BUCKETS.iter().copied().chain(std::iter::once(f64::MAX)).enumerate().map(|(i, bound)| (bound, self.bucket(i))).collect();
        let count = buckets.iter().map(|b| b.1).sum();
        let sum = self.0.iter().map(|h| h.sum_nanos.load(Ordering::Relaxed)).sum::<u64>() as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

type Labels = Vec<(&'static str, String)>;

/// Per-backend series.
#[derive(Clone)]
pub struct BackendMetrics {
    pub up: Gauge,
    pub sessions: Gauge,
    pub connect_errors: Counter,
    pub latency: AtomicHistogram,
    /// Idle connections in the pool now.
    pub pool_idle: Gauge,
    /// Logins served by a pooled connection.
    pub pool_reused: Counter,
    /// Connections reset (COM_RESET_CONNECTION) on their way into the pool.
    pub pool_resets: Counter,
    /// Idle connections (pooled or spare) closed because the backend refused a new one with
    /// 1040 Too many connections.
    pub idle_released: Counter,
    /// Statements (and logins) waiting for a connection at `max_backend_connections` now.
    pub queue_waiting: Gauge,
    /// How long they waited.
    pub queue_wait: AtomicHistogram,
    /// Waits that ran out of `queue_timeout`.
    pub queue_timeouts: Counter,
    /// Logged-in connections that multiplexed sessions gave back, kept for the next statement.
    pub shared_spare: Gauge,
    /// 1 while the backend serves as the primary, 0 as a replica.
    pub primary: Gauge,
    /// A replica's `Seconds_Behind_Master` (-1: unknown, or not replicating).
    pub replica_lag: Gauge,
    /// 1 while the backend is a replica fit for the split's reads.
    pub serving_reads: Gauge,
}

/// Why a session moved to another backend connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveReason {
    /// Its connection was lost while it was idle.
    Failure,
    /// Its backend is draining.
    Drain,
    /// Sessions are being spread to the weights again.
    Rebalance,
    /// Asked through the admin API.
    Request,
    /// `move_every_statement` (testing).
    Test,
    /// Its backend stopped serving as the primary (a failover): it goes to the new one.
    Role,
}

impl MoveReason {
    pub const ALL: [MoveReason; 6] =
        [MoveReason::Failure, MoveReason::Drain, MoveReason::Rebalance, MoveReason::Request, MoveReason::Test, MoveReason::Role];

    pub fn as_str(self) -> &'static str {
        match self {
            MoveReason::Failure => "failure",
            MoveReason::Drain => "drain",
            MoveReason::Rebalance => "rebalance",
            MoveReason::Request => "request",
            MoveReason::Test => "test",
            MoveReason::Role => "role",
        }
    }
}

/// Where the read/write split sent a statement of a session that held no connection, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// A read, to a replica.
    Read,
    /// `START TRANSACTION READ ONLY`, to a replica (`read_only_transactions = "replica"`).
    ReadOnlyTransaction,
    /// A read, to the primary: no replica was fit for reads.
    NoReplica,
    /// To the primary, for the reason [`sluice_proto::rw::Why`] gives, by its index there.
    Primary(u8),
    /// A transaction begins: to the primary.
    Begin,
    /// The session runs with autocommit off: every statement may open a transaction.
    AutocommitOff,
    /// Session state only (`SET`, `USE`) or what the previous statement left: where it is.
    Current,
    /// A read after the session's last write (`causal_reads = "session"`), to the primary: the
    /// replica had not applied the write within `causal_reads_timeout` (its answer was dropped),
    /// or the read was a prepared statement, which cannot wait first.
    Causal,
    /// Where a query rule or a `/* sluice: route=... */` comment said.
    Rule,
    /// An optimistic transaction's statement, to a replica (`optimistic_transactions`).
    Optimistic,
}

/// The `reason` labels of [`Split::Primary`], in the order of [`sluice_proto::rw::Why`].
const SPLIT_WHY: [&str; 11] = [
    "write",
    "transaction",
    "locking_read",
    "into",
    "side_effect",
    "last_insert_id",
    "user_variable",
    "procedure",
    "function",
    "server_specific",
    "multi",
];

impl Split {
    /// Where, and why: the labels of the series.
    fn labels(i: usize) -> (&'static str, &'static str) {
        match i {
            0 => ("replica", "read"),
            1 => ("replica", "read_only_transaction"),
            2 => ("primary", "no_replica"),
            3 => ("primary", "begin"),
            4 => ("primary", "autocommit_off"),
            5 => ("current", "session_state"),
            6 => ("primary", "causal"),
            7 => ("rule", "rule"),
            8 => ("replica", "optimistic"),
            i => ("primary", SPLIT_WHY[(i - 9) % SPLIT_WHY.len()]),
        }
    }

    /// Every series of `sluice_split_statements_total`, by [`Split::index`].
    fn series(r: &mut Registry) -> Vec<ShardedCounter> {
        let split: Family<Labels, ShardedCounter> = reg(
            r,
            "split_statements",
            "Statements the read/write split routed (those of sessions holding no connection), by where and why",
        );
        (0..9 + SPLIT_WHY.len())
            .map(|i| {
                let (to, reason) = Split::labels(i);
                split.get_or_create(&vec![("to", to.into()), ("reason", reason.into())]).clone()
            })
            .collect()
    }

    fn index(self) -> usize {
        match self {
            Split::Read => 0,
            Split::ReadOnlyTransaction => 1,
            Split::NoReplica => 2,
            Split::Begin => 3,
            Split::AutocommitOff => 4,
            Split::Current => 5,
            Split::Causal => 6,
            Split::Rule => 7,
            Split::Optimistic => 8,
            Split::Primary(why) => 9 + usize::from(why) % SPLIT_WHY.len(),
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy)]
pub enum Reject {
    MaxConnections,
    MaxUserConnections,
    HandshakeTimeout,
    NoBackend,
    ShuttingDown,
    TlsRequired,
    AccessDenied,
    PacketTooLarge,
    /// A trusted balancer's connection without a valid PROXY protocol header.
    ProxyHeader,
}

impl Reject {
    const ALL: [Reject; 9] = [
        Reject::MaxConnections,
        Reject::MaxUserConnections,
        Reject::HandshakeTimeout,
        Reject::NoBackend,
        Reject::ShuttingDown,
        Reject::TlsRequired,
        Reject::AccessDenied,
        Reject::PacketTooLarge,
        Reject::ProxyHeader,
    ];
    fn as_str(self) -> &'static str {
        match self {
            Reject::MaxConnections => "max_connections",
            Reject::MaxUserConnections => "max_user_connections",
            Reject::HandshakeTimeout => "handshake_timeout",
            Reject::NoBackend => "no_backend",
            Reject::ShuttingDown => "shutting_down",
            Reject::TlsRequired => "tls_required",
            Reject::AccessDenied => "access_denied",
            Reject::PacketTooLarge => "packet_too_large",
            Reject::ProxyHeader => "proxy_header",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    pub client_connections: Gauge,
    /// Idle sessions parked (`frontend/idle/`).
    pub parked_sessions: Gauge,
    pub session_parks: Counter,
    /// Sessions an upgrade handed over to the new process (counted by the old one), and
    /// sessions taken over from the old process (counted by the new one).
    pub sessions_handed_over: Counter,
    pub sessions_adopted: Counter,
    /// Records written by traffic capture, and those dropped because its writer fell behind.
    pub capture_records: Counter,
    /// Configuration reloads applied (refused ones are not counted).
    pub config_reloads: Counter,
    pub capture_dropped: Counter,
    pub client_connections_total: Counter,
    /// Accepts that failed (most often: out of descriptors) on any listener.
    pub accept_errors: Counter,
    rejected: Vec<Counter>,
    /// Commands by command byte, and bytes from and to clients.
    pub relay: RelayCounters,
    errors: [Counter; 3],
    /// Sessions moved to another backend connection, by [`MoveReason`]: [moved, failed].
    pub session_moves: [[Counter; 2]; 6],
    /// Times a multiplexed session kept its connection at a safe point, by pin.
    session_pins: Family<Labels, Counter>,
    /// Passes of the rebalancer.
    pub rebalance_runs: Counter,
    /// Statements each query rule matched, and killed for running over its timeout.
    rule_hits: Family<Labels, Counter>,
    rule_timeouts: Family<Labels, Counter>,
    pub digest_evictions: Counter,
    /// Copies for shadow backends, by what became of them.
    mirrored: Family<Labels, Counter>,
    /// Result cache lookups and evictions.
    cache: Family<Labels, Counter>,
    /// Failovers, switchovers and rejoins sluice made or refused, by result.
    failovers: Family<Labels, Counter>,
    switchovers: Family<Labels, Counter>,
    rejoins: Family<Labels, Counter>,
    /// Commands whose backend was lost before they were answered, by what became of them.
    replays: Family<Labels, Counter>,
    /// Statements the read/write split routed, by [`Split::index`].
    split: Vec<ShardedCounter>,
    /// The series of the configured backends, in order.
    pub backends: Vec<BackendMetrics>,
    backend_families: BackendFamilies,
}

/// The per-backend families, labelled by backend name.
struct BackendFamilies {
    up: Family<Labels, Gauge>,
    sessions: Family<Labels, Gauge>,
    connect_errors: Family<Labels, Counter>,
    latency: Family<Labels, AtomicHistogram>,
    pool_idle: Family<Labels, Gauge>,
    pool_reused: Family<Labels, Counter>,
    pool_resets: Family<Labels, Counter>,
    idle_released: Family<Labels, Counter>,
    queue_waiting: Family<Labels, Gauge>,
    queue_wait: Family<Labels, AtomicHistogram>,
    queue_timeouts: Family<Labels, Counter>,
    shared_spare: Family<Labels, Gauge>,
    primary: Family<Labels, Gauge>,
    replica_lag: Family<Labels, Gauge>,
    serving_reads: Family<Labels, Gauge>,
}

impl BackendFamilies {
    fn register(registry: &mut Registry) -> BackendFamilies {
        let up = Family::<Labels, Gauge>::default();
        registry.register("backend_up", "1 when the backend passes health checks", up.clone());
        let primary = Family::<Labels, Gauge>::default();
        registry.register("backend_primary", "1 when the backend serves as the primary, 0 as a replica", primary.clone());
        let replica_lag = Family::<Labels, Gauge>::default();
        registry.register(
            "backend_replica_lag_seconds",
            "A replica's Seconds_Behind_Master as the health checks last read it (-1: unknown or not replicating)",
            replica_lag.clone(),
        );
        let serving_reads = Family::<Labels, Gauge>::default();
        registry.register(
            "backend_serving_reads",
            "1 when the backend is a replica the read/write split sends reads to (replicating, within max_replica_lag)",
            serving_reads.clone(),
        );
        let sessions = Family::<Labels, Gauge>::default();
        registry.register("backend_sessions", "Client sessions on the backend now", sessions.clone());
        let connect_errors = Family::<Labels, Counter>::default();
        registry.register("backend_connect_errors", "Failed connection attempts to the backend", connect_errors.clone());
        let pool_idle = Family::<Labels, Gauge>::default();
        registry.register("backend_pool_idle", "Idle backend connections kept for reuse", pool_idle.clone());
        let pool_reused = Family::<Labels, Counter>::default();
        registry.register("backend_pool_reused", "Logins served by a pooled backend connection", pool_reused.clone());
        let pool_resets = Family::<Labels, Counter>::default();
        registry.register(
            "backend_pool_resets",
            "Backend connections reset on their way into the pool (sessions that ran nothing need none)",
            pool_resets.clone(),
        );
        let idle_released = Family::<Labels, Counter>::default();
        registry.register(
            "backend_idle_released",
            "Idle backend connections (pooled or spare) closed to make room when the backend refused a connection with 1040 Too many connections",
            idle_released.clone(),
        );
        let latency = Family::<Labels, AtomicHistogram>::default();
        registry.register(
            "backend_query_duration_seconds",
            "Time from a command reaching the backend to the end of its response",
            latency.clone(),
        );
        let queue_waiting = Family::<Labels, Gauge>::default();
        registry.register("backend_queue_waiting", "Statements waiting for a connection at max_backend_connections", queue_waiting.clone());
        let queue_wait = Family::<Labels, AtomicHistogram>::default();
        registry.register(
            "backend_queue_wait_seconds",
            "Time statements waited for a connection at max_backend_connections",
            queue_wait.clone(),
        );
        let queue_timeouts = Family::<Labels, Counter>::default();
        registry.register("backend_queue_timeouts", "Waits for a connection that ran out of queue_timeout", queue_timeouts.clone());
        let shared_spare = Family::<Labels, Gauge>::default();
        registry.register(
            "backend_shared_spare",
            "Connections multiplexed sessions gave back, kept for their next statements",
            shared_spare.clone(),
        );

        BackendFamilies {
            up,
            sessions,
            connect_errors,
            latency,
            pool_idle,
            pool_reused,
            pool_resets,
            idle_released,
            queue_waiting,
            queue_wait,
            queue_timeouts,
            shared_spare,
            primary,
            replica_lag,
            serving_reads,
        }
    }

    fn series(&self, name: &str) -> BackendMetrics {
        let l = vec![("backend", name.to_string())];
        BackendMetrics {
            up: self.up.get_or_create(&l).clone(),
            sessions: self.sessions.get_or_create(&l).clone(),
            connect_errors: self.connect_errors.get_or_create(&l).clone(),
            latency: self.latency.get_or_create(&l).clone(),
            pool_idle: self.pool_idle.get_or_create(&l).clone(),
            pool_reused: self.pool_reused.get_or_create(&l).clone(),
            pool_resets: self.pool_resets.get_or_create(&l).clone(),
            idle_released: self.idle_released.get_or_create(&l).clone(),
            queue_waiting: self.queue_waiting.get_or_create(&l).clone(),
            queue_wait: self.queue_wait.get_or_create(&l).clone(),
            queue_timeouts: self.queue_timeouts.get_or_create(&l).clone(),
            shared_spare: self.shared_spare.get_or_create(&l).clone(),
            primary: self.primary.get_or_create(&l).clone(),
            replica_lag: self.replica_lag.get_or_create(&l).clone(),
            serving_reads: self.serving_reads.get_or_create(&l).clone(),
        }
    }

    fn remove(&self, name: &str) {
        let l = vec![("backend", name.to_string())];
        self.up.remove(&l);
        self.sessions.remove(&l);
        self.connect_errors.remove(&l);
        self.latency.remove(&l);
        self.pool_idle.remove(&l);
        self.pool_reused.remove(&l);
        self.pool_resets.remove(&l);
        self.idle_released.remove(&l);
        self.queue_waiting.remove(&l);
        self.queue_wait.remove(&l);
        self.queue_timeouts.remove(&l);
        self.shared_spare.remove(&l);
        self.primary.remove(&l);
        self.replica_lag.remove(&l);
        self.serving_reads.remove(&l);
    }
}

impl Metrics {
    pub fn new(backend_names: &[String]) -> Metrics {
        let mut registry = Registry::with_prefix("sluice");
        let r = &mut registry;
        let rejected: Family<Labels, Counter> = reg(r, "rejected_connections", "Client connections refused, by reason");
        let relay = RelayCounters::new();
        r.register_collector(Box::new(relay.clone()));
        let errors: Family<Labels, Counter> = reg(r, "errors", "Failed sessions and commands, by whose fault it was");
        let moves: Family<Labels, Counter> = reg(r, "session_moves", "Sessions moved to another backend connection, by reason and outcome");
        // (Each series taken in a statement of its own, or in a closure: a family's read guard
        // lives to the end of its statement, and a struct literal is one.)
        let one = |f: &Family<Labels, Counter>, k: &'static str, v: &str| f.get_or_create(&vec![(k, v.into())]).clone();
        let backend_families = BackendFamilies::register(r);
        Metrics {
            client_connections: reg(r, "client_connections", "Client connections open now"),
            parked_sessions: reg(r, "parked_sessions", "Idle sessions parked until their client speaks"),
            session_parks: reg(r, "session_parks", "Times an idle session parked"),
            sessions_handed_over: reg(r, "sessions_handed_over", "Sessions an upgrade handed over to the new process"),
            sessions_adopted: reg(r, "sessions_adopted", "Sessions taken over from the process an upgrade replaced"),
            config_reloads: reg(r, "config_reloads", "Configuration reloads applied"),
            capture_records: reg(r, "capture_records", "Records traffic capture wrote (commands, results, session states)"),
            capture_dropped: reg(
                r,
                "capture_dropped_records",
                "Capture records dropped because the capture writer could not keep up (the relay never waits for it)",
            ),
            client_connections_total: reg(r, "client_connections_accepted", "Client connections accepted"),
            accept_errors: reg(
                r,
                "accept_errors",
                "Accepts that failed on any listener, most often for want of descriptors (the listener backs off)",
            ),
            rejected: Reject::ALL.iter().map(|x| one(&rejected, "reason", x.as_str())).collect(),
            relay,
            errors: [Side::Client, Side::Backend, Side::Proxy].map(|x| one(&errors, "side", x.as_str())),
            session_moves: MoveReason::ALL.map(|m| {
                ["moved", "failed"].map(|o| moves.get_or_create(&vec![("reason", m.as_str().into()), ("result", o.into())]).clone())
            }),
            rebalance_runs: reg(r, "rebalance_runs", "Passes of the rebalancer over the sessions"),
            session_pins: reg(
                r,
                "session_pins",
                "Safe points at which a multiplexed session kept its backend connection, by the reason that began",
            ),
            split: Split::series(r),
            rule_hits: reg(r, "rule_hits", "Statements each query rule matched (the first rule that matched applies)"),
            rule_timeouts: reg(r, "rule_timeouts", "Statements killed on their backend (KILL QUERY) for running over their rule's timeout"),
            digest_evictions: reg(r, "digest_evictions", "Digests forgotten, least recently used first, to keep within digests.max"),
            mirrored: reg(
                r,
                "mirrored_statements",
                "Statements copied to shadow backends by mirroring rules, by outcome (sent, dropped, failed)",
            ),
            cache: reg(r, "result_cache", "Result cache lookups (hit, miss) and answers evicted to stay within routing.cache_size"),
            failovers: reg(r, "failovers", "Promotions of a replica after the primary was lost, by result (done, refused, failed)"),
            switchovers: reg(r, "switchovers", "Switchovers of the primary asked of sluice, by result (done, refused, failed)"),
            rejoins: reg(r, "rejoins", "Servers sluice made replicas of the primary (done) or kept out (diverged, failed)"),
            replays: reg(
                r,
                "transaction_replays",
                "Commands whose backend was lost before they were answered: replayed (their transaction run again), again (run again), diverged, unknown (a commit or write that may have run), not_replayable, failed (no backend); optimistic transactions moved to the primary (optimistic) or not (optimistic_diverged, optimistic_failed)",
            ),
            backends: backend_names.iter().map(|n| backend_families.series(n)).collect(),
            backend_families,
            registry,
        }
    }

    /// The series of a backend added at run time.
    pub fn backend(&self, name: &str) -> BackendMetrics {
        self.backend_families.series(name)
    }

    /// Forgets the series of a backend removed at run time.
    pub fn remove_backend(&self, name: &str) {
        self.backend_families.remove(name);
    }

    pub fn moved(&self, why: MoveReason, ok: bool) {
        self.session_moves[why as usize][usize::from(!ok)].inc();
    }

    /// A cluster operation ("failover", "switchover" or "rejoin") and its result.
    pub fn cluster_operation(&self, op: &str, result: &'static str) {
        let family = match op {
            "failover" => &self.failovers,
            "switchover" => &self.switchovers,
            _ => &self.rejoins,
        };
        family.get_or_create(&vec![("result", result.into())]).inc();
    }

    /// What became of a command whose backend was lost before it was answered.
    pub fn replayed(&self, result: &'static str) {
        self.replays.get_or_create(&vec![("result", result.into())]).inc();
    }

    /// A multiplexed session kept its connection for a reason it did not have before.
    pub fn pinned(&self, reason: &'static str) {
        self.session_pins.get_or_create(&vec![("reason", reason.into())]).inc();
    }

    /// A statement the read/write split routed.
    #[inline]
    pub fn split(&self, s: Split) {
        self.split[s.index()].inc();
    }

    /// The hit and timeout counters of a query rule.
    pub fn rule(&self, name: &str) -> (Counter, Counter) {
        let l = vec![("rule", name.to_string())];
        (self.rule_hits.get_or_create(&l).clone(), self.rule_timeouts.get_or_create(&l).clone())
    }

    /// The result cache's counter of this outcome.
    pub fn cache(&self, outcome: &'static str) -> Counter {
        self.cache.get_or_create(&vec![("outcome", outcome.to_string())]).clone()
    }

    /// The counter of mirrored statements with this outcome.
    pub fn mirrored(&self, outcome: &'static str) -> Counter {
        self.mirrored.get_or_create(&vec![("outcome", outcome.to_string())]).clone()
    }

    pub fn reject(&self, r: Reject) {
        self.rejected[r as usize].inc();
    }

    pub fn error(&self, side: Side) {
        self.errors[side as usize].inc();
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Registers a metric under `name` and returns it (a handle to the registered one).
fn reg<M: prometheus_client::registry::Metric + Clone + Default>(r: &mut Registry, name: &str, help: &str) -> M {
    let m = M::default();
    r.register(name, help, m.clone());
    m
}

pub use crate::sys::process::mono_ns;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_pre_registered_series() {
        let m = Metrics::new(&["db1".into()]);
        m.relay.command(com::QUERY);
        m.relay.command(com::STMT_EXECUTE);
        m.relay.command(com::STMT_EXECUTE);
        m.relay.command(com::SLEEP);
        m.relay.command(0xf0);
        m.relay.command(0xf1);
        m.relay.bytes_from_clients(7);
        m.relay.bytes_to_clients(5);
        m.relay.bytes_to_clients(6);
        m.reject(Reject::MaxConnections);
        m.backends[0].latency.observe_nanos(300_000);
        let text = m.render();
        assert!(text.contains("sluice_commands_total{command=\"query\"} 1"), "{text}");
        assert!(text.contains("sluice_commands_total{command=\"ping\"} 0"), "{text}");
        assert!(text.contains("sluice_commands_total{command=\"stmt_execute\"} 2"), "{text}");
        assert!(text.contains("sluice_commands_total{command=\"sleep\"} 1"), "{text}");
        assert_eq!(text.matches("sluice_commands_total{command=\"other\"} 2\n").count(), 1, "{text}");
        assert_eq!(text.matches("command=\"other\"").count(), 1, "{text}");
        assert!(text.contains("# TYPE sluice_bytes counter\nsluice_bytes_total{direction=\"from_clients\"} 7\n"), "{text}");
        assert!(text.contains("sluice_bytes_total{direction=\"to_clients\"} 11"), "{text}");
        assert!(text.contains("sluice_rejected_connections_total{reason=\"max_connections\"} 1"), "{text}");
        m.backends[0].latency.observe_nanos(2_000_000);
        let text = m.render();
        // Cumulative buckets: each observation counted once in every bucket at or above it.
        for (le, n) in [("0.00025", 0), ("0.0005", 1), ("0.001", 1), ("0.0025", 2), ("10.0", 2)] {
            let series = format!("sluice_backend_query_duration_seconds_bucket{{le=\"{le}\",backend=\"db1\"}} {n}\n");
            assert!(text.contains(&series), "{series} in {text}");
        }
        assert!(text.contains("sluice_backend_query_duration_seconds_count{backend=\"db1\"} 2"), "{text}");
    }
}

//! The context every task receives: configuration, backends, sessions, metrics, shutdown.
//! There is no global state; tests start as many independent proxies as they like.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::auth::Users;
use crate::backend::{Backend, Backends};
use crate::config::{Config, Live, Source};
use crate::metrics::Metrics;
use crate::session::Registry;

pub struct Ctx {
    /// Sluice's own addresses (listeners, recent backend connections): a loop is refused.
    pub own: Arc<crate::net::Own>,
    /// The configuration in force (swapped whole by a reload): [`Ctx::config`].
    pub config: Arc<Live>,
    pub backends: Backends,
    pub metrics: Metrics,
    pub sessions: Registry,
    pub users: Users,
    /// TLS for client connections (its configuration is swapped when a generated certificate
    /// is renewed).
    pub tls: crate::net::tls::ClientTls,
    /// For caching_sha2_password full authentication without TLS (users mode only).
    pub rsa: Option<crate::auth::RsaKey>,
    /// Set when SIGTERM arrives: no new sessions, idle ones close, /health says draining.
    pub draining: AtomicBool,
    /// Client connections open now (for max_connections).
    pub connections: AtomicUsize,
    /// Rung by the control thread at every tick of the pool sweep: the workers' sweeps wait
    /// for it rather than for a timer of their own (`runtime::sweep_pool`).
    pub pool_sweeps: tokio::sync::Notify,
    /// The coarse clock of the response-timeout sweep.
    pub clock: crate::session::deadline::Clock,
    /// The seed of statements' keys (`sluice_proto::digest::Key`): random, never shown, so that
    /// a client cannot make its statement's key another's.
    pub key_seed: [u64; 2],
    /// Statistics per statement digest.
    pub digests: crate::route::digest::Digests,
    /// What was read of each shape of statement, by statement key.
    pub shapes: crate::route::shapes::Shapes,
    /// Query rules.
    pub rules: crate::route::rules::Rules,
    /// The queues of shadow backends (rules that mirror).
    pub mirrors: crate::backend::mirror::Mirrors,
    /// The latest GTIDs written through sluice (`causal_reads = "global"`).
    pub latest_writes: crate::route::gtid::LatestWrites,
    /// Answers kept by rules with `cache_ttl`.
    pub cache: crate::route::cache::ResultCache,
    /// Traffic capture (off until started through the admin API).
    pub capture: crate::capture::Capture,
    /// Upgrades asked through the admin API, for the control thread.
    pub upgrades: Upgrades,
    /// Once an upgrade succeeded: where sessions are handed over to the new process.
    pub handoff: crate::sys::fdpass::Outbox,
    /// Statements clients of sessions that share connections hold open (multiplexing).
    pub open_statements: crate::backend::shared::OpenStatements,
    /// The listening sockets were handed over to a new process (an upgrade): this one no
    /// longer accepts, and ends when its last session does.
    handed_over: AtomicBool,
}

/// Why the context of a proxy could not be made from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum CtxError {
    /// A backend cannot be set up (the configuration's fault).
    #[error(transparent)]
    Backend(#[from] crate::backend::SetupError),
    /// The client TLS certificate cannot be loaded or made.
    #[error(transparent)]
    Tls(#[from] crate::net::tls::TlsError),
    /// A rule cannot be used (the configuration's fault).
    #[error(transparent)]
    Rules(#[from] crate::config::InvalidValue),
    /// The RSA key could not be made.
    #[error(transparent)]
    Rsa(#[from] crate::auth::RsaError),
}
/// An upgrade asked for: where the new process's id (or why it failed) goes.
pub type UpgradeAsk = tokio::sync::oneshot::Sender<Result<u32, crate::error::UpgradeError>>;

pub struct Upgrades {
    tx: tokio::sync::mpsc::Sender<UpgradeAsk>,
    rx: parking_lot::Mutex<Option<tokio::sync::mpsc::Receiver<UpgradeAsk>>>,
}

impl Upgrades {
    fn new() -> Upgrades {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        Upgrades { tx, rx: parking_lot::Mutex::new(Some(rx)) }
    }

    /// Asks for an upgrade; the new process's id once it accepts.
    pub async fn ask(&self) -> Result<u32, crate::error::UpgradeError> {
        let closing = || crate::error::UpgradeError::Refused("sluice is shutting down".into());
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx.send(reply).await.map_err(|_| closing())?;
        answer.await.map_err(|_| closing())?
    }

    /// The requests, for the one control loop that serves them.
    pub fn take_receiver(&self) -> Option<tokio::sync::mpsc::Receiver<UpgradeAsk>> {
        self.rx.lock().take()
    }
}

impl Ctx {
    pub fn new(config: Config) -> Result<Arc<Ctx>, CtxError> {
        Ctx::with_source(config, None)
    }

    /// With where a reload reads the configuration again.
    pub fn with_source(config: Config, source: Option<Source>) -> Result<Arc<Ctx>, CtxError> {
        let names: Vec<String> = config.backends.iter().map(|b| b.display_name()).collect();
        let metrics = Metrics::new(&names);
        let own = Arc::new(crate::net::Own::default());
        let list = config
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let b = Backend::from_config(i, b, metrics.backends[i].clone(), &config.proxy, config.lanes())?;
                Ok(b.noting_to(own.clone()))
            })
            .collect::<Result<Vec<_>, crate::backend::SetupError>>()?;
        let tls = crate::net::tls::ClientTls::from_config(&config.tls, std::time::SystemTime::now())?;
        let rsa = if config.users.is_empty() { None } else { Some(crate::auth::RsaKey::generate()?) };
        let shards = config.workers() + 1;
        let rules = crate::route::rules::Rules::new(&config.rules, &config.backends, shards, &metrics)?;
        let rules_mirror_targets: Vec<usize> = rules.list.iter().filter_map(|r| r.action.mirror).collect();
        Ok(Arc::new(Ctx {
            own,
            rsa,
            key_seed: random_seed(),
            digests: crate::route::digest::Digests::new(&config.digests, shards, metrics.digest_evictions.clone()),
            shapes: crate::route::shapes::Shapes::new(shards),
            rules,
            latest_writes: Default::default(),
            cache: crate::route::cache::ResultCache::new(config.routing.cache_size, &metrics),
            capture: crate::capture::Capture::new(shards, metrics.capture_records.clone(), metrics.capture_dropped.clone()),
            mirrors: crate::backend::mirror::Mirrors::new(rules_mirror_targets, config.routing.mirror_queue, &metrics),
            users: Users::from_config(&config.users, config.proxy.max_connections_per_user),
            backends: Backends::new(list, config.proxy.balance),
            metrics,
            sessions: Registry::default(),
            tls,
            draining: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            pool_sweeps: tokio::sync::Notify::new(),
            clock: crate::session::deadline::Clock::new(config.proxy.response_timeout),
            config: Arc::new(Live::new(config, source)),
            upgrades: Upgrades::new(),
            handoff: Default::default(),
            open_statements: Default::default(),
            handed_over: AtomicBool::new(false),
        }))
    }

    /// The configuration in force now.
    pub fn config(&self) -> arc_swap::Guard<Arc<Config>> {
        self.config.load()
    }

    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Relaxed)
    }

    pub fn set_handed_over(&self) {
        self.handed_over.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

/// Two random words (the standard library's random hash keys, drawn from the system).
fn random_seed() -> [u64; 2] {
    use std::hash::BuildHasher;
    let keys = std::collections::hash_map::RandomState::new();
    [keys.hash_one(1u64), keys.hash_one(2u64)]
}

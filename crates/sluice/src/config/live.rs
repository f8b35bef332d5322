//! The configuration in force. A reload (`crate::control::reload`) reads it again from where it came
//! from (the file, with the command line's flags on top) and swaps it whole; readers take a
//! snapshot, and a session keeps the one it started with.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::{ArcSwap, Guard};

use super::{AuthMode, Config, ConfigError};

/// Reads the configuration again (None: sluice started without a file, nothing to reload).
pub type Source = Arc<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

pub struct Live {
    now: ArcSwap<Config>,
    /// Unix milliseconds of the last load.
    loaded_at_ms: AtomicU64,
    /// Reloads applied since the start.
    reloads: AtomicU64,
    source: Option<Source>,
    /// What the cluster's store says (`[cluster]`), laid over what the file says.
    shared: parking_lot::Mutex<Option<super::Shared>>,
}

impl Live {
    pub fn new(config: Config, source: Option<Source>) -> Live {
        Live {
            now: ArcSwap::from_pointee(config),
            loaded_at_ms: AtomicU64::new(unix_ms()),
            reloads: AtomicU64::new(0),
            source,
            shared: parking_lot::Mutex::new(None),
        }
    }

    /// The configuration now (a cheap snapshot; hold it briefly).
    pub fn load(&self) -> Guard<Arc<Config>> {
        self.now.load()
    }

    /// The configuration now, to keep.
    pub fn get(&self) -> Arc<Config> {
        self.now.load_full()
    }

    /// Puts `config` in force.
    pub fn store(&self, config: Config) {
        self.now.store(Arc::new(config));
        self.loaded_at_ms.store(unix_ms(), Ordering::Relaxed);
        self.reloads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn loaded_at_ms(&self) -> u64 {
        self.loaded_at_ms.load(Ordering::Relaxed)
    }

    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Reads the configuration again from where it came from (with what the cluster's store
    /// says laid over it).
    pub fn read_again(&self) -> Result<Config, ConfigError> {
        let c = match &self.source {
            Some(read) => read()?,
            None => {
                let message = "sluice was started without a configuration file (--config): there is nothing to reload".into();
                return Err(ConfigError { file: None, line: None, message });
            }
        };
        Ok(match self.shared.lock().as_ref() {
            Some(s) => s.overlay(c),
            None => c,
        })
    }

    /// Keeps what the cluster's store says, for the reloads to come.
    pub fn set_shared(&self, s: super::Shared) {
        *self.shared.lock() = Some(s);
    }
}

/// What differs between the configuration in force and a new one that a running sluice cannot
/// take on: one line each, naming the key (empty: the new one can be applied).
pub fn fixed_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |changed: bool, what: &str| {
        if changed {
            out.push(format!("{what} cannot change while sluice runs (restart, or `sluice upgrade`)"));
        }
    };
    check(old.listeners != new.listeners, "listeners");
    check(old.proxy.workers != new.proxy.workers, "proxy.workers");
    check(old.proxy.runtime != new.proxy.runtime, "proxy.runtime");
    check(old.admin.listen != new.admin.listen, "admin.listen");
    check(old.admin.sql_listen != new.admin.sql_listen, "admin.sql_listen");
    let users_mode = |c: &Config| c.listeners.iter().map(|l| c.auth_mode(l) == AuthMode::Users).collect::<Vec<_>>();
    check(users_mode(old) != users_mode(new), "the listeners' auth mode (users given or not)");
    check(old.rules != new.rules, "rules");
    check(old.digests != new.digests, "digests");
    check(old.cluster != new.cluster, "cluster");
    check(old.routing.cache_size != new.routing.cache_size, "routing.cache_size");
    check(old.routing.mirror_queue != new.routing.mirror_queue, "routing.mirror_queue");
    // Each backend keeps the pool and limits it was made with.
    let p = (&old.proxy, &new.proxy);
    check(p.0.pool_idle_max != p.1.pool_idle_max, "proxy.pool_idle_max");
    check(p.0.pool_idle_timeout != p.1.pool_idle_timeout, "proxy.pool_idle_timeout");
    check(p.0.max_backend_connections != p.1.max_backend_connections, "proxy.max_backend_connections");
    check(p.0.queue_timeout != p.1.queue_timeout, "proxy.queue_timeout");
    check(p.0.backend_tls != p.1.backend_tls, "proxy.backend_tls");
    check(p.0.connect_timeout != p.1.connect_timeout, "proxy.connect_timeout");
    // (The timeout sweep's clock runs at a pace set by it.)
    check(p.0.response_timeout != p.1.response_timeout, "proxy.response_timeout");
    // (Certificate files can change, and are read again.)
    check(std::mem::discriminant(&old.tls) != std::mem::discriminant(&new.tls), "tls (off, self-signed or files)");
    for nb in &new.backends {
        let name = nb.display_name();
        if let Some(ob) = old.backends.iter().find(|b| b.display_name() == name) {
            let mut ob = ob.clone();
            ob.weight = nb.weight;
            if ob != *nb {
                out.push(format!(
                    "backend {name}: only its weight can change while it runs (remove it, and add the new one under another name)"
                ));
            }
        }
    }
    out
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

//! Hot reload: SIGHUP and `POST /config/reload` read the configuration again (the file, with
//! the command line's flags on top) and apply what changed, with sessions going on:
//!
//! - backends added, removed (drained first, as `DELETE /backends/NAME` does) or re-weighted;
//! - users added, changed or removed (sessions logged in keep going);
//! - the balancing policy, health settings (each check round reads them), the admin token,
//!   TLS certificate files (new handshakes get them);
//! - limits, timeouts and routing switches: for sessions that begin after the reload (a
//!   session keeps the configuration it began with).
//!
//! A file that does not parse or validate is refused with the same line-precise error as at
//! start, and so is one that changes what a running sluice cannot (`config::fixed_changes`):
//! the configuration in force stays, untouched.

use std::sync::Arc;

use serde::Serialize;

use crate::config::Config;
use crate::ctx::Ctx;

/// What a reload changed.
#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub backends_added: Vec<String>,
    /// Drained, then taken out once their sessions left.
    pub backends_removed: Vec<String>,
    pub weights_changed: Vec<String>,
    pub users_added: Vec<String>,
    pub users_changed: Vec<String>,
    pub users_removed: Vec<String>,
    pub tls_certificate_changed: bool,
    /// Unix milliseconds when the configuration now in force was loaded.
    pub loaded_at_ms: u64,
}

/// Why a reload was refused; nothing was applied. Each case is the configuration's (the
/// operator's to mend), never a session's.
#[derive(Debug)]
pub enum Refused {
    /// The file does not read, parse or validate.
    Invalid(crate::config::ConfigError),
    /// It changes what a running sluice cannot: each setting, one line each.
    Fixed(Vec<String>),
    /// A TLS file changed since it was validated and cannot be used.
    Tls(crate::net::tls::TlsError),
}

impl Refused {
    /// Its reasons, one line each.
    pub fn lines(&self) -> Vec<String> {
        match self {
            Refused::Invalid(e) => vec![e.to_string()],
            Refused::Fixed(changes) => changes.clone(),
            Refused::Tls(e) => vec![format!("tls: {e}")],
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.lines().join("; "))
    }
}

/// Reads the configuration again and applies it (call it on a tokio runtime: backends added
/// start their checks there).
pub fn reload(ctx: &Arc<Ctx>) -> Result<Outcome, Refused> {
    let new = ctx.config.read_again().map_err(Refused::Invalid)?;
    apply(ctx, new)
}

/// Applies `new` (from the file, or from the cluster's store laid over the configuration in
/// force), or refuses it whole.
pub fn apply(ctx: &Arc<Ctx>, new: Config) -> Result<Outcome, Refused> {
    let old = ctx.config.get();
    let fixed = crate::config::fixed_changes(&old, &new);
    if !fixed.is_empty() {
        return Err(Refused::Fixed(fixed));
    }
    // TLS first: the only step that can still fail (files changed since they were validated).
    let tls_certificate_changed = ctx.tls.reload_files(&new.tls).map_err(Refused::Tls)?;
    let mut out = Outcome { tls_certificate_changed, ..Outcome::default() };
    apply_backends(ctx, &new, &mut out);
    [out.users_added, out.users_changed, out.users_removed] = ctx.users.replace(&new.users, new.proxy.max_connections_per_user);
    ctx.backends.balancer.set_policy(new.proxy.balance);
    ctx.config.store(new);
    out.loaded_at_ms = ctx.config.loaded_at_ms();
    ctx.metrics.config_reloads.inc();
    tracing::info!(
        added = ?out.backends_added, removed = ?out.backends_removed, weights = ?out.weights_changed,
        users_added = ?out.users_added, users_changed = ?out.users_changed, users_removed = ?out.users_removed,
        tls_certificate_changed = out.tls_certificate_changed,
        "configuration reloaded"
    );
    Ok(out)
}

/// Backends by name: new ones added, missing ones removed, weights set.
fn apply_backends(ctx: &Arc<Ctx>, new: &Config, out: &mut Outcome) {
    let list = ctx.backends.list();
    for c in &new.backends {
        let name = c.display_name();
        match list.iter().find(|b| b.name == name) {
            Some(b) if b.weight() != c.weight.max(1) => {
                b.set_weight(c.weight.max(1));
                out.weights_changed.push(name);
            }
            Some(_) => {}
            None => match crate::control::add_backend(ctx, c) {
                Ok(_) => out.backends_added.push(name),
                Err(e) => tracing::warn!(backend = %name, error = %e, "reload: cannot add backend"),
            },
        }
    }
    for b in list.iter().filter(|b| !new.backends.iter().any(|c| c.display_name() == b.name)) {
        crate::control::remove_backend(ctx, b);
        out.backends_removed.push(b.name.clone());
    }
}

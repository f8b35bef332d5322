//! Many instances: sluice instances that serve the same backends share their configuration
//! through etcd (`[cluster]`). Under the prefix:
//!
//! - `backends/NAME`: a backend, as JSON with the keys of `[[backends]]` (`{"address": ...,
//!   "weight": 2}`);
//! - `users/NAME`: a user, with the keys of `[[users]]` (`{"password": ...}`);
//! - `drain/NAME`: present while backend NAME drains, on every instance;
//! - `instances/NAME`: each instance's registration, under a lease it renews (gone within
//!   `lease_ttl` of its end), for `sluice ctl instances`;
//! - `failover/leader`: the instance that acts on failovers, under its lease ([`elect`]).
//!
//! Each instance reads the prefix, watches it, and on every change applies what it says
//! through the same path as a reload (`reload::apply`): the store's backends and users, when
//! it has any, replace the file's; a drain key appearing drains that backend, its removal
//! undrains it. When etcd cannot be reached, the instance keeps what it last applied and tries
//! again every second.

mod elect;
pub mod etcd;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{BackendConfig, Shared, UserConfig};
use crate::ctx::Ctx;
use etcd::{Etcd, EtcdError, b64};

/// What an instance registers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    pub name: String,
    pub admin: String,
    pub listeners: Vec<String>,
    pub pid: u32,
    pub version: String,
    pub started_at_ms: u64,
}

/// Runs for as long as the process: registration, and the store applied as it changes.
pub async fn run(ctx: Arc<Ctx>, me: Instance) {
    let c = ctx.config().cluster.clone();
    let etcd = match Etcd::new(&c) {
        Ok(e) => Arc::new(e),
        Err(e) => return tracing::error!(error = %e, "cluster: not joining"),
    };
    tracing::info!(name = %me.name, prefix = %c.prefix, "cluster: joining");
    let key = format!("{}instances/{}", c.prefix, me.name);
    tokio::spawn(register(etcd.clone(), key, serde_json::to_string(&me).unwrap_or_default(), c.lease_ttl));
    if ctx.config().failover.manages() {
        tokio::spawn(elect::campaign(ctx.clone(), etcd.clone(), format!("{}failover/leader", c.prefix), me.name.clone(), c.lease_ttl));
    }
    let mut drained = BTreeSet::new();
    loop {
        if let Err(e) = follow(&ctx, &etcd, &c.prefix, &mut drained).await {
            tracing::warn!(error = %e, "cluster: lost the store; keeping what was applied, trying again");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Reads the prefix, applies it, and watches it: applies it again at every change.
async fn follow(ctx: &Arc<Ctx>, etcd: &Etcd, prefix: &str, drained: &mut BTreeSet<String>) -> Result<(), EtcdError> {
    let (revision, kvs) = etcd.range(prefix).await?;
    apply(ctx, prefix, &kvs, drained);
    let watch = serde_json::json!({ "create_request": {
        "key": b64(prefix.as_bytes()), "range_end": b64(&etcd::range_end(prefix)), "start_revision": (revision + 1).to_string() } });
    let mut events = etcd.stream("/v3/watch", &watch).await?;
    loop {
        let msg = events.next().await?.ok_or_else(|| EtcdError::Answer("the watch ended".into()))?;
        let changed = msg["result"]["events"].as_array().is_some_and(|e| {
            e.iter().any(|ev| {
                let key = String::from_utf8_lossy(&etcd::unb64(&ev["kv"]["key"])).into_owned();
                !key.starts_with(&format!("{prefix}instances/")) && !key.starts_with(&format!("{prefix}failover/"))
            })
        });
        if changed {
            let (_, kvs) = etcd.range(prefix).await?;
            apply(ctx, prefix, &kvs, drained);
        }
    }
}

/// The store's keys, read.
fn shared_of(prefix: &str, kvs: &[(String, Vec<u8>)]) -> Shared {
    let mut s = Shared::default();
    for (key, value) in kvs {
        let Some(rest) = key.strip_prefix(prefix) else { continue };
        let (kind, name) = rest.split_once('/').unwrap_or((rest, ""));
        if name.is_empty() {
            continue;
        }
        // (A value that does not read is the fault of whoever wrote it to the store.)
        let bad = |m: String| crate::config::InvalidValue(m);
        let read = |extra: (&str, Value)| -> Result<String, crate::config::InvalidValue> {
            let mut v: Value = serde_json::from_slice(value).map_err(|e| bad(format!("not JSON: {e}")))?;
            let obj = v.as_object_mut().ok_or_else(|| bad("not a JSON object".into()))?;
            obj.retain(|_, v| !v.is_null());
            obj.insert(extra.0.into(), extra.1);
            toml::to_string(&v).map_err(|e| bad(e.to_string()))
        };
        let outcome = match kind {
            "backends" => read(("name", Value::String(name.into())))
                .and_then(|t| toml::from_str::<BackendConfig>(&t).map_err(|e| bad(e.message().to_string())))
                .map(|b| s.backends.push(b)),
            "users" => read(("name", Value::String(name.into())))
                .and_then(|t| toml::from_str::<UserConfig>(&t).map_err(|e| bad(e.message().to_string())))
                .map(|u| s.users.push(u)),
            "drain" => {
                s.drained.push(name.to_string());
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(e) = outcome {
            tracing::warn!(key = %key, error = %e, "cluster: ignoring a key that does not read");
        }
    }
    s
}

/// Applies the store: its backends and users (through a reload's path), then its drains.
fn apply(ctx: &Arc<Ctx>, prefix: &str, kvs: &[(String, Vec<u8>)], drained: &mut BTreeSet<String>) {
    let shared = shared_of(prefix, kvs);
    let now = ctx.config.get();
    let new = shared.overlay((*now).clone());
    if new.backends != now.backends || new.users != now.users {
        match crate::control::reload::apply(ctx, new) {
            Ok(out) => tracing::info!(outcome = ?out, "cluster: applied the store's configuration"),
            Err(refused) => tracing::warn!(errors = %refused, "cluster: the store's configuration cannot be applied"),
        }
    }
    let want: BTreeSet<String> = shared.drained.iter().cloned().collect();
    for name in want.difference(drained) {
        if let Some(b) = ctx.backends.by_name(name) {
            crate::control::start_drain(ctx, &b);
        }
    }
    for name in drained.difference(&want) {
        if let Some(b) = ctx.backends.by_name(name) {
            crate::control::undrain(ctx, &b);
            tracing::info!(backend = %name, "cluster: undrained");
        }
    }
    *drained = want;
    ctx.config.set_shared(shared);
}

/// Keeps this instance registered under a lease, granted again when it was lost.
async fn register(etcd: Arc<Etcd>, key: String, value: String, ttl: Duration) {
    let every = (ttl / 3).max(Duration::from_millis(200));
    loop {
        if let Err(e) = keep_registered(&etcd, &key, &value, ttl, every).await {
            tracing::warn!(error = %e, "cluster: registration lost; registering again");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn keep_registered(etcd: &Etcd, key: &str, value: &str, ttl: Duration, every: Duration) -> Result<(), EtcdError> {
    let id = elect::grant(etcd, ttl).await?;
    etcd.call("/v3/kv/put", &serde_json::json!({ "key": b64(key.as_bytes()), "value": b64(value.as_bytes()), "lease": id })).await?;
    loop {
        tokio::time::sleep(every).await;
        elect::renew(etcd, &id).await?;
    }
}

/// The instances registered in the cluster now.
pub async fn instances(ctx: &Ctx) -> Result<Vec<Value>, EtcdError> {
    let c = ctx.config().cluster.clone();
    let etcd = Etcd::new(&c)?;
    let (_, kvs) = etcd.range(&format!("{}instances/", c.prefix)).await?;
    Ok(kvs.iter().filter_map(|(_, v)| serde_json::from_slice(v).ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_reads_as_backends_users_and_drains() {
        let kv = |k: &str, v: &str| (format!("/p/{k}"), v.as_bytes().to_vec());
        let s = shared_of(
            "/p/",
            &[
                kv("backends/a", r#"{"address": "127.0.0.1:3306", "weight": 3, "group": null}"#),
                kv("backends/b", r#"{"address": "127.0.0.1:3307"}"#),
                kv("backends/bad", r#"{"weight": 1}"#),
                kv("users/app", r#"{"password": "pw", "max_connections": 2}"#),
                kv("drain/a", ""),
                kv("instances/x", "{}"),
            ],
        );
        let names: Vec<String> = s.backends.iter().map(|b| b.display_name()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(s.backends[0].weight, 3);
        assert_eq!(s.users[0].name, "app");
        assert_eq!(s.users[0].max_connections, 2);
        assert_eq!(s.drained, ["a"]);
    }
}

//! One instance acts on the topology. With `[cluster]` and `[failover]`, the instances
//! campaign for the key `{prefix}failover/leader`: an etcd transaction puts it, under the
//! instance's lease, only when no one holds it. The holder promotes, switches over and
//! rejoins (`crate::control::failover`); the others follow the roles it makes. It acts only
//! while its lease is certainly alive: until a third of `lease_ttl` before the lease could
//! expire, counted from the moment it asked for the last renewal. When it ends or loses etcd,
//! its key goes with its lease, and another instance takes over within `lease_ttl` and a third.
//! An instance with `[cluster]` acts only once elected, so two never promote for one failure.
//! Without `[cluster]`, every instance with `[failover]` acts: run one, or use etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::etcd::{Etcd, EtcdError, b64, unb64};
use crate::ctx::Ctx;

/// Campaigns for as long as the process runs.
pub async fn campaign(ctx: Arc<Ctx>, etcd: Arc<Etcd>, key: String, me: String, ttl: Duration) {
    let topo = &ctx.backends.topology;
    loop {
        if let Err(e) = hold_or_wait(&ctx, &etcd, &key, &me, ttl).await {
            if topo.leads() {
                tracing::warn!(error = %e, "cluster: this instance no longer acts on failovers");
            } else {
                tracing::warn!(error = %e, "cluster: the failover election cannot reach etcd; trying again");
            }
        }
        topo.set_lead(None, None);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Under one lease: takes the key when it is free, says who holds it, renews the lease.
async fn hold_or_wait(ctx: &Ctx, etcd: &Etcd, key: &str, me: &str, ttl: Duration) -> Result<(), EtcdError> {
    let topo = &ctx.backends.topology;
    let every = (ttl / 3).max(Duration::from_millis(200));
    let mut renewed = Instant::now();
    let id = grant(etcd, ttl).await?;
    loop {
        let (mine, leader) = take(etcd, key, me, &id).await?;
        if mine != topo.leads() {
            match mine {
                true => tracing::warn!(instance = %me, "cluster: this instance acts on failovers"),
                false => tracing::info!(leader = ?leader, "cluster: another instance acts on failovers"),
            }
        }
        topo.set_lead(leader, mine.then(|| renewed + ttl - ttl / 3));
        tokio::time::sleep(every).await;
        let asked = Instant::now();
        renew(etcd, &id).await?;
        renewed = asked;
    }
}

/// Puts the key under lease `id` when no one holds it: whether this instance holds it, and
/// who does.
async fn take(etcd: &Etcd, key: &str, me: &str, id: &str) -> Result<(bool, Option<String>), EtcdError> {
    let k = b64(key.as_bytes());
    let txn = json!({
        "compare": [{ "key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
        "success": [{ "request_put": { "key": k, "value": b64(me.as_bytes()), "lease": id } }],
        "failure": [{ "request_range": { "key": k } }],
    });
    let answer = etcd.call("/v3/kv/txn", &txn).await?;
    if answer["succeeded"].as_bool() == Some(true) {
        return Ok((true, Some(me.to_string())));
    }
    let kv = &answer["responses"][0]["response_range"]["kvs"][0];
    let holder = (!kv.is_null()).then(|| String::from_utf8_lossy(&unb64(&kv["value"])).into_owned());
    Ok((kv["lease"].as_str() == Some(id), holder))
}

/// A lease of `ttl`: its ID.
pub async fn grant(etcd: &Etcd, ttl: Duration) -> Result<String, EtcdError> {
    let grant = etcd.call("/v3/lease/grant", &json!({ "TTL": ttl.as_secs().max(1).to_string() })).await?;
    grant["ID"].as_str().map(str::to_string).ok_or_else(|| EtcdError::Answer("no lease granted".into()))
}

/// Renews lease `id` once; an error when it expired.
pub async fn renew(etcd: &Etcd, id: &str) -> Result<(), EtcdError> {
    let mut s = etcd.stream("/v3/lease/keepalive", &json!({ "ID": id })).await?;
    let answer = tokio::time::timeout(Duration::from_secs(5), s.next()).await.map_err(|_| EtcdError::Timeout("keep-alive".into()))??;
    // (A lease that expired answers with no TTL.)
    if answer.as_ref().and_then(|a| a["result"]["TTL"].as_str()).is_none_or(|t| t == "0") {
        return Err(EtcdError::Answer("the lease expired".into()));
    }
    Ok(())
}

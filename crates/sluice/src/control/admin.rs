//! The admin HTTP API, served on its own thread so a saturated data plane cannot starve it:
//! `/health`, `/metrics`, `/backends`, `/sessions`, `/digests` (`DELETE` forgets them),
//! `/rules`; `POST /backends/{name}/drain` and
//! `/undrain`, `POST /sessions/{id}/move[?to=backend]`. With `admin.token` set, every request
//! but `/health` and the dashboard's page needs `Authorization: Bearer <token>` (compared in
//! constant time). Requests a browser could be made to send by another site are refused.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::Serialize;

use crate::control;
use crate::ctx::Ctx;
use crate::metrics::MoveReason;

pub fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/backends", get(backends).post(add_backend))
        .route("/backends/{name}", axum::routing::delete(remove_backend))
        .route("/sessions", get(sessions))
        .route("/digests", get(digests).delete(reset_digests))
        .route("/rules", get(rules))
        .route("/config", get(config))
        .route("/config/reload", post(reload))
        .route("/upgrade", post(upgrade))
        .route("/cluster/instances", get(instances))
        .route("/cluster/failover", get(failover_state))
        .route("/cluster/switchover", post(switchover))
        .route("/capture", get(capture_status))
        .route("/capture/start", post(capture_start))
        .route("/capture/stop", post(capture_stop))
        .route("/capture/open", post(capture_open))
        .route("/sessions/{id}/move", post(move_session))
        .route("/sessions/{id}/kill", post(kill_session))
        .route("/backends/{name}/drain", post(drain))
        .route("/backends/{name}/undrain", post(undrain))
        .route("/backends/{name}/weight", post(set_weight))
        .layer(middleware::from_fn_with_state(ctx.clone(), require_token))
        // Open to whoever reaches the port: health (for load balancers and orchestrators), and
        // the dashboard's page and code, which hold no data (it asks the API, with the token).
        .route("/health", get(health))
        .route("/", get(dashboard))
        .route("/dashboard.js", get(|| asset("text/javascript; charset=utf-8", include_str!("../../assets/dashboard.js"))))
        .route("/dashboard.css", get(|| asset("text/css; charset=utf-8", include_str!("../../assets/dashboard.css"))))
        .layer(middleware::from_fn_with_state(ctx.clone(), same_site_only))
        .with_state(ctx)
}

/// The page's policy: its own script and style only, in no frame.
const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The web dashboard: one page, embedded in the binary, that fetches nothing but this API.
async fn dashboard() -> Response {
    asset("text/html; charset=utf-8", include_str!("../../assets/dashboard.html")).await
}

async fn asset(kind: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, kind),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    (headers, body).into_response()
}

/// What a browser can be made to send by a page of another site is refused: a `Host` that is
/// not an address, `localhost` or a name of `[admin] hosts` (DNS rebinding), an `Origin` that is
/// not the API's own, a cross-site fetch, and a mutation whose body is not JSON (a form or
/// `text/plain` POST needs no preflight; JSON does).
async fn same_site_only(State(ctx): State<Arc<Ctx>>, req: Request, next: Next) -> Response {
    let h = req.headers();
    let text = |name| h.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let host = text(header::HOST);
    if let Some(host) = host
        && !host_allowed(host, &ctx.config().admin.hosts)
    {
        return refuse(StatusCode::MISDIRECTED_REQUEST, "this Host is not one the admin API answers to ([admin] hosts)");
    }
    if let Some(origin) = text(header::ORIGIN)
        && host.is_none_or(|host| origin.strip_prefix("http://").or(origin.strip_prefix("https://")) != Some(host))
    {
        return refuse(StatusCode::FORBIDDEN, "a request from another origin");
    }
    if text(header::HeaderName::from_static("sec-fetch-site")).is_some_and(|s| s == "cross-site" || s == "same-site") {
        return refuse(StatusCode::FORBIDDEN, "a request from another site");
    }
    let mutation = !matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD);
    if mutation
        && !text(header::CONTENT_TYPE)
            .is_some_and(|t| t.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")))
    {
        return refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, "a request that changes anything must be JSON (Content-Type: application/json)");
    }
    next.run(req).await
}

/// A `Host` header the API answers to: an IP address, `localhost`, or one of `names`.
fn host_allowed(host: &str, names: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => return v6.split_once(']').is_some_and(|(a, _)| a.parse::<std::net::Ipv6Addr>().is_ok()),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || names.iter().any(|n| n.eq_ignore_ascii_case(name))
}

fn refuse(code: StatusCode, why: &str) -> Response {
    (code, Json(serde_json::json!({ "error": why }))).into_response()
}

async fn require_token(State(ctx): State<Arc<Ctx>>, req: Request, next: Next) -> Response {
    if let Some(token) = &ctx.config().admin.token {
        let given =
            req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
        if !sluice_proto::auth::verify_clear(token.as_bytes(), given.as_bytes()) {
            return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "missing or wrong bearer token\n").into_response();
        }
    }
    next.run(req).await
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    /// This process's id (it changes with an upgrade).
    pid: u32,
    reason: Option<String>,
    backends_up: usize,
    backends: usize,
    sessions: usize,
}

async fn health(State(ctx): State<Arc<Ctx>>) -> Response {
    let up = ctx.backends.list().iter().filter(|b| b.is_up()).count();
    let total = ctx.backends.list().len();
    let sessions = ctx.sessions.len();
    let (code, status, reason) = if ctx.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining", Some("shutting down: finishing open transactions".to_string()))
    } else if up == 0 {
        let why = ctx.backends.describe_unusable(&[]);
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Some(format!("no backend is up: {why}")))
    } else {
        (StatusCode::OK, "ready", None)
    };
    (code, Json(Health { status, pid: std::process::id(), reason, backends_up: up, backends: total, sessions })).into_response()
}

async fn metrics(State(ctx): State<Arc<Ctx>>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], ctx.metrics.render()).into_response()
}

#[derive(Serialize)]
pub(crate) struct BackendView {
    name: String,
    address: String,
    weight: u32,
    up: bool,
    reason: Option<String>,
    sessions: usize,
    /// Idle backend connections kept for reuse.
    pooled: usize,
    /// Logged-in connections multiplexed sessions gave back.
    spare: usize,
    /// Connections open under `max_backend_connections` (in use and spare).
    capped_open: usize,
    /// No new session comes here; sessions leave at their next safe point.
    draining: bool,
    /// Its status address (TiDB) reports it shutting down: as `draining`, until it serves again.
    closing: bool,
    /// What the latency-aware policy weighs: response time, a TiDB server's CPU and memory
    /// use, and the factor of the weight they give.
    load: crate::backend::load::View,
    checks: u64,
    consecutive_ok: u32,
    consecutive_fail: u32,
    state_for_seconds: u64,
    server_version: Option<String>,
    /// TLS to this backend: "auto", "on" or "off".
    tls: &'static str,
    /// Whether the backend's last greeting offered TLS.
    offers_tls: Option<bool>,
    /// Its configured part in replication: "auto", "primary" or "replica".
    role: &'static str,
    /// The part it plays now: "primary" or "replica".
    serves_as: &'static str,
    /// A replica the read/write split sends reads to now.
    serves_reads: bool,
    /// Why, as a replica, it serves no reads (down, draining, lag, replication stopped).
    reads_out: Option<String>,
    /// What the health checks' monitor user last read (absent without one).
    replication: Option<ReplicationView>,
    /// Why failover keeps it out of service (a replaced primary, a second writable server, a
    /// diverged one), until it is rejoined.
    fenced: Option<FenceView>,
}

#[derive(Serialize)]
struct FenceView {
    kind: crate::backend::FenceKind,
    reason: String,
    for_seconds: u64,
}

#[derive(Serialize)]
struct ReplicationView {
    read_only: Option<bool>,
    gtid_binlog_pos: String,
    /// Both replication threads run (absent: it replicates from nobody, or the status is
    /// unreadable).
    replicating: Option<bool>,
    /// `Seconds_Behind_Master`.
    lag_seconds: Option<u64>,
    /// The server it replicates from, `HOST:PORT`.
    source: Option<String>,
    /// The last replication error, or why the status could not be read.
    error: Option<String>,
}

fn replication_view(r: crate::backend::Replication) -> Option<ReplicationView> {
    if r.read_only.is_none() && r.unreadable.is_none() {
        return None; // never observed: no monitor user, or no check yet
    }
    let error = r.unreadable.or_else(|| r.replica.as_ref().map(|s| s.last_error.clone()).filter(|e| !e.is_empty()));
    Some(ReplicationView {
        read_only: r.read_only,
        gtid_binlog_pos: r.gtid_binlog_pos,
        replicating: r.replica.as_ref().map(|s| s.running),
        lag_seconds: r.replica.as_ref().and_then(|s| s.seconds_behind),
        source: r.replica.map(|s| s.source),
        error,
    })
}

/// Why a replica serves no reads of the split (None: it does, or it is no replica).
fn reads_out(b: &crate::backend::Backend) -> Option<String> {
    if b.serves_as() != crate::config::Role::Replica || b.fit_for_reads() {
        return None;
    }
    b.why_unusable().or_else(|| b.replication.lock().reads_out.clone())
}

async fn backends(State(ctx): State<Arc<Ctx>>) -> Json<Vec<BackendView>> {
    Json(backend_views(&ctx))
}

/// Each backend as `/backends` (and the SQL admin's `backends` table) shows it.
pub(crate) fn backend_views(ctx: &Ctx) -> Vec<BackendView> {
    ctx.backends
        .list()
        .iter()
        .map(|b| {
            let h = b.health.lock().clone();
            let info = b.info.lock().clone();
            let (spare, capped_open) = b.shared.counts();
            BackendView {
                name: b.name.clone(),
                address: b.address.to_string(),
                weight: b.weight(),
                up: b.is_up(),
                reason: h.reason,
                sessions: b.sessions.load(Ordering::Relaxed),
                pooled: b.pooled(),
                spare,
                capped_open,
                draining: b.is_draining(),
                closing: b.is_closing(),
                load: b.load.view(),
                checks: h.checks,
                consecutive_ok: h.consecutive_ok,
                consecutive_fail: h.consecutive_fail,
                state_for_seconds: h.since.elapsed().as_secs(),
                server_version: info.as_ref().map(|i| String::from_utf8_lossy(&i.version).into_owned()),
                tls: b.tls.mode.as_str(),
                offers_tls: info.map(|i| i.capabilities & sluice_proto::consts::cap::SSL != 0),
                role: b.role.name(),
                serves_as: b.serves_as().name(),
                serves_reads: b.fit_for_reads(),
                reads_out: reads_out(b),
                replication: replication_view(b.replication.lock().clone()),
                fenced: b.fence().map(|f| FenceView {
                    kind: f.kind,
                    reason: f.reason,
                    for_seconds: f.since.elapsed().map_or(0, |d| d.as_secs()),
                }),
            }
        })
        .collect()
}

#[derive(serde::Deserialize)]
struct DigestQuery {
    top: Option<usize>,
    by: Option<String>,
}

/// `/digests?top=20&by=total_time` (or count, errors, rows, max, p99, last_seen).
async fn digests(State(ctx): State<Arc<Ctx>>, Query(q): Query<DigestQuery>) -> Response {
    let by = q.by.as_deref().unwrap_or("total_time");
    let Some(order) = crate::route::digest::By::parse(by) else {
        let msg = format!("by={by}: use total_time, count, errors, rows, max, p99 or last_seen");
        return (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": msg }))).into_response();
    };
    let d = &ctx.digests;
    let top = d.top(q.top.unwrap_or(20), order);
    Json(serde_json::json!({ "enabled": d.enabled, "tracked": d.tracked(), "evictions": d.evictions(), "digests": top })).into_response()
}

async fn reset_digests(State(ctx): State<Arc<Ctx>>) -> StatusCode {
    ctx.digests.reset();
    StatusCode::NO_CONTENT
}

/// The query rules in order, with their hits.
async fn rules(State(ctx): State<Arc<Ctx>>) -> Json<Vec<serde_json::Value>> {
    let list = ctx.rules.list.iter().map(|r| serde_json::json!({ "name": r.name, "hits": r.hits.get(), "timeouts": r.timeouts.get() }));
    Json(list.collect())
}

async fn sessions(State(ctx): State<Arc<Ctx>>) -> Json<Vec<crate::session::SessionInfo>> {
    Json(ctx.sessions.all().iter().map(|h| h.snapshot()).collect())
}

fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, Json(serde_json::json!({ "error": what }))).into_response()
}

#[derive(serde::Deserialize)]
struct MoveTo {
    to: Option<String>,
}

/// Asks a session to move at its next safe point, to the backend named (another one if none).
async fn move_session(State(ctx): State<Arc<Ctx>>, Path(id): Path<u32>, Query(q): Query<MoveTo>) -> Response {
    let Some(h) = ctx.sessions.get(id) else { return not_found(format!("no session {id}")) };
    let to = match &q.to {
        None => None,
        Some(name) => match ctx.backends.by_name(name).as_ref() {
            Some(b) if b.is_usable() => Some(b.index),
            Some(b) => {
                let why = b.why_unusable().unwrap_or_default();
                return (StatusCode::CONFLICT, Json(serde_json::json!({ "error": format!("backend {name} is {why}") }))).into_response();
            }
            None => return not_found(format!("no backend {name}")),
        },
    };
    h.ask_move(to, MoveReason::Request);
    let pins: Vec<&str> = h.snapshot().pins.iter().map(|p| p.as_str()).collect();
    let body = serde_json::json!({ "session": id, "to": q.to, "pins": pins, "moves": "at its next safe point" });
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// Closes a session: at once when it waits for a command, else once its command is through.
async fn kill_session(State(ctx): State<Arc<Ctx>>, Path(id): Path<u32>) -> Response {
    let Some(h) = ctx.sessions.get(id) else { return not_found(format!("no session {id}")) };
    h.kill();
    (StatusCode::OK, Json(serde_json::json!({ "session": id, "killed": true }))).into_response()
}

/// Drains a backend: no new session goes there, and every session on it moves at its next safe
/// point; those that cannot move (passthrough) are closed at their next safe point once
/// `drain_timeout` passed.
async fn drain(State(ctx): State<Arc<Ctx>>, Path(name): Path<String>) -> Response {
    let Some(b) = ctx.backends.by_name(&name) else { return not_found(format!("no backend {name}")) };
    let asked = control::start_drain(&ctx, &b);
    (StatusCode::ACCEPTED, Json(serde_json::json!({ "backend": name, "draining": true, "sessions": asked }))).into_response()
}

/// What failover knows: the primary, its last position seen, and the operations made or refused.
async fn failover_state(State(ctx): State<Arc<Ctx>>) -> Json<serde_json::Value> {
    let c = ctx.config();
    let t = &ctx.backends.topology;
    let primary = t.primary().and_then(|i| ctx.backends.get(i)).map(|b| b.name.clone());
    Json(serde_json::json!({
        "enabled": c.failover.enabled,
        "manages": c.failover.manages(),
        "primary": primary,
        "acting": c.cluster.etcd.is_empty() || t.leads(),
        "leader": t.lead().leader,
        "last_seen": t.last_seen().to_string(),
        "events": t.events(),
    }))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchTo {
    to: String,
}

/// Makes the backend named the primary; answers once it is (or why it is not).
async fn switchover(State(ctx): State<Arc<Ctx>>, Json(s): Json<SwitchTo>) -> Response {
    match crate::control::failover::switchover(&ctx, &s.to).await {
        Ok(message) => (StatusCode::OK, Json(serde_json::json!({ "primary": s.to, "message": message }))).into_response(),
        Err(e) => {
            let status = match e {
                crate::control::failover::SwitchoverError::Refused(_) => StatusCode::CONFLICT,
                crate::control::failover::SwitchoverError::Failed(_) => StatusCode::BAD_GATEWAY,
            };
            (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
        }
    }
}

/// A backend to add at run time, as in `[[backends]]`.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct NewBackend {
    address: String,
    name: Option<String>,
    weight: Option<u32>,
    tls: Option<String>,
    tls_skip_verify: Option<bool>,
    role: Option<crate::config::Role>,
}

fn bad_request(what: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": what }))).into_response()
}

/// Adds a backend: it takes new sessions at once (and its share of the others, by rebalancing),
/// and is checked like the configured ones.
async fn add_backend(State(ctx): State<Arc<Ctx>>, Json(nb): Json<NewBackend>) -> Response {
    let text = match toml::to_string(&nb) {
        Ok(t) => t,
        Err(e) => return bad_request(e.to_string()),
    };
    let c: crate::config::BackendConfig = match toml::from_str(&text) {
        Ok(c) => c,
        Err(e) => return bad_request(e.message().to_string()),
    };
    let name = c.display_name();
    if ctx.backends.by_name(&name).is_some() {
        return (StatusCode::CONFLICT, Json(serde_json::json!({ "error": format!("backend {name} exists") }))).into_response();
    }
    if c.weight == 0 {
        return bad_request("weight must be at least 1".into());
    }
    if c.tls_mode(&ctx.config().proxy) == crate::config::BackendTls::On && !c.tls_skip_verify {
        return bad_request("TLS \"on\" needs tls_skip_verify here (a CA bundle is set in the configuration file)".into());
    }
    let b = match control::add_backend(&ctx, &c) {
        Ok(b) => b,
        Err(e) => return bad_request(e.to_string()),
    };
    (StatusCode::CREATED, Json(serde_json::json!({ "backend": name, "address": b.address.to_string() }))).into_response()
}

/// Removes a backend: drains it, and takes it out once its sessions left (or, for those that
/// could not, once `drain_timeout` passed).
async fn remove_backend(State(ctx): State<Arc<Ctx>>, Path(name): Path<String>) -> Response {
    let Some(b) = ctx.backends.by_name(&name) else { return not_found(format!("no backend {name}")) };
    let asked = control::remove_backend(&ctx, &b);
    (StatusCode::ACCEPTED, Json(serde_json::json!({ "backend": name, "removing": true, "sessions": asked }))).into_response()
}

#[derive(serde::Deserialize)]
struct Weight {
    value: u32,
}

/// Changes a backend's weight; the rebalancer moves sessions to the new shares.
async fn set_weight(State(ctx): State<Arc<Ctx>>, Path(name): Path<String>, Query(w): Query<Weight>) -> Response {
    let Some(b) = ctx.backends.by_name(&name) else { return not_found(format!("no backend {name}")) };
    if w.value == 0 {
        return bad_request("weight must be at least 1".into());
    }
    b.set_weight(w.value);
    tracing::info!(backend = %name, weight = w.value, "backend weight changed");
    (StatusCode::OK, Json(serde_json::json!({ "backend": name, "weight": w.value }))).into_response()
}

/// Ends a drain: the backend takes new sessions again; moves not made yet are called off.
async fn undrain(State(ctx): State<Arc<Ctx>>, Path(name): Path<String>) -> Response {
    let Some(b) = ctx.backends.by_name(&name) else { return not_found(format!("no backend {name}")) };
    control::undrain(&ctx, &b);
    (StatusCode::OK, Json(serde_json::json!({ "backend": name, "draining": false }))).into_response()
}

/// Starts a traffic capture (`crate::capture::Options` as JSON).
/// The configuration in force (secrets masked), and when it was loaded.
async fn config(State(ctx): State<Arc<Ctx>>) -> Response {
    let body = serde_json::json!({
        "loaded_at_ms": ctx.config.loaded_at_ms(),
        "reloads": ctx.config.reloads(),
        "tls_certificate_sha256": ctx.tls.fingerprint(),
        "config": &**ctx.config(),
    });
    Json(body).into_response()
}

/// Reads the configuration again and applies it (`crate::control::reload`); 400 with the reasons when
/// it is refused (the configuration in force stays).
async fn reload(State(ctx): State<Arc<Ctx>>) -> Response {
    match crate::control::reload::reload(&ctx) {
        Ok(out) => Json(out).into_response(),
        Err(refused) => {
            tracing::warn!(errors = %refused, "configuration reload refused");
            (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": refused.to_string(), "errors": refused.lines() }))).into_response()
        }
    }
}

/// The instances registered in the cluster's store (`[cluster]`).
async fn instances(State(ctx): State<Arc<Ctx>>) -> Response {
    if ctx.config().cluster.etcd.is_empty() {
        return not_found("no [cluster] is configured".into());
    }
    match crate::control::cluster::instances(&ctx).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => (StatusCode::BAD_GATEWAY, Json(serde_json::json!({ "error": e.to_string() }))).into_response(),
    }
}

/// Starts the new binary and hands it the listening sockets (`crate::control::upgrade`); answers once
/// it accepts, with its process id, or with why it failed (this process then goes on).
/// The binary is the one sluice was started from, as it is on disk now: the API names no
/// other (it would run any program it was told of).
async fn upgrade(State(ctx): State<Arc<Ctx>>) -> Response {
    match ctx.upgrades.ask().await {
        Ok(pid) => Json(serde_json::json!({ "new_pid": pid, "old_pid": std::process::id() })).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() }))).into_response(),
    }
}

async fn capture_start(State(ctx): State<Arc<Ctx>>, Json(opts): Json<crate::capture::Options>) -> Response {
    if let Err(e) = opts.check() {
        return bad_request(e.to_string());
    }
    let config = ctx.config().capture.clone();
    if opts.name.starts_with('/') && !config.allow_absolute_paths {
        return bad_request(format!("{}: a capture is named, not given a path ([capture] allow_absolute_paths is off)", opts.name));
    }
    let backends = ctx
        .backends
        .list()
        .iter()
        .map(|b| crate::capture::BackendInfo {
            name: b.name.clone(),
            address: b.address.to_string(),
            version: b.info.lock().as_ref().map(|i| String::from_utf8_lossy(&i.version).into_owned()),
        })
        .collect();
    let c = ctx.clone();
    let gate = opts.consistent.then(|| opts.gate_timeout.unwrap_or(crate::capture::GATE_TIMEOUT));
    match tokio::task::spawn_blocking(move || c.capture.start(opts, &config, backends)).await {
        Ok(Ok(status)) => match gate {
            Some(limit) => gate_closed(&ctx, status, limit).await,
            None => (StatusCode::CREATED, Json(status)).into_response(),
        },
        Ok(Err(e)) => (StatusCode::CONFLICT, Json(serde_json::json!({ "error": e.to_string() }))).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() }))).into_response(),
    }
}

/// Stops the running capture once its files are complete; its final status.
async fn capture_stop(State(ctx): State<Arc<Ctx>>) -> Response {
    let c = ctx.clone();
    match tokio::task::spawn_blocking(move || c.capture.stop()).await {
        Ok(Some(status)) => Json(status).into_response(),
        Ok(None) => not_found("no capture has run".into()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() }))).into_response(),
    }
}

async fn capture_status(State(ctx): State<Arc<Ctx>>) -> Json<crate::capture::Status> {
    Json(ctx.capture.status())
}

/// A consistent start: waits until no session runs anything (each is held at the gate, or idle
/// outside a transaction), then answers with state "gated"; a copy of the data taken now is
/// what the capture starts from. Sessions still busy after `limit` fail the start.
async fn gate_closed(ctx: &Arc<Ctx>, mut status: crate::capture::Status, limit: std::time::Duration) -> Response {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let mut busy = Vec::new();
        ctx.sessions.for_each(|h| {
            let in_trans = h.status.load(Ordering::Relaxed) & sluice_proto::consts::status::IN_TRANS != 0;
            if !h.gated.load(Ordering::Relaxed) && (h.busy.load(Ordering::Relaxed) || in_trans) {
                busy.push(h.id);
            }
        });
        if busy.is_empty() {
            status.state = "gated".into();
            return (StatusCode::CREATED, Json(status)).into_response();
        }
        if tokio::time::Instant::now() >= deadline {
            let c = ctx.clone();
            let _ = tokio::task::spawn_blocking(move || c.capture.stop()).await;
            let msg =
                format!("sessions {busy:?} were still running a statement or a transaction after {limit:?}: the capture did not start");
            return (StatusCode::CONFLICT, Json(serde_json::json!({ "error": msg }))).into_response();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Opens the gate of a consistent start: recording begins.
async fn capture_open(State(ctx): State<Arc<Ctx>>) -> Response {
    match ctx.capture.open() {
        Ok(()) => Json(ctx.capture.status()).into_response(),
        Err(e) => (StatusCode::CONFLICT, Json(serde_json::json!({ "error": e.to_string() }))).into_response(),
    }
}

/// Serves the admin API on `l` until `stop` resolves: at most `[admin] max_connections` at once
/// (more wait in the backlog), one request per connection, its head within `request_timeout`
/// and the whole exchange within 12 times that, so that idle or slow connections cannot hold
/// descriptors or the API.
pub async fn serve(ctx: Arc<Ctx>, l: tokio::net::TcpListener, stop: impl std::future::Future<Output = ()>) {
    let app = router(ctx.clone());
    let (max, timeout) = (ctx.config().admin.max_connections.max(1), ctx.config().admin.request_timeout);
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    let mut backoff = crate::net::AcceptBackoff::default();
    tokio::pin!(stop);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (stream, _) = tokio::select! {
            r = l.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    backoff.failed(&e, &ctx.metrics.accept_errors).await;
                    continue;
                }
            },
            _ = &mut stop => return,
        };
        backoff.succeeded();
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(timeout)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(timeout * 12, conn).await;
            drop(slot);
        });
    }
}

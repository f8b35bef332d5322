//! The admin HTTP API, served on its own thread so a saturated data plane cannot starve it:
//! `/health`, `/metrics`, `/backends`, `/sessions`. With `admin.token` set, every request
//! needs `Authorization: Bearer <token>` (compared in constant time).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;

use crate::ctx::Ctx;

pub fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/backends", get(backends))
        .route("/sessions", get(sessions))
        .layer(middleware::from_fn_with_state(ctx.clone(), require_token))
        .with_state(ctx)
}

async fn require_token(State(ctx): State<Arc<Ctx>>, req: Request, next: Next) -> Response {
    if let Some(token) = &ctx.config.admin.token {
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
    reason: Option<String>,
    backends_up: usize,
    backends: usize,
    sessions: usize,
}

async fn health(State(ctx): State<Arc<Ctx>>) -> Response {
    let up = ctx.backends.list.iter().filter(|b| b.is_up()).count();
    let total = ctx.backends.list.len();
    let sessions = ctx.sessions.len();
    let (code, status, reason) = if ctx.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining", Some("shutting down: finishing open transactions".to_string()))
    } else if up == 0 {
        let why = ctx.backends.describe_unusable(&[]);
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Some(format!("no backend is up: {why}")))
    } else {
        (StatusCode::OK, "ready", None)
    };
    (code, Json(Health { status, reason, backends_up: up, backends: total, sessions })).into_response()
}

async fn metrics(State(ctx): State<Arc<Ctx>>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], ctx.metrics.render()).into_response()
}

#[derive(Serialize)]
struct BackendView {
    name: String,
    address: String,
    weight: u32,
    up: bool,
    reason: Option<String>,
    sessions: usize,
    /// Idle backend connections kept for reuse.
    pooled: usize,
    checks: u64,
    consecutive_ok: u32,
    consecutive_fail: u32,
    state_for_seconds: u64,
    server_version: Option<String>,
    /// TLS to this backend: "auto", "on" or "off".
    tls: &'static str,
    /// Whether the backend's last greeting offered TLS.
    offers_tls: Option<bool>,
}

async fn backends(State(ctx): State<Arc<Ctx>>) -> Json<Vec<BackendView>> {
    Json(
        ctx.backends
            .list
            .iter()
            .map(|b| {
                let h = b.health.lock().clone();
                let info = b.info.lock().clone();
                BackendView {
                    name: b.name.clone(),
                    address: b.address.to_string(),
                    weight: b.weight,
                    up: b.is_up(),
                    reason: h.reason,
                    sessions: b.sessions.load(Ordering::Relaxed),
                    pooled: b.pooled(),
                    checks: h.checks,
                    consecutive_ok: h.consecutive_ok,
                    consecutive_fail: h.consecutive_fail,
                    state_for_seconds: h.since.elapsed().as_secs(),
                    server_version: info.as_ref().map(|i| String::from_utf8_lossy(&i.version).into_owned()),
                    tls: b.tls.mode.as_str(),
                    offers_tls: info.map(|i| i.capabilities & sluice_proto::consts::cap::SSL != 0),
                }
            })
            .collect(),
    )
}

async fn sessions(State(ctx): State<Arc<Ctx>>) -> Json<Vec<crate::session::SessionInfo>> {
    Json(ctx.sessions.all().iter().map(|h| h.snapshot()).collect())
}

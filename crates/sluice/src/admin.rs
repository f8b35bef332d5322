//! The admin HTTP API, served on its own thread so a saturated data plane cannot starve it:
//! `/health`, `/metrics`, `/backends`, `/sessions`; `POST /backends/{name}/drain` and
//! `/undrain`, `POST /sessions/{id}/move[?to=backend]`. With `admin.token` set, every request
//! needs `Authorization: Bearer <token>` (compared in constant time).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::Serialize;

use crate::ctx::Ctx;
use crate::metrics::MoveReason;

pub fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/backends", get(backends))
        .route("/sessions", get(sessions))
        .route("/sessions/{id}/move", post(move_session))
        .route("/backends/{name}/drain", post(drain))
        .route("/backends/{name}/undrain", post(undrain))
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
    /// Logged-in connections multiplexed sessions gave back.
    spare: usize,
    /// Connections open under `max_backend_connections` (in use and spare).
    capped_open: usize,
    /// No new session comes here; sessions leave at their next safe point.
    draining: bool,
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
                let (spare, capped_open) = b.shared.counts();
                BackendView {
                    name: b.name.clone(),
                    address: b.address.to_string(),
                    weight: b.weight,
                    up: b.is_up(),
                    reason: h.reason,
                    sessions: b.sessions.load(Ordering::Relaxed),
                    pooled: b.pooled(),
                    spare,
                    capped_open,
                    draining: b.is_draining(),
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
        Some(name) => match ctx.backends.list.iter().find(|b| b.name == *name) {
            Some(b) if b.is_usable() => Some(b.index),
            Some(b) => {
                let why = if b.is_draining() { "draining".to_string() } else { format!("down: {}", b.out_reason()) };
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

/// Drains a backend: no new session goes there, and every session on it moves at its next safe
/// point; those that cannot move (passthrough) are closed at their next safe point once
/// `drain_timeout` passed.
async fn drain(State(ctx): State<Arc<Ctx>>, Path(name): Path<String>) -> Response {
    let Some(b) = ctx.backends.list.iter().find(|b| b.name == name).cloned() else { return not_found(format!("no backend {name}")) };
    b.set_draining(true);
    let mut asked = 0;
    ctx.sessions.for_each(|h| {
        if h.backend_index.load(Ordering::Relaxed) as usize == b.index {
            h.ask_move(None, MoveReason::Drain);
            asked += 1;
        }
    });
    tracing::info!(backend = %b.name, sessions = asked, "draining backend");
    // Once drain_timeout passed, the sessions that could not move are woken to close.
    let (ctx2, b2) = (ctx.clone(), b.clone());
    tokio::spawn(async move {
        tokio::time::sleep(ctx2.config.proxy.drain_timeout).await;
        if b2.is_draining() {
            ctx2.sessions.for_each(|h| {
                if h.backend_index.load(Ordering::Relaxed) as usize == b2.index {
                    h.wake.notify();
                }
            });
        }
    });
    (StatusCode::ACCEPTED, Json(serde_json::json!({ "backend": name, "draining": true, "sessions": asked }))).into_response()
}

/// Ends a drain: the backend takes new sessions again; moves not made yet are called off.
async fn undrain(State(ctx): State<Arc<Ctx>>, Path(name): Path<String>) -> Response {
    let Some(b) = ctx.backends.list.iter().find(|b| b.name == name).cloned() else { return not_found(format!("no backend {name}")) };
    b.set_draining(false);
    ctx.sessions.for_each(|h| {
        if h.backend_index.load(Ordering::Relaxed) as usize == b.index {
            h.cancel_move(MoveReason::Drain);
        }
    });
    (StatusCode::OK, Json(serde_json::json!({ "backend": name, "draining": false }))).into_response()
}

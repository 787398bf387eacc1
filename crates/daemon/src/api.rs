//! The HTTP side (axum): JSON API under /api/v1 (docs/api.yaml), Prometheus
//! /metrics, the sample stream (server-sent events) and the dashboard page.
//!
//! Reads come from the view the control thread publishes; changes go to the
//! control thread as commands and are answered once it has checked and
//! applied them, so a refused change changes nothing. Changes need the unix
//! socket (its file permissions) or the bearer token of the config.

use crate::limits::{bound_requests, Limits, MAX_BODY_BYTES};
use crate::service::{Command, Patch, PatchError, Shared};
use crate::view::{Point, TenantList};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Extension, Json, Router};
use futures_util::StreamExt;
use iofloor_core::units::quantity::RateQ;
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

const DASHBOARD: &str = include_str!("../assets/dashboard.html");

/// How long a change may wait for the control thread (it handles commands
/// between intervals, at once; this bounds a wedged backend call).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct ApiState {
    pub shared: Arc<Shared>,
    pub commands: Sender<Command>,
    /// Requests over the unix socket may change state without a token.
    pub via_unix: bool,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    ApiError::new(status, message).into_response()
}

/// A request refused before it reached the control thread: its status and
/// the message the body carries as `{"error": ...}`.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {message}")]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

/// The API of one listener, with its own bounds (crate::limits): a flood on
/// the TCP port leaves the unix socket's room for changes untouched.
pub fn router(state: ApiState) -> Router {
    let limits = Limits::default();
    Router::new()
        .route("/", get(|| async { Html(DASHBOARD) }))
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(status))
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/cluster/floors", get(cluster_floors))
        .route(
            "/api/v1/cluster/floors/{*tenant}",
            axum::routing::put(put_cluster_floor).delete(delete_cluster_floor),
        )
        .route("/api/v1/tenants", get(tenants))
        .route("/api/v1/tenants/{*name}", get(tenant).patch(patch_tenant))
        .route("/api/v1/admission", get(admission))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/samples", get(samples))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such path; see docs/api.yaml") })
        .with_state(state)
        .layer(middleware::from_fn_with_state(
            limits.clone(),
            bound_requests,
        ))
        .layer(Extension(limits))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// OpenMetrics for scrapers that ask for it (Prometheus does), else the
/// classic text format.
async fn metrics(State(s): State<ApiState>, headers: HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("application/openmetrics-text") {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            s.shared.metrics.encode(),
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            s.shared.metrics.encode_classic(),
        )
            .into_response()
    }
}

/// The cluster's reader, or the answer for a host that has none.
fn cluster_reader(
    state: &ApiState,
) -> Result<iofloor_cluster::ClusterReader<iofloor_cluster::Etcd>, ApiError> {
    let Some(link) = &state.shared.cluster else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not in cluster mode: the config has no [cluster] section",
        ));
    };
    let reader = link
        .reader
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    reader.ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not joined to the cluster yet",
        )
    })
}

fn etcd_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("etcd did not answer: {e}"),
    )
}

/// A change to the cluster: authorised as every change is, on an agent.
fn changing_cluster(
    state: &ApiState,
    headers: &HeaderMap,
) -> Result<iofloor_cluster::ClusterReader<iofloor_cluster::Etcd>, ApiError> {
    authorise(state, headers)?;
    cluster_reader(state)
}

/// The whole cluster (every host's tenants of the shared device), read
/// from etcd now: any agent answers.
async fn cluster(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let view = cluster_reader(&state)?.read().await.map_err(etcd_error)?;
    Ok(Json(view).into_response())
}

/// The floors set for the whole cluster.
async fn cluster_floors(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let floors = cluster_reader(&state)?.floors().await.map_err(etcd_error)?;
    let floors: Vec<_> = floors
        .into_iter()
        .map(|(tenant, floor)| json!({ "tenant": tenant, "floor": floor }))
        .collect();
    Ok(Json(json!({ "floors": floors })).into_response())
}

/// Sets a tenant's floor for the whole cluster (`{"floor": "500 IOPS"}`, or
/// `null` for none whatever the host files say), refused with 409 when the
/// floors of every host would no longer fit the shared device.
async fn put_cluster_floor(
    State(s): State<ApiState>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let reader = changing_cluster(&s, &headers)?;
    let body = body.map_err(rejected)?;
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, m);
    let patch = parse_patch(&body).map_err(|e| bad(e.to_string()))?;
    let (Some(floor), None, None) = (patch.floor, patch.ceiling, patch.weight) else {
        return Err(bad(
            "only `floor` is set for the whole cluster (ceilings and weights stay in the host files)"
                .into(),
        ));
    };
    iofloor_core::model::check_promise(floor, None, None).map_err(|e| bad(e.to_string()))?;
    let (before, after) = reader
        .floor_admission(&tenant, floor)
        .await
        .map_err(etcd_error)?;
    // A change that adds to floors that do not fit is refused; one that
    // lowers them is always taken, even on an overcommitted device.
    let overfull = after.total_floor_cost > after.usable_capacity * (1.0 + 1e-9);
    if overfull && after.total_floor_cost > before.total_floor_cost + 1e-12 {
        let view = crate::view::AdmissionView::new(reader.device(), &after);
        return Ok((
            StatusCode::CONFLICT,
            Json(json!({
                "error": format!(
                    "refused: the floors of every host would not fit the shared device: {}",
                    view.summary
                ),
                "admission": view,
            })),
        )
            .into_response());
    }
    reader
        .set_floor(&tenant, Some(floor))
        .await
        .map_err(etcd_error)?;
    tracing::info!(tenant = %tenant, floor = ?floor, "floor set for the whole cluster");
    Ok(Json(json!({ "tenant": tenant, "floor": floor, "set": true })).into_response())
}

/// Removes a tenant's cluster floor: the host files' floors apply again.
async fn delete_cluster_floor(
    State(s): State<ApiState>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let reader = changing_cluster(&s, &headers)?;
    reader.set_floor(&tenant, None).await.map_err(etcd_error)?;
    tracing::info!(tenant = %tenant, "cluster floor removed: the host files' floors apply");
    Ok(Json(json!({ "tenant": tenant, "floor": null, "set": false })).into_response())
}

// The handlers copy what they answer under the view's lock and serialise
// after letting go of it: the control thread takes the same lock to publish
// each interval, and must never wait on a client's JSON.

async fn status(State(s): State<ApiState>) -> Response {
    let mut status = s.shared.view.lock().unwrap().status.clone();
    // Read outside the lock: it walks the allocator's free lists.
    status.heap = crate::memory::Heap::read();
    Json(status).into_response()
}

async fn tenants(State(s): State<ApiState>) -> Response {
    let list = {
        let v = s.shared.view.lock().unwrap();
        TenantList {
            now: v.now,
            interval_s: v.status.interval_s,
            tenants: v.tenants.values().cloned().collect(),
        }
    };
    Json(list).into_response()
}

async fn tenant(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let seconds = match q.get("seconds").map(|v| v.parse::<u64>()) {
        None => None,
        Some(Ok(n)) => Some(n as f64),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "`seconds` must be a non-negative whole number",
            )
        }
    };
    if let Some(other) = q.keys().find(|k| k.as_str() != "seconds") {
        return error(
            StatusCode::BAD_REQUEST,
            format!("unknown query parameter `{other}`"),
        );
    }
    let (t, history) = {
        let v = s.shared.view.lock().unwrap();
        let Some(t) = v.tenants.get(&name) else {
            return error(StatusCode::NOT_FOUND, format!("no tenant `{name}`"));
        };
        let since = seconds.map(|n| v.now - n).unwrap_or(f64::NEG_INFINITY);
        let history: Vec<Point> = v
            .history
            .get(&name)
            .map(|h| h.iter().filter(|p| p.t >= since).copied().collect())
            .unwrap_or_default();
        (t.clone(), history)
    };
    let mut body = serde_json::to_value(t).expect("a tenant view serialises");
    body["history"] = serde_json::to_value(history).expect("points serialise");
    Json(body).into_response()
}

async fn admission(State(s): State<ApiState>) -> Response {
    let devices = s.shared.view.lock().unwrap().admission.clone();
    Json(json!({ "devices": devices })).into_response()
}

/// A body axum would not take (past the size bound: 413), as the API's JSON
/// error rather than axum's plain text.
fn rejected(r: BytesRejection) -> ApiError {
    ApiError::new(r.status(), r.body_text())
}

/// Checks the caller may change state: over the unix socket, or with the
/// configured bearer token (compared in constant time).
fn authorise(s: &ApiState, headers: &HeaderMap) -> Result<(), ApiError> {
    if s.via_unix {
        return Ok(());
    }
    let Some(token) = s.shared.token.lock().unwrap().clone() else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "changes need `api.token` in the config, or the unix socket (`api.unix_socket`)",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Constant time over the token's bytes (a length mismatch is not secret).
    let ok = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())));
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token",
        ))
    }
}

/// A PATCH body: each field absent (unchanged), null (cleared; not for
/// `weight`) or a value. Rates are written as in the config (`"500 IOPS"`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchBody {
    #[serde(default, deserialize_with = "present")]
    floor: Option<Option<RateQ>>,
    #[serde(default, deserialize_with = "present")]
    ceiling: Option<Option<RateQ>>,
    weight: Option<f64>,
}

/// Tells a field given as null (`Some(None)`) from one left out (`None`, by
/// `#[serde(default)]`), which serde's `Option` alone cannot.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Why a PATCH body was refused: each is a 400 that names the field.
#[derive(Debug, thiserror::Error)]
pub enum PatchBodyError {
    #[error("body must be a JSON object")]
    NotAnObject,
    #[error("body is not JSON: {source}")]
    NotJson {
        #[source]
        source: serde_json::Error,
    },
    /// JSON, but not the shape of a patch as a whole.
    #[error("body: {source}")]
    Body {
        #[source]
        source: serde_json::Error,
    },
    /// JSON, but one field is not what a patch takes.
    #[error("`{field}`: {source}")]
    Field {
        field: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("body names nothing to change (floor, ceiling, weight)")]
    NothingToChange,
    #[error(transparent)]
    Promise(#[from] iofloor_core::ValidationError),
}

impl From<serde_path_to_error::Error<serde_json::Error>> for PatchBodyError {
    fn from(e: serde_path_to_error::Error<serde_json::Error>) -> PatchBodyError {
        let field = e.path().to_string();
        let source = e.into_inner();
        if source.is_syntax() || source.is_eof() {
            return PatchBodyError::NotJson { source };
        }
        // serde_path_to_error names the body itself `.`.
        match field.as_str() {
            "." => PatchBodyError::Body { source },
            _ => PatchBodyError::Field { field, source },
        }
    }
}

/// Parses a PATCH body; every problem is a message for a 400 naming the field.
pub fn parse_patch(body: &[u8]) -> Result<Patch, PatchBodyError> {
    // serde would also take a struct from an array of its fields in order.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(PatchBodyError::NotAnObject);
    }
    let mut json = serde_json::Deserializer::from_slice(body);
    let parsed: PatchBody = serde_path_to_error::deserialize(&mut json)?;
    json.end()
        .map_err(|source| PatchBodyError::NotJson { source })?;
    if parsed.floor.is_none() && parsed.ceiling.is_none() && parsed.weight.is_none() {
        return Err(PatchBodyError::NothingToChange);
    }
    iofloor_core::model::check_promise(None, None, parsed.weight)?;
    let rate = |r: Option<Option<RateQ>>| r.map(|r| r.map(|q| q.0));
    Ok(Patch {
        floor: rate(parsed.floor),
        ceiling: rate(parsed.ceiling),
        weight: parsed.weight,
    })
}

async fn send<T>(
    s: &ApiState,
    make: impl FnOnce(tokio::sync::oneshot::Sender<T>) -> Command,
) -> Result<T, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    s.commands.send(make(tx)).map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the controller is shutting down",
        )
    })?;
    match tokio::time::timeout(COMMAND_TIMEOUT, rx).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the controller is shutting down",
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the controller did not answer in time",
        )),
    }
}

async fn patch_tenant(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if let Err(r) = authorise(&s, &headers) {
        return r.into_response();
    }
    let body = match body {
        Ok(b) => b,
        Err(r) => return rejected(r).into_response(),
    };
    let patch = match parse_patch(&body) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match send(&s, |reply| Command::Patch {
        tenant: name,
        patch,
        reply,
    })
    .await
    {
        Err(r) => r.into_response(),
        Ok(Ok(view)) => Json(view).into_response(),
        Ok(Err(PatchError::NotFound(m))) => error(StatusCode::NOT_FOUND, m),
        Ok(Err(PatchError::Invalid(m))) => error(StatusCode::BAD_REQUEST, m),
        Ok(Err(PatchError::Refused { message, admission })) => (
            StatusCode::CONFLICT,
            Json(json!({ "error": message, "admission": admission })),
        )
            .into_response(),
    }
}

async fn reload(State(s): State<ApiState>, headers: HeaderMap) -> Response {
    if let Err(r) = authorise(&s, &headers) {
        return r.into_response();
    }
    match send(&s, |reply| Command::Reload { reply: Some(reply) }).await {
        Err(r) => r.into_response(),
        Ok(Ok(message)) => Json(json!({ "ok": true, "message": message })).into_response(),
        Ok(Err(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// The event stream of ticks. The control thread sends into a bounded
/// broadcast and never waits; a subscriber that falls behind by the whole
/// buffer (16 ticks) is dropped, not buffered for: its client reconnects
/// (EventSource does) and starts from the current tick.
async fn samples(
    State(s): State<ApiState>,
    Extension(limits): Extension<Limits>,
) -> Result<Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>>, crate::limits::Busy> {
    let permit = limits.stream_permit()?;
    let events = tick_events(s.shared.ticks.subscribe(), permit)
        .map(|tick| Ok(Event::default().event("tick").data(&*tick)));
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// The ticks a subscriber receives, ending when it lags (or the daemon
/// stops); `hold` (its stream place) is released with the stream.
fn tick_events<H: Send + 'static>(
    rx: tokio::sync::broadcast::Receiver<Arc<str>>,
    hold: H,
) -> impl futures_util::Stream<Item = Arc<str>> {
    futures_util::stream::unfold((rx, hold), |(mut rx, hold)| async move {
        match rx.recv().await {
            Ok(tick) => Some((tick, (rx, hold))),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "event stream subscriber too slow: dropped");
                None
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_dropped_not_buffered_for() {
        let (tx, _) = tokio::sync::broadcast::channel::<Arc<str>>(4);
        let limits = Limits::default();
        let permit = limits.stream_permit().unwrap();
        let mut keeping_up = Box::pin(tick_events(tx.subscribe(), ()));
        let mut falling_behind = Box::pin(tick_events(tx.subscribe(), permit));
        tx.send("t1".into()).unwrap();
        assert_eq!(keeping_up.next().await.as_deref(), Some("t1"));
        for n in 2..=6 {
            tx.send(format!("t{n}").into()).unwrap();
            assert_eq!(keeping_up.next().await.as_deref(), Some(&*format!("t{n}")));
        }
        // Six ticks behind a buffer of four: the stream ends, its place is free.
        assert_eq!(falling_behind.next().await, None);
        drop(falling_behind);
        let places: Vec<_> = (0..crate::limits::MAX_STREAMS)
            .map(|_| limits.stream_permit().expect("every place is free again"))
            .collect();
        assert!(limits.stream_permit().is_err(), "{} places", places.len());
    }
    use iofloor_core::units::Rate;

    #[test]
    fn patch_bodies_are_checked_field_by_field() {
        let p = parse_patch(br#"{"floor": "500 IOPS", "weight": 200}"#).unwrap();
        assert_eq!(p.floor, Some(Some(Rate::Iops(500.0))));
        assert_eq!(p.weight, Some(200.0));
        assert_eq!(p.ceiling, None);
        assert_eq!(
            parse_patch(br#"{"floor": null}"#).unwrap().floor,
            Some(None)
        );
        for (body, needle) in [
            (&b"not json"[..], "JSON object"),
            (b"[1]", "JSON object"),
            (b"{\"floor\"", "not JSON: EOF"),
            (b"{not json", "not JSON"),
            (b"{}", "nothing to change"),
            (br#"{"flor": "1 IOPS"}"#, "unknown field `flor`"),
            (br#"{"floor": "5 parsecs"}"#, "`floor`: invalid rate"),
            (br#"{"floor": 500}"#, "`floor`: invalid rate"),
            (br#"{"weight": 0}"#, "(0, 10000]"),
            (br#"{"weight": 1e9}"#, "(0, 10000]"),
            (br#"{"weight": "x"}"#, "`weight`: invalid type"),
            (br#"{"weight": 1} trailing"#, "not JSON: trailing"),
        ] {
            let e = parse_patch(body).unwrap_err().to_string();
            assert!(e.contains(needle), "{}: {e}", String::from_utf8_lossy(body));
        }
    }
}

//! MCP over Streamable HTTP: the SDK's service behind a guard that answers what the SDK would
//! answer wrongly (malformed messages), bounds what it would keep without end (sessions), and
//! writes listing pages into answers as bytes (`prewritten`).

use super::malformed::{self, Refused};
use super::one_write;
use super::prewritten;
use super::sessions::{Full, Sessions};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;
use std::sync::Arc;

const SESSION_HEADER: &str = "mcp-session-id";

/// `/mcp` served by `service`, behind the guard.
pub fn router<S>(service: S, sessions: Arc<Sessions>) -> axum::Router
where
    S: tower_service::Service<Request, Error = std::convert::Infallible> + Clone + Send + Sync,
    S::Response: axum::response::IntoResponse,
    S::Future: Send + 'static,
    S: 'static,
{
    axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(sessions, guard))
}

/// A POST of JSON that is not one well-formed JSON-RPC message gets the JSON-RPC error it
/// deserves (the SDK would answer 415 in plain text, or "method not found"); an `initialize`
/// that would start a session beyond the caps gets 503 or 429.
async fn guard(State(sessions): State<Arc<Sessions>>, request: Request, next: Next) -> Response {
    let is_json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json);
    // The authentication guard runs first: every request here has its caller.
    let caller = request
        .extensions()
        .get::<cloud_harness_auth::Identity>()
        .map_or_else(String::new, |i| i.actor());
    if let Some(id) = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        if sessions.someone_elses(id, &caller) {
            return not_found_session();
        }
    }
    if request.method() != Method::POST {
        // A GET stream may resume a POST's: its answer may carry placeholders too.
        return prewritten::filling(next.run(request).await).await;
    }
    if !is_json {
        // Refused here, not by the SDK: a body this guard has not read never reaches it.
        return unsupported_media_type();
    }
    let (mut parts, body) = request.into_parts();
    // Bodies held at once are bounded in bytes, server-wide: a message may be 16 MiB, and
    // many of them at once would be memory no quota counts.
    let claimed = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(malformed::MAX_MESSAGE, |n| n.min(malformed::MAX_MESSAGE));
    let Some(_share) = BodyShare::take(&caller, claimed) else {
        return bodies_at_share();
    };
    let _held = match held_bytes(claimed).await {
        Some(held) => held,
        None => return server_busy(),
    };
    // A body sent slowly (or never) holds its share only so long.
    let read = axum::body::to_bytes(body, claimed.max(1));
    let bytes = match tokio::time::timeout(BODY_TIME, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => return refused(malformed::too_large()),
        Err(_) => return body_timeout(),
    };
    // A large message's check is work: off the threads that serve every connection.
    let checked = if bytes.len() > 256 << 10 {
        let b = bytes.clone();
        match cloud_harness_control::limits::blocking(move || malformed::check(&b)).await {
            Ok(checked) => checked,
            Err(e) => return cloud_harness_auth::quotas::refusal(&e, true),
        }
    } else {
        malformed::check(&bytes)
    };
    if let Some(r) = checked {
        return refused(r);
    }
    let had_session = parts.headers.contains_key(SESSION_HEADER);
    let starts_session = !had_session && is_initialize(&bytes);
    parts.extensions.insert(prewritten::Filled);
    let request = Request::from_parts(parts, bytes.into());
    if !starts_session {
        let response = answer(next.run(request).await).await;
        // A session this guard did not see coming (a message the SDK reads as `initialize`
        // and this guard did not) is counted all the same, and closed if over the caps.
        return match response.headers().get(SESSION_HEADER).map(|v| v.to_str()) {
            Some(Ok(id)) if !had_session => match sessions.adopt(&caller, id).await {
                Ok(()) => response,
                Err(full) => busy(full, sessions.limits().max_per_principal),
            },
            _ => response,
        };
    }
    let admission = match sessions.admit(&caller).await {
        Ok(admission) => admission,
        Err(full) => return busy(full, sessions.limits().max_per_principal),
    };
    let response = answer(next.run(request).await).await;
    let session = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok());
    admission.answered(session);
    response
}

/// An answer to a POST: its placeholders filled, a quick one in one write.
async fn answer(response: Response) -> Response {
    one_write::coalesce(prewritten::filling(response).await).await
}

/// A JSON content type, read as the SDK reads it (the essence before any `;`, trimmed, in
/// any case): the guard and the SDK must agree on which bodies this guard reads.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split_once(';')
        .map_or(content_type, |(essence, _)| essence);
    essence.trim().eq_ignore_ascii_case("application/json")
}

fn is_initialize(bytes: &[u8]) -> bool {
    // Owned, so a name written with escapes (`"initializ\u0065"`) reads as the SDK reads it.
    #[derive(serde::Deserialize)]
    struct Method {
        method: Option<String>,
    }
    serde_json::from_slice::<Method>(bytes).is_ok_and(|m| m.method.as_deref() == Some("initialize"))
}

/// A POST whose body is not JSON, answered as the SDK would.
fn unsupported_media_type() -> Response {
    Response::builder()
        .status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body("Unsupported Media Type: Content-Type must be application/json".into())
        .expect("a response")
}

/// Bytes of request bodies held at once, in KiB.
const BODY_BUDGET_KIB: u32 = 256 << 10;

/// What one principal's bodies may hold of [`BODY_BUDGET_KIB`] at once: a quarter, so one
/// client sending large bodies slowly leaves the rest to others.
const SHARE_KIB: u32 = BODY_BUDGET_KIB / 4;

/// How long a body may take to arrive.
const BODY_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// KiB of bodies held per principal (only principals holding some are kept).
static SHARES: std::sync::Mutex<Option<std::collections::HashMap<String, u32>>> =
    std::sync::Mutex::new(None);

/// One body's part of its principal's share, given back when dropped.
struct BodyShare {
    who: String,
    kib: u32,
}

impl BodyShare {
    fn take(who: &str, bytes: usize) -> Option<BodyShare> {
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .max(1);
        let mut shares = SHARES.lock().expect("body shares");
        let held = shares
            .get_or_insert_with(Default::default)
            .entry(who.to_owned())
            .or_default();
        if held.saturating_add(kib) > SHARE_KIB {
            return None;
        }
        *held += kib;
        Some(BodyShare {
            who: who.to_owned(),
            kib,
        })
    }
}

impl Drop for BodyShare {
    fn drop(&mut self) {
        let mut shares = SHARES.lock().expect("body shares");
        let Some(all) = shares.as_mut() else { return };
        if let Some(held) = all.get_mut(&self.who) {
            *held = held.saturating_sub(self.kib);
            if *held == 0 {
                all.remove(&self.who);
            }
        }
    }
}

/// This principal's bodies under way hold its share of the server's: 429, as a quota.
fn bodies_at_share() -> Response {
    let mut response = json_response(
        StatusCode::TOO_MANY_REQUESTS,
        &json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32000,
            "message": format!("too many request bodies under way: a principal's may hold {} MiB at once", SHARE_KIB / 1024),
            "data": { "code": "RESOURCE_EXHAUSTED", "details": { "limit": "request_bodies", "value": SHARE_KIB / 1024, "retryAfter": 1 } } } }),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

/// A body that did not arrive within [`BODY_TIME`].
fn body_timeout() -> Response {
    json_response(
        StatusCode::REQUEST_TIMEOUT,
        &json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32000, "message": format!("the request's body did not arrive within {} s", BODY_TIME.as_secs()) } }),
    )
}

/// A share of [`BODY_BUDGET_KIB`] for a body of `bytes`, waited for at most 10 s.
async fn held_bytes(bytes: usize) -> Option<tokio::sync::SemaphorePermit<'static>> {
    static BUDGET: tokio::sync::Semaphore =
        tokio::sync::Semaphore::const_new(BODY_BUDGET_KIB as usize);
    let kib = u32::try_from(bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .max(1);
    let wait = BUDGET.acquire_many(kib.min(BODY_BUDGET_KIB));
    tokio::time::timeout(std::time::Duration::from_secs(10), wait)
        .await
        .ok()?
        .ok()
}

/// The server holds as many request bodies as it takes: try again shortly.
fn server_busy() -> Response {
    let mut response = json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32000, "message": "the server holds as many requests as it takes; try again shortly" } }),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

/// A session another principal started, answered as the SDK answers an unknown one.
fn not_found_session() -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32001, "message": "session not found" } }),
    )
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let body = serde_json::to_vec(body).expect("errors serialize");
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .expect("a response")
}

fn refused(r: Refused) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_REQUEST);
    json_response(status, &r.answer)
}

fn busy(full: Full, per_principal: usize) -> Response {
    let (why, data) = match full.status {
        429 => (
            format!("too many sessions: the limit `sessions` is {per_principal} per principal; close one (DELETE) or let one go idle"),
            json!({ "code": "RESOURCE_EXHAUSTED", "details": { "limit": "sessions", "value": per_principal, "retryAfter": full.retry_after } }),
        ),
        _ => (
            "the server has as many sessions as it takes; try again shortly".to_owned(),
            json!({ "code": "UPSTREAM", "details": { "retryAfter": full.retry_after } }),
        ),
    };
    let status = StatusCode::from_u16(full.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = json_response(
        status,
        &json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32000, "message": why, "data": data } }),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(full.retry_after));
    response
}

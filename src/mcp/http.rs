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
        .is_some_and(|v| v.starts_with("application/json"));
    let caller = request
        .extensions()
        .get::<crate::auth::Identity>()
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
    if request.method() != Method::POST || !is_json {
        // A GET stream may resume a POST's: its answer may carry placeholders too.
        return prewritten::filling(next.run(request).await).await;
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
    let _held = match held_bytes(claimed).await {
        Some(held) => held,
        None => return server_busy(),
    };
    let bytes = match axum::body::to_bytes(body, claimed.max(1)).await {
        Ok(bytes) => bytes,
        Err(_) => return refused(malformed::too_large()),
    };
    // A large message's check is work: off the threads that serve every connection.
    let checked = if bytes.len() > 256 << 10 {
        let b = bytes.clone();
        match crate::limits::blocking(move || malformed::check(&b)).await {
            Ok(checked) => checked,
            Err(e) => return crate::limits::http::refusal(&e, true),
        }
    } else {
        malformed::check(&bytes)
    };
    if let Some(r) = checked {
        return refused(r);
    }
    let starts_session = !parts.headers.contains_key(SESSION_HEADER) && is_initialize(&bytes);
    // The authentication guard runs first: every request here has its caller.
    let client = parts
        .extensions
        .get::<crate::auth::Identity>()
        .map_or_else(String::new, |i| i.actor());
    parts.extensions.insert(prewritten::Filled);
    let request = Request::from_parts(parts, bytes.into());
    if !starts_session {
        return answer(next.run(request).await).await;
    }
    let admission = match sessions.admit(&client).await {
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

fn is_initialize(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<&'a str>,
    }
    serde_json::from_slice::<Method>(bytes).is_ok_and(|m| m.method == Some("initialize"))
}

/// Bytes of request bodies held at once, in KiB.
const BODY_BUDGET_KIB: u32 = 256 << 10;

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

//! Quotas on the HTTP listener, after authentication: each principal's request rate and
//! requests in flight, and the principal every request's blocking work counts against. A
//! refusal is 429 with `Retry-After`: a JSON-RPC error on `/mcp`, the API's error elsewhere.

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cloud_harness_control::limits::{acting_as, quotas, retry_after};
use cloud_harness_control::principal::Identity;
use cloud_harness_control::principal::Principal;
use cloud_harness_error::Error;

pub async fn guard(request: Request, next: Next) -> Response {
    let Some(who) = request.extensions().get::<Identity>().map(Principal::of) else {
        // Not signed in: the open paths (probes, the login page, assets).
        return next.run(request).await;
    };
    let mcp = request.uri().path().starts_with("/mcp");
    let quotas = quotas();
    if let Err(e) = quotas.request(&who) {
        return refusal(&e, mcp);
    }
    let _in_flight = match quotas.in_flight(&who) {
        Ok(held) => held,
        Err(e) => return refusal(&e, mcp),
    };
    acting_as(&who.name, next.run(request)).await
}

/// A quota's refusal as HTTP: 429, `Retry-After`, and the body a client of that path reads.
pub fn refusal(e: &Error, mcp: bool) -> Response {
    let mut response = if mcp {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": { "code": -32000, "message": e.message, "data": { "code": e.code, "details": e.details } },
        });
        (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response()
    } else {
        crate::http::error_response(e)
    };
    if let Some(secs) = retry_after(e) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

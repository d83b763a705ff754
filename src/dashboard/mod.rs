//! The dashboard: server-rendered pages on the `serve --http` listener, behind the same login
//! as the API. No script; every form posts to this server with the session's CSRF token;
//! every toolkit's text is escaped, and its Markdown sanitized (`markdown`).

mod audit;
mod layout;
mod library;
mod markdown;
mod overview;
mod tokens;

use crate::api::Api;
use crate::auth::Identity;
use axum::routing::{get, post};
use axum::Router;
use cloud_harness_fs::{Code, Error, Result};
use std::sync::Arc;

pub use layout::CSP;

pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/", get(overview::page))
        .route("/library", get(library::list))
        .route("/skills/{digest}", get(library::skill))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{name}/revoke", post(tokens::revoke))
        .route("/audit", get(audit::page))
        .route("/assets/app.css", get(layout::stylesheet))
        .with_state(api)
}

/// A form's CSRF token must be the session's (a bearer token, or `--auth none`, has none to
/// steal: the guard's Origin check is what stands there).
fn check_csrf(who: &Identity, sent: &str) -> Result<()> {
    match &who.csrf {
        Some(csrf) if csrf != sent => Err(Error::new(
            Code::Forbidden,
            "this form is stale or not ours: reload the page and try again",
        )),
        _ => Ok(()),
    }
}

/// Runs `work` off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    crate::workspace::blocking(work).await
}

//! The dashboard: server-rendered pages on the `serve --http` listener, behind the same login
//! as the API. Every page works without script (one small script follows import jobs); every
//! form posts to this server with the session's CSRF token; every toolkit's text is escaped,
//! and its Markdown sanitized (`markdown`).

mod approvals;
mod audit;
mod chart;
mod conflicts;
mod imports;
mod labels;
mod layout;
mod library;
mod markdown;
mod overview;
mod pin_diff;
mod registry;
mod sets;
mod skill;
mod tiers;
mod tokens;
mod usage;
mod workspaces;

use crate::api::Api;
use axum::routing::{get, post};
use axum::Router;
use cloud_harness_auth::Identity;
use cloud_harness_error::{Code, Error, Result};
use std::sync::Arc;

pub use layout::CSP;

pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/", get(overview::page))
        .route("/library", get(library::list))
        .route("/usage", get(usage::page))
        .route("/skills/{digest}", get(skill::page))
        .route("/skills/{digest}/files/{*path}", get(skill::file))
        .route("/imports", get(imports::page).post(imports::submit))
        .route("/imports/{id}/cancel", post(imports::cancel))
        .route("/sets", get(sets::list))
        .route("/sets/new", get(sets::new).post(sets::create))
        .route("/sets/{id}", get(sets::show).post(sets::update))
        .route("/sets/{id}/diff", post(sets::diff::page))
        .route("/sets/{id}/labels", post(sets::labels::move_label))
        .route(
            "/sets/{id}/labels/{label}/rollback",
            post(sets::labels::rollback_label),
        )
        .route("/registry", get(registry::list).post(registry::add))
        .route("/registry/{owner}/{name}", get(registry::entry))
        .route("/registry/{owner}/{name}/check", post(registry::check))
        .route("/registry/{owner}/{name}/pin", post(registry::pin))
        .route("/registry/{owner}/{name}/diff", post(registry::diff))
        .route(
            "/registry/{owner}/{name}/labels",
            post(registry::move_label),
        )
        .route(
            "/registry/{owner}/{name}/labels/{label}/rollback",
            post(registry::rollback_label),
        )
        .route(
            "/registry/{owner}/{name}/rollback",
            post(registry::rollback),
        )
        .route("/conflicts", get(conflicts::page))
        .route("/conflicts/{id}/settle", post(conflicts::settle))
        .route("/approvals", get(approvals::page).post(approvals::approve))
        .route("/approvals/{id}/revoke", post(approvals::revoke))
        .route("/workspaces", get(workspaces::list))
        .route("/workspaces/{id}", get(workspaces::show))
        .route("/workspaces/{id}/close", post(workspaces::close))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{name}/revoke", post(tokens::revoke))
        .route("/audit", get(audit::page))
        .route("/assets/app.css", get(layout::stylesheet))
        .route("/assets/live.js", get(layout::script))
        .with_state(api)
}

/// A form's CSRF token must be the session's (a bearer token, or `--auth none`, has none to
/// steal: the guard's Origin check is what stands there).
fn check_csrf(who: &Identity, sent: &str) -> Result<()> {
    match &who.csrf {
        Some(csrf) if !cloud_harness_auth::same_secret(sent, csrf) => Err(Error::new(
            Code::Forbidden,
            "this form is stale or not ours: reload the page and try again",
        )),
        _ => Ok(()),
    }
}

/// Skill names or globs as a form gives them: separated by commas or new lines.
fn patterns(text: &str) -> Vec<String> {
    text.split([',', '\n'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The instance id a form leaves empty: the repository's name (`…/kit.git` gives `kit`).
fn instance_from_url(url: &str) -> String {
    let path = url.trim().trim_end_matches('/');
    let name = path.rsplit('/').next().unwrap_or_default();
    name.strip_suffix(".git").unwrap_or(name).to_owned()
}

/// Runs `work` off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    cloud_harness_workspace::blocking(work).await
}

//! `/healthz` (the process answers) and `/readyz` (it can do its work: the store takes a
//! write, the database a transaction, and every open workspace's mounts answer a real read).
//! Both are open to anyone — a probe has no token — and say no more than what failed.
//! `/metrics` is served beside them, for operators (`metrics`).

use crate::workspace::Workspaces;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// How long one check may take before it counts as failed (a hung mount never answers).
const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

pub fn router(workspaces: Arc<Workspaces>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(crate::metrics::endpoint))
        .with_state(workspaces)
}

/// Runs `check` on a thread of its own, bounded by [`CHECK_TIMEOUT`].
async fn bounded(
    what: String,
    check: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> serde_json::Value {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(check());
    });
    let outcome = match tokio::time::timeout(CHECK_TIMEOUT, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err("the check ended without an answer".to_owned()),
        Err(_) => Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())),
    };
    match outcome {
        Ok(()) => json!({ "check": what, "ok": true }),
        Err(e) => json!({ "check": what, "ok": false, "error": e }),
    }
}

async fn ready(axum::extract::State(ws): axum::extract::State<Arc<Workspaces>>) -> Response {
    let mut checks = Vec::new();
    let store = ws.store().root().to_path_buf();
    checks.push(
        bounded("store writable".into(), move || {
            tempfile::NamedTempFile::new_in(&store)
                .map(drop)
                .map_err(|e| format!("{}: {e}", store.display()))
        })
        .await,
    );
    let db = ws.db().clone();
    checks.push(
        bounded("database usable".into(), move || {
            db.write(|_| Ok(())).map_err(|e| e.message)
        })
        .await,
    );
    for w in ws.open_workspaces() {
        let what = format!("workspace {} mounts", w.id);
        checks.push(bounded(what, move || w.check_mounts()).await);
    }
    let ready = checks.iter().all(|c| c["ok"] == true);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(json!({ "ready": ready, "checks": checks }))).into_response()
}

//! `/api/v1/tokens`: operators make, list and revoke tokens.

use super::{actor, answer, blocking, body, State};
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::{self as auth, Identity, Role};
use serde_json::json;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewToken {
    name: String,
    role: String,
}

pub async fn list(axum::extract::State(api): State) -> Response {
    let db = api.workspaces.db().clone();
    let tokens = blocking(move || auth::list(&db, true)).await;
    answer(StatusCode::OK, tokens.map(|t| json!({ "tokens": t })))
}

pub async fn create(
    axum::extract::State(api): State,
    Extension(id): Extension<Identity>,
    bytes: Bytes,
) -> Response {
    let db = api.workspaces.db().clone();
    let made = blocking(move || {
        let req: NewToken = body(&bytes)?;
        let role = Role::parse(&req.role)?;
        auth::create(&db, &req.name, role, &actor(&id))
    })
    .await;
    answer(StatusCode::CREATED, made.map(|t| json!(t)))
}

pub async fn revoke(
    axum::extract::State(api): State,
    Extension(id): Extension<Identity>,
    Path(name): Path<String>,
) -> Response {
    let db = api.workspaces.db().clone();
    let revoked = blocking(move || auth::revoke(&db, &name, &actor(&id))).await;
    answer(StatusCode::OK, revoked.map(|t| json!(t)))
}

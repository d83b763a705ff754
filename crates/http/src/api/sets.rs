//! `/api/v1/sets`: skill sets and their revisions.

use super::{actor, answer, blocking, body, query, Query, State};
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::http::error_response;
use cloud_harness_auth::Identity;
use cloud_harness_curation::sets;
use cloud_harness_skills::spec::Validation;
use serde_json::{json, Value};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSet {
    id: String,
    #[serde(default)]
    description: String,
    members: Vec<Value>,
    #[serde(default)]
    validation: Validation,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Edit {
    /// The revision this edit changes: the latest, or the edit is CONFLICT.
    revision: i64,
    description: Option<String>,
    members: Option<Vec<Value>>,
    validation: Option<Validation>,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RevisionQuery {
    revision: Option<i64>,
}

pub async fn list(axum::extract::State(api): State) -> Response {
    let db = api.workspaces.db().clone();
    let all = blocking(move || sets::list(&db)).await;
    answer(StatusCode::OK, all.map(|s| json!({ "sets": s })))
}

pub async fn create(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    bytes: Bytes,
) -> Response {
    let ws = api.workspaces.clone();
    let made = blocking(move || {
        let req: NewSet = body(&bytes)?;
        sets::create(
            ws.db(),
            ws.hosts(),
            &req.id,
            &req.description,
            &req.members,
            req.validation,
            &actor(&who),
        )
    })
    .await;
    answer(StatusCode::CREATED, made.map(|s| json!(s)))
}

pub async fn get(
    axum::extract::State(api): State,
    Path(id): Path<String>,
    q: Query<RevisionQuery>,
) -> Response {
    let revision = match query(q) {
        Ok(q) => q.revision,
        Err(e) => return error_response(&e),
    };
    let db = api.workspaces.db().clone();
    let one = blocking(move || sets::get(&db, &id, revision)).await;
    answer(StatusCode::OK, one.map(|s| json!(s)))
}

pub async fn edit(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response {
    let ws = api.workspaces.clone();
    let made = blocking(move || {
        let req: Edit = body(&bytes)?;
        sets::edit(
            ws.db(),
            ws.hosts(),
            &id,
            req.revision,
            req.description.as_deref(),
            req.members.as_deref(),
            req.validation,
            &actor(&who),
        )
    })
    .await;
    answer(StatusCode::OK, made.map(|s| json!(s)))
}

pub async fn revisions(axum::extract::State(api): State, Path(id): Path<String>) -> Response {
    let db = api.workspaces.db().clone();
    let asked = id.clone();
    let all = blocking(move || sets::revisions(&db, &asked)).await;
    answer(
        StatusCode::OK,
        all.map(|r| json!({ "set": id, "revisions": r })),
    )
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CompareRevisions {
    /// The revision compared from: the one before `to` unless named.
    from: Option<i64>,
    /// The revision compared to: the latest unless named.
    to: Option<i64>,
}

/// What a workspace of one revision of the set serves that one of another does not (both
/// previewed: their members acquired), and the open workspaces of the older one.
pub async fn diff(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response {
    let ws = api.workspaces.clone();
    let found = blocking(move || {
        let req: CompareRevisions = if bytes.is_empty() {
            CompareRevisions::default()
        } else {
            body(&bytes)?
        };
        ws.set_diff(&id, req.from, req.to, &actor(&who))
    })
    .await;
    answer(StatusCode::OK, found.map(|d| json!(d)))
}

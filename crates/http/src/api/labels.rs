//! Version labels of registry entries (`/api/v1/registry/{owner}/{name}/labels`) and of sets
//! (`/api/v1/sets/{id}/labels`): listed, a label's history, moved (`PUT`, made if new),
//! removed (`DELETE`), rolled back.

use super::{actor, answer, blocking, body, query, Query, State};
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::Identity;
use cloud_harness_curation::labels::{self, Move, Target};
use serde_json::json;
use std::sync::Arc;

/// A move of an entry's label: commits.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryMove {
    commit: String,
    canary: Option<EntryCanary>,
    reason: Option<String>,
    /// The label's revision the move replaces, as the operator saw it (0: a new label).
    from: Option<i64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryCanary {
    commit: String,
    percent: u8,
}

/// A move of a set's label: revisions.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SetMove {
    revision: i64,
    canary: Option<SetCanary>,
    reason: Option<String>,
    from: Option<i64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SetCanary {
    revision: i64,
    percent: u8,
}

fn entry(owner: &str, name: &str) -> Target {
    Target::Entry(format!("{owner}/{name}"))
}

async fn listed(api: Arc<super::Api>, target: Target) -> Response {
    let db = api.workspaces.db().clone();
    let found = blocking(move || labels::list(&db, &target)).await;
    answer(StatusCode::OK, found.map(|l| json!({ "labels": l })))
}

async fn history(api: Arc<super::Api>, target: Target, label: String) -> Response {
    let db = api.workspaces.db().clone();
    let found = blocking(move || labels::history(&db, &target, &label)).await;
    answer(
        StatusCode::OK,
        found.map(|h| json!({ "label": h.first().map(|l| &l.name), "revisions": h })),
    )
}

async fn moved(
    api: Arc<super::Api>,
    who: Identity,
    target: Target,
    label: String,
    mv: cloud_harness_error::Result<Move>,
) -> Response {
    let ws = api.workspaces.clone();
    let done = blocking(move || {
        labels::move_to(
            ws.db(),
            Some(ws.provisioner()),
            &target,
            &label,
            &mv?,
            &actor(&who),
        )
    })
    .await;
    answer(StatusCode::OK, done.map(|l| json!(l)))
}

/// `?from=N`: the revision the rollback undoes, as seen (CONFLICT if the label moved since).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct From {
    from: Option<i64>,
}

async fn rolled_back(
    api: Arc<super::Api>,
    who: Identity,
    target: Target,
    label: String,
    from: Query<From>,
) -> Response {
    let ws = api.workspaces.clone();
    let done = blocking(move || {
        let from = query(from)?.from;
        let p = Some(ws.provisioner());
        labels::rollback(ws.db(), p, &target, &label, from, &actor(&who))
    })
    .await;
    answer(StatusCode::OK, done.map(|l| json!(l)))
}

pub async fn entry_list(
    axum::extract::State(api): State,
    Path((owner, name)): Path<(String, String)>,
) -> Response {
    listed(api, entry(&owner, &name)).await
}

pub async fn entry_history(
    axum::extract::State(api): State,
    Path((owner, name, label)): Path<(String, String, String)>,
) -> Response {
    history(api, entry(&owner, &name), label).await
}

pub async fn entry_move(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name, label)): Path<(String, String, String)>,
    bytes: Bytes,
) -> Response {
    let mv = body::<EntryMove>(&bytes).map(|r| Move {
        value: Some(r.commit),
        canary: r.canary.map(|c| (c.commit, c.percent)),
        reason: r.reason,
        from: r.from,
    });
    moved(api, who, entry(&owner, &name), label, mv).await
}

pub async fn entry_remove(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name, label)): Path<(String, String, String)>,
) -> Response {
    moved(api, who, entry(&owner, &name), label, Ok(Move::default())).await
}

pub async fn entry_rollback(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name, label)): Path<(String, String, String)>,
    from: Query<From>,
) -> Response {
    rolled_back(api, who, entry(&owner, &name), label, from).await
}

pub async fn set_list(axum::extract::State(api): State, Path(id): Path<String>) -> Response {
    listed(api, Target::Set(id)).await
}

pub async fn set_history(
    axum::extract::State(api): State,
    Path((id, label)): Path<(String, String)>,
) -> Response {
    history(api, Target::Set(id), label).await
}

pub async fn set_move(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((id, label)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let mv = body::<SetMove>(&bytes).map(|r| Move {
        value: Some(r.revision.to_string()),
        canary: r.canary.map(|c| (c.revision.to_string(), c.percent)),
        reason: r.reason,
        from: r.from,
    });
    moved(api, who, Target::Set(id), label, mv).await
}

pub async fn set_remove(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((id, label)): Path<(String, String)>,
) -> Response {
    moved(api, who, Target::Set(id), label, Ok(Move::default())).await
}

pub async fn set_rollback(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((id, label)): Path<(String, String)>,
    from: Query<From>,
) -> Response {
    rolled_back(api, who, Target::Set(id), label, from).await
}

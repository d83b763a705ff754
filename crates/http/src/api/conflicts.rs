//! `/api/v1/conflicts`: launch conflicts, and settling one.

use super::{actor, answer, blocking, body, query, Query, State};
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::http::error_response;
use cloud_harness_auth::Identity;
use cloud_harness_control::principal::Principal;
use cloud_harness_curation::conflicts;
use serde_json::json;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Also those settled.
    #[serde(default)]
    settled: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Settle {
    source: String,
    /// Settle it for the workspaces of this set only.
    set: Option<String>,
    reason: Option<String>,
}

/// Launch conflicts: a client sees those its own opens met last, an operator all.
pub async fn list(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    q: Query<ListQuery>,
) -> Response {
    let settled = match query(q) {
        Ok(q) => q.settled,
        Err(e) => return error_response(&e),
    };
    let db = api.workspaces.db().clone();
    let who = Principal::of(&who);
    let mine = (!who.is_operator()).then_some(who.name);
    let all = blocking(move || conflicts::list_of(&db, settled, mine.as_deref())).await;
    answer(StatusCode::OK, all.map(|c| json!({ "conflicts": c })))
}

pub async fn get(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    let db = api.workspaces.db().clone();
    let who = Principal::of(&who);
    let one = blocking(move || {
        let c = conflicts::get(&db, &id)?;
        match who.reaches(&c.actor) {
            true => Ok(c),
            false => Err(conflicts::not_found(&id)),
        }
    })
    .await;
    answer(StatusCode::OK, one.map(|c| json!(c)))
}

pub async fn settle(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response {
    let (db, home) = (
        api.workspaces.db().clone(),
        api.workspaces.home().to_owned(),
    );
    let done = blocking(move || {
        let req: Settle = body(&bytes)?;
        let made = conflicts::settle(
            &db,
            &home,
            &id,
            &req.source,
            req.set.as_deref(),
            req.reason.as_deref(),
            &actor(&who),
        )?;
        Ok(json!({ "conflict": id, "override": made }))
    })
    .await;
    answer(StatusCode::OK, done)
}

//! `/api/v1/approvals` and `/api/v1/overrides`: the operator's decisions.

use super::{actor, answer, blocking, body, query, Query, State};
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::http::error_response;
use cloud_harness_auth::Identity;
use cloud_harness_curation::decisions::{self, Kind, What};
use cloud_harness_error::{Code, Error};
use cloud_harness_store::cas::Digest;
use serde_json::json;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Also those revoked.
    #[serde(default)]
    revoked: bool,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RevokeQuery {
    reason: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewApproval {
    digest: String,
    skill: Option<String>,
    reason: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewOverride {
    skill: String,
    source: String,
    set: Option<String>,
    reason: Option<String>,
}

async fn list(api: State, revoked: bool, approvals: bool) -> Response {
    let (db, home) = (
        api.workspaces.db().clone(),
        api.workspaces.home().to_owned(),
    );
    let all = blocking(move || decisions::list(&db, &home, revoked)).await;
    answer(
        StatusCode::OK,
        all.map(|all| {
            let kept: Vec<_> = all
                .into_iter()
                .filter(|d| matches!(d.what, What::Approval { .. }) == approvals)
                .collect();
            if approvals {
                json!({ "approvals": kept })
            } else {
                json!({ "overrides": kept })
            }
        }),
    )
}

pub async fn approvals(api: State, q: Query<ListQuery>) -> Response {
    match query(q) {
        Ok(q) => list(api, q.revoked, true).await,
        Err(e) => error_response(&e),
    }
}

pub async fn overrides(api: State, q: Query<ListQuery>) -> Response {
    match query(q) {
        Ok(q) => list(api, q.revoked, false).await,
        Err(e) => error_response(&e),
    }
}

/// Runs waiting for an approval: a client sees those of its own workspaces, an operator all.
pub async fn pending(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
) -> Response {
    let (db, home) = (
        api.workspaces.db().clone(),
        api.workspaces.home().to_owned(),
    );
    let ws = api.workspaces.clone();
    let who = cloud_harness_control::principal::Principal::of(&who);
    let pending = blocking(move || {
        let mine = |workspace: &str| {
            who.is_operator() || ws.get(workspace).is_ok_and(|w| who.reaches(w.owner()))
        };
        // Each with the skill's files (the script among them), as the store has them.
        let all: Vec<_> = decisions::pending(&db, &home)?
            .into_iter()
            .filter(|p| mine(&p.workspace))
            .map(|p| {
                let files = Digest::parse(&p.digest)
                    .ok()
                    .and_then(|d| cloud_harness_workspace::library::files(ws.store(), &d).ok());
                let mut v = json!(p);
                v["files"] = json!(files);
                v
            })
            .collect();
        Ok(all)
    })
    .await;
    answer(StatusCode::OK, pending.map(|p| json!({ "pending": p })))
}

pub async fn approve(
    axum::extract::State(api): State,
    Extension(id): Extension<Identity>,
    bytes: Bytes,
) -> Response {
    let db = api.workspaces.db().clone();
    let made = blocking(move || {
        let req: NewApproval = body(&bytes)?;
        let digest = Digest::parse(&req.digest).map_err(|_| {
            Error::field(
                Code::InvalidArgument,
                "digest",
                "must be sha256:<64 lowercase hex digits>",
            )
        })?;
        decisions::approve(
            &db,
            &digest,
            req.skill.as_deref(),
            req.reason.as_deref(),
            &actor(&id),
        )
    })
    .await;
    answer(StatusCode::CREATED, made.map(|d| json!(d)))
}

pub async fn set_override(
    axum::extract::State(api): State,
    Extension(id): Extension<Identity>,
    bytes: Bytes,
) -> Response {
    let (db, home) = (
        api.workspaces.db().clone(),
        api.workspaces.home().to_owned(),
    );
    let made = blocking(move || {
        let req: NewOverride = body(&bytes)?;
        let new = decisions::NewOverride {
            skill: &req.skill,
            source: &req.source,
            set: req.set.as_deref(),
            reason: req.reason.as_deref(),
        };
        decisions::set_override(&db, &home, &new, &actor(&id))
    })
    .await;
    answer(StatusCode::CREATED, made.map(|d| json!(d)))
}

async fn revoke(
    api: State,
    kind: Kind,
    who: Identity,
    id: String,
    q: Query<RevokeQuery>,
) -> Response {
    let reason = match query(q) {
        Ok(q) => q.reason,
        Err(e) => return error_response(&e),
    };
    let db = api.workspaces.db().clone();
    let done = blocking(move || {
        decisions::revoke(&db, kind, &id, reason.as_deref(), &actor(&who))?;
        Ok(json!({ "id": id, "revoked": true }))
    })
    .await;
    answer(StatusCode::OK, done)
}

pub(crate) async fn revoke_approval(
    api: State,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    q: Query<RevokeQuery>,
) -> Response {
    revoke(api, Kind::Approval, who, id, q).await
}

pub(crate) async fn revoke_override(
    api: State,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    q: Query<RevokeQuery>,
) -> Response {
    revoke(api, Kind::Override, who, id, q).await
}

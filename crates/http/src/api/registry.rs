//! `/api/v1/registry`: entries and their pins. An entry id is `owner/name`, two path segments.

use super::{actor, answer, blocking, body, State};
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::Identity;
use cloud_harness_control::toolkit::Scope;
use cloud_harness_curation::pin_diff;
use cloud_harness_curation::registry::{self, NewEntry};
use cloud_harness_error::{Code, Error};
use cloud_harness_skills::discovery::Layout;
use cloud_harness_skills::spec::Validation;
use serde_json::json;

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AddEntry {
    id: String,
    name: String,
    description: String,
    url: String,
    #[serde(default)]
    layout: Option<Layout>,
    #[serde(default)]
    default_scope: Option<Scope>,
    #[serde(default)]
    session_start_skill: Option<String>,
    commit: String,
    #[serde(default)]
    validation: Validation,
    #[serde(default)]
    allow_unreachable: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowUnreachable {
    /// Required: a commit, or null to clear (a missing field must not clear it).
    commit: serde_json::Value,
    reason: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SetValidation {
    validation: Validation,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MovePin {
    commit: String,
    reason: Option<String>,
    /// The pin the move replaces, as compared: CONFLICT if it moved since.
    from: Option<String>,
}

pub async fn list(axum::extract::State(api): State) -> Response {
    let db = api.workspaces.db().clone();
    let all = blocking(move || registry::load(&db)).await;
    answer(
        StatusCode::OK,
        all.map(|r| json!({ "entries": r.entries().collect::<Vec<_>>() })),
    )
}

pub async fn add(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    bytes: Bytes,
) -> Response {
    let ws = api.workspaces.clone();
    let made = blocking(move || {
        let req: AddEntry = body(&bytes)?;
        let new = NewEntry {
            id: req.id,
            name: req.name,
            description: req.description,
            url: req.url,
            layout: req.layout.unwrap_or_default(),
            default_scope: req.default_scope.unwrap_or_default(),
            session_start_skill: req.session_start_skill,
            commit: req.commit,
            validation: req.validation,
            allow_unreachable: req.allow_unreachable,
        };
        registry::add(ws.db(), ws.provisioner(), new, &actor(&who))
    })
    .await;
    answer(StatusCode::CREATED, made.map(|e| json!(e)))
}

/// `PUT /api/v1/registry/{owner}/{name}/validation`: what opens of the entry do with skills
/// that break the Agent Skills specification.
pub async fn validation(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let db = api.workspaces.db().clone();
    let set = blocking(move || {
        let req: SetValidation = body(&bytes)?;
        registry::set_validation(
            &db,
            &format!("{owner}/{name}"),
            req.validation,
            &actor(&who),
        )
    })
    .await;
    answer(StatusCode::OK, set.map(|e| json!(e)))
}

/// `PUT /api/v1/registry/{owner}/{name}/reachability`: the one commit opens of the entry
/// may serve though no branch or tag of its repository reaches it (`commit: null` clears it).
pub async fn reachability(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let db = api.workspaces.db().clone();
    let set = blocking(move || {
        let req: AllowUnreachable = body(&bytes)?;
        let commit = match &req.commit {
            serde_json::Value::Null => None,
            serde_json::Value::String(c) => Some(c.as_str()),
            _ => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "commit",
                    "a commit id, or null to allow none",
                ))
            }
        };
        registry::allow_unreachable(
            &db,
            &format!("{owner}/{name}"),
            commit,
            req.reason.as_deref(),
            &actor(&who),
        )
    })
    .await;
    answer(StatusCode::OK, set.map(|e| json!(e)))
}

pub async fn get(
    axum::extract::State(api): State,
    Path((owner, name)): Path<(String, String)>,
) -> Response {
    let db = api.workspaces.db().clone();
    let id = format!("{owner}/{name}");
    let one = blocking(move || {
        let r = registry::load(&db)?;
        let entry = r.find(&id).cloned().ok_or_else(|| {
            Error::field(Code::NotFound, "id", format!("no registry entry {id:?}"))
        })?;
        Ok(json!({ "entry": entry, "pins": registry::history(&db, &id)? }))
    })
    .await;
    answer(StatusCode::OK, one)
}

pub async fn pin(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let ws = api.workspaces.clone();
    let moved = blocking(move || {
        let req: MovePin = body(&bytes)?;
        if req
            .from
            .as_deref()
            .is_some_and(|f| !cloud_harness_control::toolkit::is_hex_commit(f))
        {
            return Err(Error::field(
                Code::InvalidArgument,
                "from",
                "must be an exact commit id (40 or 64 lowercase hex digits)",
            ));
        }
        registry::pin(
            ws.db(),
            ws.provisioner(),
            &format!("{owner}/{name}"),
            &req.commit,
            req.reason.as_deref(),
            req.from.as_deref(),
            &actor(&who),
        )
    })
    .await;
    answer(StatusCode::OK, moved.map(|p| json!(p)))
}

pub async fn rollback(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name)): Path<(String, String)>,
) -> Response {
    let ws = api.workspaces.clone();
    let moved = blocking(move || {
        registry::rollback(
            ws.db(),
            ws.provisioner(),
            &format!("{owner}/{name}"),
            &actor(&who),
        )
    })
    .await;
    answer(StatusCode::OK, moved.map(|p| json!(p)))
}

pub async fn updates(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name)): Path<(String, String)>,
) -> Response {
    let ws = api.workspaces.clone();
    let report = blocking(move || {
        registry::check_updates(
            ws.db(),
            ws.provisioner(),
            &format!("{owner}/{name}"),
            &actor(&who),
        )
    })
    .await;
    answer(StatusCode::OK, report)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Compare {
    /// The commit the pin would move to.
    to: String,
    /// The commit it would move from: the pin, unless named.
    from: Option<String>,
}

/// What moving the pin would change, skill by skill, and which open workspaces were opened on
/// the entry at the commit it would move from (they keep it until they reopen: a pin is read
/// at open).
pub async fn diff(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path((owner, name)): Path<(String, String)>,
    bytes: Bytes,
) -> Response {
    let ws = api.workspaces.clone();
    let found = blocking(move || {
        let req: Compare = body(&bytes)?;
        let id = format!("{owner}/{name}");
        let (from, to) = (req.from.as_deref(), req.to.as_str());
        let diff = pin_diff::diff(ws.db(), ws.provisioner(), &id, from, to, &actor(&who))?;
        let serving = ws.serving_preset(&id, &diff.from.commit);
        Ok(json!({ "id": id, "diff": diff, "servingFrom": serving }))
    })
    .await;
    answer(StatusCode::OK, found)
}

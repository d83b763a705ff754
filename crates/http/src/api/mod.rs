//! The control plane's JSON API, `/api/v1` on the `serve --http` listener: the same error
//! shape as the MCP tools (`code`, `status`, `message`, `details`), lists paged by cursor,
//! every write audited with the caller's identity. The OpenAPI document is `openapi.json`.

mod conflicts;
mod decisions;
mod imports;
mod inventory;
mod labels;
mod openapi;
pub(crate) mod registry;
pub(crate) mod sets;
pub(crate) mod skill_usage;
mod skills;
mod tokens;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use cloud_harness_auth::http::error_response;
use cloud_harness_auth::Identity;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_workspace::Workspaces;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::sync::Arc;

/// The most a request body may be: decisions and tokens are small.
const MAX_BODY: usize = 64 << 10;

pub struct Api {
    pub workspaces: Arc<Workspaces>,
    pub imports: Arc<cloud_harness_workspace::imports::Imports>,
    pub library: cloud_harness_workspace::library::Library,
}

pub type State = axum::extract::State<Arc<Api>>;

pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/api/v1/openapi.json", get(openapi::document))
        .route("/api/v1/whoami", get(whoami))
        .route("/api/v1/tokens", get(tokens::list).post(tokens::create))
        .route("/api/v1/tokens/{name}", delete(tokens::revoke))
        .route(
            "/api/v1/approvals",
            get(decisions::approvals).post(decisions::approve),
        )
        .route("/api/v1/approvals/pending", get(decisions::pending))
        .route("/api/v1/approvals/{id}", delete(decisions::revoke_approval))
        .route(
            "/api/v1/overrides",
            get(decisions::overrides).post(decisions::set_override),
        )
        .route("/api/v1/overrides/{id}", delete(decisions::revoke_override))
        .route("/api/v1/conflicts", get(conflicts::list))
        .route("/api/v1/conflicts/{id}", get(conflicts::get))
        .route("/api/v1/conflicts/{id}/settle", post(conflicts::settle))
        .route("/api/v1/sets", get(sets::list).post(sets::create))
        .route("/api/v1/sets/{id}", get(sets::get).put(sets::edit))
        .route("/api/v1/sets/{id}/revisions", get(sets::revisions))
        .route("/api/v1/sets/{id}/diff", post(sets::diff))
        .route("/api/v1/sets/{id}/labels", get(labels::set_list))
        .route(
            "/api/v1/sets/{id}/labels/{label}",
            get(labels::set_history)
                .put(labels::set_move)
                .delete(labels::set_remove),
        )
        .route(
            "/api/v1/sets/{id}/labels/{label}/rollback",
            post(labels::set_rollback),
        )
        .route("/api/v1/registry", get(registry::list).post(registry::add))
        .route("/api/v1/registry/{owner}/{name}", get(registry::get))
        .route("/api/v1/registry/{owner}/{name}/pin", post(registry::pin))
        .route("/api/v1/registry/{owner}/{name}/diff", post(registry::diff))
        .route(
            "/api/v1/registry/{owner}/{name}/labels",
            get(labels::entry_list),
        )
        .route(
            "/api/v1/registry/{owner}/{name}/labels/{label}",
            get(labels::entry_history)
                .put(labels::entry_move)
                .delete(labels::entry_remove),
        )
        .route(
            "/api/v1/registry/{owner}/{name}/labels/{label}/rollback",
            post(labels::entry_rollback),
        )
        .route(
            "/api/v1/registry/{owner}/{name}/validation",
            put(registry::validation),
        )
        .route(
            "/api/v1/registry/{owner}/{name}/reachability",
            put(registry::reachability),
        )
        .route(
            "/api/v1/registry/{owner}/{name}/rollback",
            post(registry::rollback),
        )
        .route(
            "/api/v1/registry/{owner}/{name}/updates",
            post(registry::updates),
        )
        .route("/api/v1/imports", get(imports::list).post(imports::submit))
        .route("/api/v1/imports/{id}", get(imports::get))
        .route("/api/v1/imports/{id}/cancel", post(imports::cancel))
        .route("/api/v1/acquisitions", get(imports::acquisitions))
        .route("/api/v1/inventory", get(inventory::search))
        .route("/api/v1/inventory/{bundle}", get(inventory::bundle))
        .route("/api/v1/skills", get(skills::list))
        .route("/api/v1/skills/{digest}", get(skills::get))
        .route("/api/v1/audit", get(audit))
        .route("/api/v1/workspaces", get(workspaces))
        .route("/api/v1/usage", get(usage))
        .route("/api/v1/usage/skills", get(skill_usage::get_skills))
        .route("/api/v1/usage/totals", get(skill_usage::get_totals))
        .route("/api/v1/usage/unused", get(skill_usage::get_unused))
        .fallback(|| async {
            error_response(&Error::not_found(
                "no such API path (see /api/v1/openapi.json)",
            ))
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response(error_bodies))
        .with_state(api)
}

/// The extractors' own refusals (a body past [`MAX_BODY`]) in the API's error shape, as the
/// document describes every error: JSON with a code, not the framework's plain text.
async fn error_bodies(response: Response) -> Response {
    let plain = !response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && plain {
        return error_response(&Error::too_large(format!(
            "the request body is larger than {MAX_BODY} bytes"
        )));
    }
    response
}

/// A result as the API answers it: `status` with the value as JSON, or the error.
fn answer(status: StatusCode, result: Result<Value>) -> Response {
    match result {
        Ok(v) => (status, axum::Json(v)).into_response(),
        Err(e) => error_response(&e),
    }
}

/// Runs `work` (database calls) off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    cloud_harness_workspace::blocking(work).await
}

/// A JSON body of type `T`: unknown fields, wrong types and bad JSON are INVALID_ARGUMENT
/// naming the field.
fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        if field == "." || field.is_empty() {
            Error::invalid(format!("the request body: {inner}"))
        } else {
            Error::field(Code::InvalidArgument, &field, inner)
        }
    })
}

fn actor(identity: &Identity) -> String {
    identity.actor()
}

/// Who the caller is, and what they use of their limits.
async fn whoami(
    axum::extract::State(api): State,
    axum::Extension(id): axum::Extension<Identity>,
) -> Response {
    let mut v = json!({ "name": id.name, "role": id.role, "actor": id.actor() });
    if let Some(csrf) = &id.csrf {
        v["csrfToken"] = json!(csrf);
    }
    v["usage"] = usage_json(&crate::usage::of(&api.workspaces, &id.actor()));
    answer(StatusCode::OK, Ok(v))
}

/// `{limit: {used, limit}}` for each limit (every limit, those not counted as 0 used).
fn usage_json(used: &[(&'static str, u64)]) -> Value {
    let limits = cloud_harness_control::limits::quotas().limits;
    let mut out = serde_json::Map::new();
    for (name, _) in cloud_harness_control::limits::NAMES {
        let n = used.iter().find(|(l, _)| l == name).map(|(_, n)| *n);
        let mut entry = json!({ "limit": limits.get(name) });
        if let Some(n) = n {
            entry["used"] = json!(n);
        }
        out.insert((*name).to_owned(), entry);
    }
    Value::Object(out)
}

/// Every principal's usage against its limits (operators).
async fn usage(axum::extract::State(api): State) -> Response {
    let all: Vec<Value> = crate::usage::all(&api.workspaces)
        .iter()
        .map(|(who, used)| json!({ "principal": who, "usage": usage_json(used) }))
        .collect();
    answer(StatusCode::OK, Ok(json!({ "principals": all })))
}

/// A cursor: opaque to clients, the position a list continues after.
fn cursor_of(n: i64) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("before:{n}"))
}

fn cursor_value(cursor: &str) -> Result<i64> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.strip_prefix("before:").and_then(|n| n.parse().ok()))
        .ok_or_else(|| {
            Error::field(
                Code::InvalidArgument,
                "cursor",
                "not a cursor this server gave",
            )
        })
}

/// A query string as the handlers take it: a bad one is INVALID_ARGUMENT, not a rejection.
pub type Query<T> =
    std::result::Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>;

fn query<T>(q: Query<T>) -> Result<T> {
    q.map(|q| q.0)
        .map_err(|e| Error::invalid(format!("the query: {}", e.body_text())))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    actor: Option<String>,
    action: Option<String>,
    subject: Option<String>,
    cursor: Option<String>,
    limit: Option<usize>,
}

const AUDIT_PAGE: usize = 100;
const MAX_AUDIT_PAGE: usize = 1000;

async fn audit(axum::extract::State(api): State, q: Query<AuditQuery>) -> Response {
    let q = match query(q) {
        Ok(q) => q,
        Err(e) => return error_response(&e),
    };
    let result = (|| {
        let limit = q.limit.unwrap_or(AUDIT_PAGE);
        if limit == 0 || limit > MAX_AUDIT_PAGE {
            return Err(Error::field(
                Code::InvalidArgument,
                "limit",
                format!("must be 1 to {MAX_AUDIT_PAGE}"),
            ));
        }
        let before = q.cursor.as_deref().map(cursor_value).transpose()?;
        let filter = cloud_harness_control::audit::Filter {
            actor: q.actor,
            action: q.action,
            subject: q.subject,
        };
        Ok((filter, before, limit))
    })();
    let (filter, before, limit) = match result {
        Ok(v) => v,
        Err(e) => return error_response(&e),
    };
    let db = api.workspaces.db().clone();
    let page =
        blocking(move || cloud_harness_control::audit::list(&db, &filter, before, limit)).await;
    answer(
        StatusCode::OK,
        page.map(|(entries, next)| {
            let mut v = json!({ "entries": entries });
            if let Some(n) = next {
                v["nextCursor"] = json!(cursor_of(n));
            }
            v
        }),
    )
}

/// The workspaces the caller reaches (a client's own, every one for an operator): those open,
/// and those a restart could not serve again, with why.
async fn workspaces(
    axum::extract::State(api): State,
    axum::Extension(id): axum::Extension<Identity>,
) -> Response {
    let who = cloud_harness_control::principal::Principal::of(&id);
    let mut all: Vec<Value> = api
        .workspaces
        .open_workspaces_of(&who)
        .iter()
        .map(|ws| ws.summary())
        .collect();
    // Those a restart could not serve again, with why: they stay until closed.
    all.extend(
        api.workspaces
            .failures()
            .iter()
            .filter(|f| who.reaches(f.owner()))
            .map(|f| f.summary()),
    );
    // Opens in progress, each with its step, steps done of the total and bytes fetched.
    let opening = api.workspaces.opening_of(&who);
    answer(
        StatusCode::OK,
        Ok(json!({ "workspaces": all, "opening": opening })),
    )
}

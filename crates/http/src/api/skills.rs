//! `/api/v1/skills`: the library.

use super::{answer, blocking, cursor_of, cursor_value, query, Query, State};
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use cloud_harness_auth::http::error_response;
use cloud_harness_auth::Identity;
use cloud_harness_control::principal::Principal;
use cloud_harness_error::{Code, Error};
use cloud_harness_store::cas::Digest;
use cloud_harness_workspace::library::{self, Search};
use serde_json::json;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct SkillsQuery {
    q: Option<String>,
    tier: Option<String>,
    toolkit: Option<String>,
    #[serde(default)]
    warnings: bool,
    #[serde(default)]
    problems: bool,
    cursor: Option<String>,
    limit: Option<usize>,
}

const PAGE: usize = 50;
const MAX_PAGE: usize = 500;

pub async fn list(
    axum::extract::State(api): State,
    axum::Extension(id): axum::Extension<Identity>,
    q: Query<SkillsQuery>,
) -> Response {
    let who = Principal::of(&id);
    let asked = query(q).and_then(|q| {
        let limit = q.limit.unwrap_or(PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(Error::field(
                Code::InvalidArgument,
                "limit",
                format!("must be 1 to {MAX_PAGE}"),
            ));
        }
        if q.q.as_deref().is_some_and(|t| t.len() > 256) {
            return Err(Error::field(
                Code::InvalidArgument,
                "q",
                "at most 256 bytes",
            ));
        }
        if q.tier
            .as_deref()
            .is_some_and(|t| t != "builtin" && t != "store")
        {
            return Err(Error::field(
                Code::InvalidArgument,
                "tier",
                "`builtin` or `store`",
            ));
        }
        let offset = q
            .cursor
            .as_deref()
            .map(cursor_value)
            .transpose()?
            .unwrap_or(0);
        Ok(Search {
            text: q.q,
            tier: q.tier,
            toolkit: q.toolkit,
            warnings: q.warnings,
            problems: q.problems,
            offset: offset.max(0) as usize,
            limit,
        })
    });
    let search = match asked {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let api2 = api.clone();
    let found = blocking(move || {
        let ws = &api2.workspaces;
        let (page, total) = api2.library.search(ws.store(), &search)?;
        let registry = cloud_harness_curation::registry::load(ws.db())?;
        let sets = cloud_harness_curation::sets::list(ws.db())?;
        let used = library::used_by(ws, &who, &registry, &sets, &page);
        let skills: Vec<_> = page
            .iter()
            .zip(used)
            .map(|(s, u)| {
                let mut v = json!(s);
                v["usedBy"] = u;
                v
            })
            .collect();
        let mut v = json!({ "skills": skills, "total": total });
        let next = search.offset + search.limit;
        if next < total {
            v["nextCursor"] = json!(cursor_of(next as i64));
        }
        Ok(v)
    })
    .await;
    answer(StatusCode::OK, found)
}

pub async fn get(
    axum::extract::State(api): State,
    axum::Extension(id): axum::Extension<Identity>,
    Path(digest): Path<String>,
) -> Response {
    let who = Principal::of(&id);
    let found = blocking(move || {
        let digest = Digest::parse(&digest).map_err(|_| Error::field(Code::InvalidArgument, "digest", "must be sha256:<64 hex digits>"))?;
        let ws = &api.workspaces;
        let copies: Vec<library::Skill> = api
            .library
            .all(ws.store())?
            .iter()
            .flat_map(|b| b.iter().filter(|s| s.digest == digest).cloned().collect::<Vec<_>>())
            .collect();
        if copies.is_empty() {
            return Err(Error::field(Code::NotFound, "digest", format!("no skill {digest} in the library")));
        }
        let registry = cloud_harness_curation::registry::load(ws.db())?;
        let sets = cloud_harness_curation::sets::list(ws.db())?;
        let used = library::used_by(ws, &who, &registry, &sets, &copies);
        Ok(json!({
            "digest": digest,
            "copies": copies.iter().zip(used).map(|(s, u)| { let mut v = json!(s); v["usedBy"] = u; v }).collect::<Vec<_>>(),
            "files": library::files(ws.store(), &digest)?,
        }))
    })
    .await;
    answer(StatusCode::OK, found)
}

//! `/api/v1/inventory`: a bundle's inventory (CycloneDX 1.5 JSON), and which bundles,
//! workspaces and imports held a file or a skill (operators: it names every principal's).

use super::{answer, blocking, query, Query, State};
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use cloud_harness_error::{Code, Error};
use cloud_harness_provision::index::BundleIndex;
use cloud_harness_provision::inventory::{self, Needle};
use cloud_harness_store::cas::Digest;
use serde_json::json;

fn digest(field: &str, text: &str) -> cloud_harness_error::Result<Digest> {
    Digest::parse(text).map_err(|_| {
        Error::field(
            Code::InvalidArgument,
            field,
            "must be sha256:<64 hex digits>",
        )
    })
}

/// `GET /api/v1/inventory/{bundle}`.
pub async fn bundle(axum::extract::State(api): State, Path(bundle): Path<String>) -> Response {
    let found = blocking(move || {
        let bundle = digest("bundle", &bundle)?;
        let store = api.workspaces.store();
        inventory::of(
            store,
            &inventory::record(&BundleIndex::open(store), &bundle)?,
            api.workspaces.db(),
            api.workspaces.trust(),
        )
    })
    .await;
    answer(StatusCode::OK, found)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Search {
    file: Option<String>,
    skill: Option<String>,
}

/// `GET /api/v1/inventory?file=sha256:…` or `?skill=NAME`.
pub async fn search(axum::extract::State(api): State, q: Query<Search>) -> Response {
    let q = query(q);
    let found = blocking(move || {
        let q = q?;
        let needle =
            match (q.file, q.skill) {
                (Some(f), None) => Needle::File(digest("file", &f)?),
                (None, Some(s)) if !s.is_empty() && s.len() <= 64 => Needle::Skill(s),
                _ => return Err(Error::invalid(
                    "give one of file (sha256:<64 hex digits>) or skill (a name of 1 to 64 bytes)",
                )),
            };
        let ws = &api.workspaces;
        Ok(json!(inventory::search(ws.store(), ws.db(), &needle)?))
    })
    .await;
    answer(StatusCode::OK, found)
}

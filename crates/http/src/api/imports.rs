//! `/api/v1/imports` (jobs that acquire a toolkit) and `/api/v1/acquisitions` (the history of
//! every acquisition).

use super::{actor, answer, blocking, body, cursor_of, cursor_value, query, Query, State};
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::http::error_response;
use cloud_harness_auth::Identity;
use cloud_harness_error::{Code, Error};
use serde_json::{json, Value};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewImport {
    toolkit: Value,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Page {
    cursor: Option<String>,
    limit: Option<usize>,
}

const PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

fn limit(asked: Option<usize>) -> Result<usize, Error> {
    match asked.unwrap_or(PAGE) {
        n @ 1..=MAX_PAGE => Ok(n),
        _ => Err(Error::field(
            Code::InvalidArgument,
            "limit",
            format!("must be 1 to {MAX_PAGE}"),
        )),
    }
}

pub async fn submit(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    bytes: Bytes,
) -> Response {
    let imports = api.imports.clone();
    let job = blocking(move || {
        let req: NewImport = body(&bytes)?;
        imports.submit(req.toolkit, &actor(&who))
    })
    .await;
    answer(StatusCode::ACCEPTED, job.map(|j| json!(j)))
}

pub async fn list(axum::extract::State(api): State, q: Query<Page>) -> Response {
    let n = match query(q).and_then(|q| limit(q.limit)) {
        Ok(n) => n,
        Err(e) => return error_response(&e),
    };
    let imports = api.imports.clone();
    let jobs = blocking(move || imports.list(n)).await;
    answer(StatusCode::OK, jobs.map(|j| json!({ "imports": j })))
}

pub async fn get(axum::extract::State(api): State, Path(id): Path<String>) -> Response {
    let imports = api.imports.clone();
    let job = blocking(move || imports.get(&id)).await;
    answer(StatusCode::OK, job.map(|j| json!(j)))
}

pub async fn cancel(
    axum::extract::State(api): State,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    let imports = api.imports.clone();
    let job = blocking(move || imports.cancel(&id, &actor(&who))).await;
    answer(StatusCode::OK, job.map(|j| json!(j)))
}

pub async fn acquisitions(axum::extract::State(api): State, q: Query<Page>) -> Response {
    let asked = query(q).and_then(|q| {
        let before = q.cursor.as_deref().map(cursor_value).transpose()?;
        Ok((before, limit(q.limit)?))
    });
    let (before, n) = match asked {
        Ok(v) => v,
        Err(e) => return error_response(&e),
    };
    let db = api.workspaces.db().clone();
    let page = blocking(move || cloud_harness_provision::acquisitions::list(&db, before, n)).await;
    answer(
        StatusCode::OK,
        page.map(|(all, next)| {
            let mut v = json!({ "acquisitions": all });
            if let Some(n) = next {
                v["nextCursor"] = json!(cursor_of(n));
            }
            v
        }),
    )
}

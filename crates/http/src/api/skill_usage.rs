//! `GET /api/v1/usage/skills`: which skills were used over the last days, from where, by how
//! many principals and workspaces, with their uses per day (operators: it names every
//! principal's uses). A page at a time, in toolkit and skill order.

use super::{answer, blocking, query, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use cloud_harness_control::skill_usage::stored;
use cloud_harness_error::{Code, Error};
use serde_json::json;

/// The longest period asked, in days (the daily rows' default retention).
const MAX_DAYS: u64 = 400;
const DAY_MS: i64 = 24 * 3600 * 1000;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Asked {
    /// The last this many days, today included (default 30).
    days: Option<u64>,
    toolkit: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

/// A cursor: the (toolkit, skill) a page ended with, opaque to clients.
fn cursor_of(toolkit: &str, skill: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{toolkit}\0{skill}"))
}

fn cursor_value(cursor: &str) -> cloud_harness_error::Result<(String, String)> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            s.split_once('\0')
                .map(|(t, k)| (t.to_owned(), k.to_owned()))
        })
        .ok_or_else(|| {
            Error::field(
                Code::InvalidArgument,
                "after",
                "not a cursor this server gave",
            )
        })
}

pub async fn skills(axum::extract::State(api): State, q: Query<Asked>) -> Response {
    let q = query(q);
    let found = blocking(move || {
        let q = q?;
        let days = q.days.unwrap_or(30);
        if !(1..=MAX_DAYS).contains(&days) {
            return Err(Error::field(
                Code::InvalidArgument,
                "days",
                format!("from 1 to {MAX_DAYS}"),
            ));
        }
        let limit = q.limit.unwrap_or(100);
        if !(1..=stored::MAX_PAGE).contains(&limit) {
            return Err(Error::field(
                Code::InvalidArgument,
                "limit",
                format!("from 1 to {}", stored::MAX_PAGE),
            ));
        }
        let after = q.after.as_deref().map(cursor_value).transpose()?;
        let now = cloud_harness_control::state::now_ms();
        let since = stored::day_of(now - (days as i64 - 1) * DAY_MS);
        let db = api.workspaces.db();
        let after_ref = after.as_ref().map(|(t, s)| (t.as_str(), s.as_str()));
        let page = stored::skills(db, &since, q.toolkit.as_deref(), after_ref, limit + 1)?;
        let more = page.len() > limit;
        let page: Vec<_> = page.into_iter().take(limit).collect();
        let next = more
            .then(|| page.last().map(|s| cursor_of(&s.toolkit, &s.skill)))
            .flatten();
        Ok(json!({ "since": since, "skills": page, "next": next }))
    })
    .await;
    answer(StatusCode::OK, found)
}

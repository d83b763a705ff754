//! The usage of skills (operators: it names every principal's uses), over the last days:
//! `GET /api/v1/usage/skills`, per toolkit and skill, with their uses per day, a page at a
//! time; `GET /api/v1/usage/totals`, the period's uses per day; `GET /api/v1/usage/unused`,
//! the library's skills not used in the period, a page at a time.

use super::{answer, blocking, query, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use cloud_harness_control::skill_usage::report::{self, Period};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_workspace::unused_skills::{self, Unused};
use serde_json::json;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Asked {
    /// The last this many days, today included (default 30).
    pub days: Option<u64>,
    pub toolkit: Option<String>,
    pub after: Option<String>,
    pub limit: Option<usize>,
}

impl Asked {
    pub fn period(&self) -> Result<Period> {
        Period::last(
            self.days.unwrap_or(30),
            cloud_harness_control::state::now_ms(),
        )
    }

    pub fn toolkit(&self) -> Option<&str> {
        self.toolkit.as_deref().filter(|t| !t.is_empty())
    }

    fn after(&self) -> Option<&str> {
        self.after.as_deref().filter(|a| !a.is_empty())
    }
}

/// The skills used in the period, a page of them, and the next page's cursor.
pub fn skills(
    api: &super::Api,
    asked: &Asked,
) -> Result<(Period, Vec<report::SkillUse>, Option<String>)> {
    let period = asked.period()?;
    let db = api.workspaces.db();
    let (page, next) =
        report::skills_page(db, &period, asked.toolkit(), asked.after(), asked.limit)?;
    Ok((period, page, next))
}

/// The library's skills not used in the period, a page of them, and the next page's cursor.
pub fn unused(api: &super::Api, asked: &Asked) -> Result<(Period, Vec<Unused>, Option<String>)> {
    let period = asked.period()?;
    let (page, next) = unused_skills::page(
        &api.library,
        api.workspaces.store(),
        api.workspaces.db(),
        &period,
        asked.toolkit(),
        asked.after(),
        asked.limit,
    )?;
    Ok((period, page, next))
}

/// The period's uses per day.
pub fn totals(api: &super::Api, asked: &Asked) -> Result<(Period, Vec<report::Total>)> {
    let period = asked.period()?;
    let days = report::totals(
        api.workspaces.db(),
        &period.since,
        &period.until,
        asked.toolkit(),
    )?;
    Ok((period, days))
}

pub async fn get_skills(axum::extract::State(api): State, q: Query<Asked>) -> Response {
    let q = query(q);
    let found = blocking(move || {
        let (period, page, next) = skills(&api, &q?)?;
        Ok(json!({ "since": period.since, "until": period.until, "skills": page, "next": next }))
    })
    .await;
    answer(StatusCode::OK, found)
}

pub async fn get_totals(axum::extract::State(api): State, q: Query<Asked>) -> Response {
    let q = query(q);
    let found = blocking(move || {
        let q = q?;
        if q.after.is_some() || q.limit.is_some() {
            return Err(Error::new(
                Code::InvalidArgument,
                "the totals are one answer: no `after` or `limit`",
            ));
        }
        let (period, days) = totals(&api, &q)?;
        Ok(json!({ "since": period.since, "until": period.until, "days": days }))
    })
    .await;
    answer(StatusCode::OK, found)
}

pub async fn get_unused(axum::extract::State(api): State, q: Query<Asked>) -> Response {
    let q = query(q);
    let found = blocking(move || {
        let (period, page, next) = unused(&api, &q?)?;
        Ok(json!({ "since": period.since, "until": period.until, "skills": page, "next": next }))
    })
    .await;
    answer(StatusCode::OK, found)
}

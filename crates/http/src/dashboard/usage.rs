//! `/usage`: which skills were used over the last days, per toolkit and skill: a chart of the
//! uses per day, then each skill's reads, resource reads, mount loads and runs, its runs'
//! failure rate, when it was last used and by how many principals and workspaces; or, as a
//! filter, the library's skills never used in those days. A page at a time; the same data as
//! `GET /api/v1/usage/…`.

use super::{blocking, chart, layout};
use crate::api::skill_usage::{self, Asked};
use crate::api::Api;
use axum::extract::{Query, State};
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::{Identity, Role};
use cloud_harness_control::skill_usage::report::SkillUse;
use cloud_harness_error::{Code, Error};
use cloud_harness_workspace::unused_skills::Unused;
use maud::{html, Markup};
use std::sync::Arc;

/// The periods offered, in days.
const PERIODS: [u64; 4] = [7, 30, 90, 400];
const PAGE: usize = 100;

#[derive(serde::Deserialize, Default)]
pub(crate) struct Filters {
    #[serde(default)]
    days: Option<u64>,
    #[serde(default)]
    toolkit: String,
    /// `unused`: the library's skills not used in the period.
    #[serde(default)]
    show: String,
    #[serde(default)]
    after: String,
}

enum Listed {
    Used(Vec<SkillUse>),
    Unused(Vec<Unused>),
}

pub async fn page(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    q: Result<Query<Filters>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if who.role < Role::Operator {
        return layout::error(
            &who,
            &Error::new(Code::Forbidden, "the usage of skills is for operators"),
        );
    }
    let f = q.map(|q| q.0).unwrap_or_default();
    let days = f.days.unwrap_or(30);
    let unused = f.show == "unused";
    let asked = Asked {
        days: Some(days),
        toolkit: Some(f.toolkit.clone()),
        after: Some(f.after.clone()),
        limit: Some(PAGE),
    };
    let a = api.clone();
    let found = blocking(move || {
        let (period, totals) = skill_usage::totals(&a, &asked)?;
        let (listed, next) = if unused {
            let (_, page, next) = skill_usage::unused(&a, &asked)?;
            (Listed::Unused(page), next)
        } else {
            let (_, page, next) = skill_usage::skills(&a, &asked)?;
            (Listed::Used(page), next)
        };
        Ok((period, totals, listed, next))
    })
    .await;
    let (period, totals, listed, next) = match found {
        Ok(v) => v,
        Err(e) => return layout::error(&who, &e),
    };
    let link = |after: &str| {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("days", &days.to_string())
            .append_pair("toolkit", &f.toolkit);
        if unused {
            q.append_pair("show", "unused");
        }
        if !after.is_empty() {
            q.append_pair("after", after);
        }
        format!("/usage?{}", q.finish())
    };
    // The period's days, as the totals have them.
    let days_of_period: Vec<String> = totals.iter().map(|t| t.day.clone()).collect();
    layout::page(
        "Usage",
        "/usage",
        &who,
        html! {
            form.filters method="get" action="/usage" {
                label { "Period" select name="days" {
                    @for p in PERIODS {
                        option value=(p) selected[p == days] { "last " (p) " days" }
                    }
                    @if !PERIODS.contains(&days) {
                        option value=(days) selected { "last " (days) " days" }
                    }
                } }
                label { "Toolkit" input type="text" name="toolkit" value=(f.toolkit) placeholder="repository URL or name"; }
                label { "Show" select name="show" {
                    option value="" selected[!unused] { "skills used" }
                    option value="unused" selected[unused] { "skills never used" }
                } }
                button type="submit" { "Show" }
            }
            p.hint { "From " (period.since) " to " (period.until) " (UTC)"
                @if !f.toolkit.is_empty() { ", toolkit " code { (f.toolkit) } } "." }
            (chart::days(&totals))
            (chart::days_table(&totals))
            @match &listed {
                Listed::Used(skills) => (used_table(skills, &days_of_period)),
                Listed::Unused(skills) => (unused_table(skills, days, !f.toolkit.is_empty(), next.is_some())),
            }
            nav aria-label="Pages" {
                @if !f.after.is_empty() { a href=(link("")) rel="first" { "First page" } " " }
                @if let Some(next) = &next { a href=(link(next)) rel="next" { "Next" } }
            }
        },
    )
}

fn used_table(skills: &[SkillUse], period: &[String]) -> Markup {
    let n = |s: &SkillUse, source: &str| s.uses.get(source).copied().unwrap_or(0);
    html! {
        @if skills.is_empty() {
            p.empty { "No skill was used in this period." }
        } @else {
            table.usage { thead { tr {
                th scope="col" { "Skill" } th scope="col" { "Toolkit" }
                @for (_, name) in chart::SOURCES { th scope="col" { (capitalized(name)) } }
                th scope="col" { "Failed runs" } th scope="col" { "Last used" }
                th scope="col" { "Principals" } th scope="col" { "Workspaces" } th scope="col" { "Per day" }
            } }
                tbody { @for s in skills { tr {
                    th scope="row" { a href={ "/library?q=" (query_value(&s.skill)) } { (s.skill) } }
                    td { (s.toolkit) }
                    @for (source, _) in chart::SOURCES { td.n { (n(s, source)) } }
                    td.n { (failure_rate(s.run_failures, n(s, "run"))) }
                    td.when { (layout::when(s.last_used)) }
                    td.n { (s.principals) }
                    td.n { (s.workspaces) }
                    td { (chart::sparkline(period, &s.days)) }
                } } }
            }
        }
    }
}

fn unused_table(skills: &[Unused], days: u64, one_toolkit: bool, more: bool) -> Markup {
    html! {
        @if skills.is_empty() {
            p.empty {
                @if one_toolkit { "No skill of this toolkit in the library went unused in the last " (days) " days (or the library has no toolkit of that name)." }
                @else { "Every skill of the library was used in the last " (days) " days." }
            }
        } @else {
            p { "Skills of the library no workspace used in the last " (days) " days"
                @if more { " (a page of them)" } ":" }
            table.usage { thead { tr {
                th scope="col" { "Skill" } th scope="col" { "Toolkit" } th scope="col" { "Newest commit in the store" } th scope="col" { "Last used" }
            } }
                tbody { @for s in skills { tr {
                    th scope="row" { a href={ "/library?q=" (query_value(&s.skill)) } { (s.skill) } }
                    td { (s.toolkit) @if s.name != s.toolkit { br; small { (s.name) } } }
                    td { @if let Some(c) = &s.commit { code { (c.get(..12).unwrap_or(c)) } } }
                    td.when { @match s.last_used { Some(at) => (layout::when(at)), None => span.hint { "not in the days kept" } } }
                } } }
            }
        }
    }
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

fn query_value(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Failed runs out of all, as a share: "1 of 2 (50%)".
fn failure_rate(failures: i64, runs: i64) -> String {
    if runs <= 0 {
        return "–".to_owned();
    }
    format!("{failures} of {runs} ({}%)", failures * 100 / runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_names_read_as_people_write_them() {
        assert_eq!(failure_rate(1, 2), "1 of 2 (50%)");
        assert_eq!(failure_rate(0, 0), "–");
        assert_eq!(capitalized("mount loads"), "Mount loads");
        assert_eq!(query_value("a b&c"), "a+b%26c");
    }
}

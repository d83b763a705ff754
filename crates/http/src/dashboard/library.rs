//! `/library`: every skill, searched (name, description, toolkit), filtered (tier, toolkit,
//! warnings) and paged; below, the skill folders the toolkits left out, with why.

use super::{blocking, layout};
use crate::api::Api;
use axum::extract::{Query, State};
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::Identity;
use cloud_harness_skills::spec::Problem;
use cloud_harness_workspace::library::Search;
use maud::{html, Markup};
use std::sync::Arc;

const PAGE: usize = 50;
/// Skipped skill folders shown at most (the count says how many there are).
const SKIPPED_SHOWN: usize = 50;

#[derive(serde::Deserialize, Default)]
pub(crate) struct Filters {
    #[serde(default)]
    q: String,
    #[serde(default)]
    tier: String,
    #[serde(default)]
    toolkit: String,
    #[serde(default)]
    warnings: Option<String>,
    #[serde(default)]
    problems: Option<String>,
    #[serde(default)]
    page: usize,
}

pub async fn list(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    q: Result<Query<Filters>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let f = q.map(|q| q.0).unwrap_or_default();
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let search = Search {
        text: some(&f.q),
        tier: some(&f.tier),
        toolkit: some(&f.toolkit),
        warnings: f.warnings.is_some(),
        problems: f.problems.is_some(),
        offset: f.page * PAGE,
        limit: PAGE,
    };
    let a = api.clone();
    let found = blocking(move || {
        let store = a.workspaces.store();
        let found = a.library.search(store, &search)?;
        Ok((found, a.library.skipped(store)?))
    })
    .await;
    let ((skills, total), skipped) = match found {
        Ok(v) => v,
        Err(e) => return layout::error(&who, &e),
    };
    let link = |page: usize| {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("q", &f.q)
            .append_pair("tier", &f.tier)
            .append_pair("toolkit", &f.toolkit);
        if f.warnings.is_some() {
            q.append_pair("warnings", "on");
        }
        if f.problems.is_some() {
            q.append_pair("problems", "on");
        }
        format!("/library?{}&page={page}", q.finish())
    };
    layout::page(
        "Library",
        "/library",
        &who,
        html! {
            form.search method="get" action="/library" role="search" {
                label { "Search" input type="search" name="q" value=(f.q) placeholder="name, description or toolkit"; }
                label { "Tier" select name="tier" {
                    option value="" selected[f.tier.is_empty()] { "any" }
                    option value="builtin" selected[f.tier == "builtin"] { "built-in" }
                    option value="store" selected[f.tier == "store"] { "toolkits" }
                } }
                label { "Toolkit" input type="text" name="toolkit" value=(f.toolkit); }
                label { "With warnings" input type="checkbox" name="warnings" checked[f.warnings.is_some()]; }
                label { "Breaking the specification" input type="checkbox" name="problems" checked[f.problems.is_some()]; }
                button type="submit" { "Search" }
            }
            p { (total) " skills" @if total > 0 { ", showing " (f.page * PAGE + 1) "–" (f.page * PAGE + skills.len()) } }
            @if skills.is_empty() {
                p.empty { "No skill matches. Try fewer words, or import a toolkit." }
            } @else {
                table { thead { tr { th { "Skill" } th { "Description" } th { "Toolkit" } th { "Tier" } th { "Specification" } th { "Warnings" } } }
                    tbody { @for s in &skills { tr {
                        td { a href={ "/skills/" (s.digest) } { (s.name) } }
                        td { (s.description) }
                        td { (s.toolkit) }
                        td { (s.tier) }
                        td { (spec_badge(&s.problems)) }
                        td { @if !s.warnings.is_empty() { span.warn { (s.warnings.len()) } } }
                    } } }
                }
            }
            nav aria-label="Pages" {
                @if f.page > 0 { a href=(link(f.page - 1)) rel="prev" { "Previous" } " " }
                @if (f.page + 1) * PAGE < total { a href=(link(f.page + 1)) rel="next" { "Next" } }
            }
            @if !skipped.is_empty() {
                h2 id="skipped" { "Skipped" }
                p { (skipped.len()) " skill folders of the toolkits were left out"
                    @if skipped.len() > SKIPPED_SHOWN { ", the first " (SKIPPED_SHOWN) " shown" } "." }
                table { thead { tr { th { "Toolkit" } th { "Folder" } th { "Code" } th { "Reason" } } }
                    tbody { @for s in skipped.iter().take(SKIPPED_SHOWN) { tr {
                        td { (s.toolkit) }
                        td { code { (s.path) } }
                        td { (s.code) }
                        td { (s.reason) }
                    } } }
                }
            }
        },
    )
}

/// Whether a skill follows the Agent Skills specification: "valid", or how many problems, the
/// rules named in its title.
pub(crate) fn spec_badge(problems: &[Problem]) -> Markup {
    if problems.is_empty() {
        return html! { span.badge.valid { "valid" } };
    }
    let rules = cloud_harness_skills::spec::rule_names(problems);
    let n = problems.len();
    html! {
        span.badge.problems title=(rules) {
            (n) @if n == 1 { " problem" } @else { " problems" }
            span.sr-only { ": " (rules) }
        }
    }
}

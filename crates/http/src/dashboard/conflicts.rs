//! `/conflicts`: each launch conflict with its candidates side by side (source, commit,
//! digest) and a diff of their SKILL.md, and a button per candidate that settles the conflict
//! with an operator override choosing it.

use super::{blocking, check_csrf, layout};
use crate::api::Api;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cloud_harness_auth::Identity;
use cloud_harness_curation::conflicts::{self, LaunchConflict};
use maud::{html, Markup};
use serde_json::Value;
use similar::{ChangeTag, TextDiff};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::layout::short;

#[derive(serde::Deserialize)]
pub struct Settle {
    #[serde(default)]
    source: String,
    /// Empty: for every workspace; else the set it is for.
    #[serde(default)]
    set: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    csrf: String,
}

pub async fn page(State(api): State<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    render(&api, &who, html! {}).await
}

async fn render(api: &Arc<Api>, who: &Identity, notice: Markup) -> Response {
    let db = api.workspaces.db().clone();
    // The diffs are work: made on the blocking pool, within the page's deadline.
    let viewer = who.clone();
    let body = blocking(move || {
        let all = conflicts::list(&db, true)?;
        let deadline = Instant::now()
            + Duration::from_millis(
                cloud_harness_control::limits::quotas()
                    .limits
                    .request_millis,
            );
        Ok(body(&viewer, notice, &all, deadline))
    })
    .await;
    match body {
        Ok(body) => layout::page("Conflicts", "/conflicts", who, body),
        Err(e) => layout::error(who, &e),
    }
}

fn body(who: &Identity, notice: Markup, all: &[LaunchConflict], deadline: Instant) -> Markup {
    let (open, settled): (Vec<&LaunchConflict>, Vec<&LaunchConflict>) =
        all.iter().partition(|c| c.settled_at.is_none());
    html! {
            (notice)
            p { "Two toolkits of one tier that bring the same skill name make a launch conflict: the workspace is refused rather than one copy guessed. Choose the copy that wins; the same request then opens." }
            @if open.is_empty() {
                p.empty { "No launch conflict waits. One appears here when a workspace_open is refused for one." }
            }
            @for c in &open { (conflict(who, c, deadline)) }
            @if !settled.is_empty() {
                h2 { "Settled" }
                table { thead { tr { th { "Skill" } th { "Tier" } th { "Settled by" } th { "When" } th { "Override" } } }
                    tbody { @for c in &settled { tr {
                        td { (c.skill) } td { (c.tier) }
                        td { (c.settled_by.as_deref().unwrap_or("")) }
                        td { (c.settled_at.map(layout::when).unwrap_or_default()) }
                        td { code { (c.override_id.as_deref().unwrap_or("")) } }
                    } } }
                }
            }
    }
}

fn conflict(who: &Identity, c: &LaunchConflict, deadline: Instant) -> Markup {
    let candidates: Vec<&Value> = c
        .candidates
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let text = |v: &Value| v["skillMd"].as_str().unwrap_or("").to_owned();
    // The sets the refused request asked for: an override may be for one of them only.
    let sets: Vec<&str> = c.request["toolkits"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter(|t| t["kind"] == "set")
                .filter_map(|t| t["id"].as_str())
                .collect()
        })
        .unwrap_or_default();
    html! {
        section.conflict aria-labelledby={ "c-" (c.id) } {
            h2 id={ "c-" (c.id) } { (c.skill) " " small { "in the " (c.tier) " tier" } }
            p { "Refused " (c.refusals) " time(s), last " (layout::when(c.last_at)) " for " (c.actor)
                @if let Some(k) = c.request["idempotencyKey"].as_str() { " (key " code { (k) } ")" } "." }
            div.side-by-side {
                @for cand in &candidates {
                    article.candidate aria-label={ "Candidate " (cand["source"].as_str().unwrap_or("")) } {
                        h3 { (cand["source"].as_str().unwrap_or("")) }
                        dl.facts {
                            dt { "Toolkit" } dd { (cand["toolkit"].as_str().unwrap_or("")) }
                            dt { "URL" } dd { small { (cand["url"].as_str().unwrap_or("")) } }
                            dt { "Commit" } dd { code { (short(cand["commit"].as_str().unwrap_or(""))) } }
                            dt { "Digest" } dd { @if let Some(d) = cand["digest"].as_str() { a href={ "/skills/" (d) } { code { (short(d)) } } } }
                            dt { "Path" } dd { code { (cand["path"].as_str().unwrap_or("")) } }
                        }
                        @if layout::operator(who) {
                            form.stack method="post" action={ "/conflicts/" (c.id) "/settle" } {
                                (layout::csrf(who))
                                input type="hidden" name="source" value=(cand["source"].as_str().unwrap_or(""));
                                @if !sets.is_empty() {
                                    label { "For" select name="set" {
                                        option value="" { "every workspace" }
                                        @for s in &sets { option value=(s) { "workspaces of set " (s) } }
                                    } }
                                }
                                label { "Reason" input type="text" name="reason"; }
                                button type="submit" { "Choose " (cand["source"].as_str().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
            @if let [first, rest @ ..] = candidates.as_slice() {
                @for other in rest {
                    h3 { "SKILL.md: " (first["source"].as_str().unwrap_or("")) " → " (other["source"].as_str().unwrap_or("")) }
                    (diff(&text(first), &text(other), deadline))
                }
            }
        }
    }
}

/// A line diff of two texts (hostile: every line escaped). The page's diffs share one
/// deadline, the `request_millis` limit from the page's start: past it, a diff is approximate
/// (still correct, less minimal), so large, unlike SKILL.md files cannot hold a request for
/// seconds.
fn diff(a: &str, b: &str, deadline: Instant) -> Markup {
    let d = TextDiff::configure().deadline(deadline).diff_lines(a, b);
    html! {
        pre.diff aria-label="SKILL.md diff" { @for change in d.iter_all_changes() {
            @let line = change.value().trim_end_matches('\n');
            @match change.tag() {
                ChangeTag::Delete => { del { "- " (line) } "\n" }
                ChangeTag::Insert => { ins { "+ " (line) } "\n" }
                ChangeTag::Equal => { span { "  " (line) } "\n" }
            }
        } }
    }
}

pub async fn settle(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    Form(form): Form<Settle>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let ws = api.workspaces.clone();
    let actor = who.actor();
    let done = blocking(move || {
        let some = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        let (set, reason) = (some(&form.set), some(&form.reason));
        conflicts::settle(
            ws.db(),
            ws.home(),
            &id,
            &form.source,
            set.as_deref(),
            reason.as_deref(),
            &actor,
        )
    })
    .await;
    match done {
        Ok(_) => Redirect::to("/conflicts").into_response(),
        Err(e) => render(&api, &who, layout::alert(&e)).await,
    }
}

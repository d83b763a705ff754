//! `/approvals`: runs refused for want of an approval, each with the script it asked to run
//! (its content) and the skill's files, to approve; and the approvals in force, to revoke.

use super::{blocking, check_csrf, layout};
use crate::api::Api;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cloud_harness_auth::Identity;
use cloud_harness_curation::decisions::{self, Decision, Kind, Pending, What};
use cloud_harness_error::{Code, Error};
use cloud_harness_store::cas::Digest;
use maud::{html, Markup};
use serde_json::Value;
use std::sync::Arc;

/// The most of a script the page shows.
const MAX_SCRIPT: u64 = 64 << 10;

#[derive(serde::Deserialize)]
pub struct Approve {
    #[serde(default)]
    digest: String,
    #[serde(default)]
    skill: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    csrf: String,
}

#[derive(serde::Deserialize)]
pub struct Revoke {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    csrf: String,
}

/// A pending run with what the page shows of it.
struct Shown {
    run: Pending,
    files: Vec<Value>,
    /// The script's text; `None` when it is not text (or not in the store).
    script: Option<String>,
}

pub async fn page(State(api): State<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    render(&api, &who, html! {}).await
}

async fn render(api: &Arc<Api>, who: &Identity, notice: Markup) -> Response {
    let ws = api.workspaces.clone();
    let data = blocking(move || {
        let pending = decisions::pending(ws.db(), ws.home())?;
        let shown: Vec<Shown> = pending
            .into_iter()
            .map(|run| {
                let files = Digest::parse(&run.digest)
                    .ok()
                    .and_then(|d| cloud_harness_workspace::library::files(ws.store(), &d).ok())
                    .unwrap_or_default();
                let script = files
                    .iter()
                    .find(|f| f["path"] == run.script.as_str())
                    .and_then(|f| Digest::parse(f["digest"].as_str()?).ok())
                    .and_then(|d| ws.store().blob_up_to(&d, MAX_SCRIPT).ok())
                    .and_then(|b| String::from_utf8(b).ok());
                Shown { run, files, script }
            })
            .collect();
        let approvals: Vec<Decision> = decisions::list(ws.db(), ws.home(), false)?
            .into_iter()
            .filter(|d| matches!(d.what, What::Approval { .. }))
            .collect();
        Ok((shown, approvals))
    })
    .await;
    let (pending, approvals) = match data {
        Ok(d) => d,
        Err(e) => return layout::error(who, &e),
    };
    layout::page(
        "Approvals",
        "/approvals",
        who,
        html! {
            (notice)
            p { "A skill's scripts run in a workspace's executor once an operator has approved that exact copy (its digest). Read what it runs, then approve." }
            h2 { "Waiting" }
            @if pending.is_empty() {
                p.empty { "No run waits for an approval. One appears here when skills_run is refused for one." }
            }
            @for p in &pending { (pending_run(who, p)) }
            h2 { "In force" }
            @if approvals.is_empty() { p.empty { "No approval is in force." } }
            @else {
                table { thead { tr { th { "Skill" } th { "Digest" } th { "By" } th { "Reason" } th { span.sr-only { "Actions" } } } }
                    tbody { @for d in &approvals { @if let What::Approval { digest, skill } = &d.what { tr {
                        td { (skill.as_deref().unwrap_or("")) }
                        td { a href={ "/skills/" (digest) } { code { (super::layout::short(&digest.hex())) } } }
                        td { (d.actor) ", " (layout::when(d.created_at)) }
                        td { (d.reason.as_deref().unwrap_or("")) }
                        td { @if d.managed { em { "managed (operator.json)" } } @else if layout::operator(who) {
                            form.inline method="post" action={ "/approvals/" (d.id) "/revoke" } {
                                (layout::csrf(who))
                                input type="hidden" name="reason" value="revoked on the dashboard";
                                button type="submit" aria-label={ "Revoke approval of " (skill.as_deref().unwrap_or("")) } { "Revoke" }
                            }
                        } }
                    } } } }
                }
            }
        },
    )
}

fn pending_run(who: &Identity, p: &Shown) -> Markup {
    let r = &p.run;
    html! {
        section.pending aria-labelledby={ "p-" (r.digest) } {
            h3 id={ "p-" (r.digest) } { (r.skill) ": " code { (r.script) } }
            p { "Asked " (r.refusals) " time(s), last " (layout::when(r.last_at)) " in workspace " code { (r.workspace) } ". Copy "
                a href={ "/skills/" (r.digest) } { code { (r.digest) } } "." }
            h4 { "The script" }
            @match &p.script {
                Some(text) => { pre aria-label={ "Script " (r.script) } { (text) } }
                None => { p.warn { "Not text (or larger than 64 KiB): read it from the skill's files before approving." } }
            }
            h4 { "The skill's files" }
            ul { @for f in &p.files { li { code { (f["path"].as_str().unwrap_or("")) } " (" (f["size"]) " bytes)" } } }
            @if layout::operator(who) {
                form.filters method="post" action="/approvals" {
                    (layout::csrf(who))
                    input type="hidden" name="digest" value=(r.digest);
                    input type="hidden" name="skill" value=(r.skill);
                    label { "Reason" input type="text" name="reason" placeholder="what you checked"; }
                    button type="submit" aria-label={ "Approve " (r.skill) } { "Approve" }
                }
            }
        }
    }
}

pub async fn approve(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Form(form): Form<Approve>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (db, actor) = (api.workspaces.db().clone(), who.actor());
    let done = blocking(move || {
        let digest = Digest::parse(&form.digest)
            .map_err(|_| Error::field(Code::InvalidArgument, "digest", "not a skill digest"))?;
        let some = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        let (skill, reason) = (some(&form.skill), some(&form.reason));
        decisions::approve(&db, &digest, skill.as_deref(), reason.as_deref(), &actor)
    })
    .await;
    match done {
        Ok(_) => Redirect::to("/approvals").into_response(),
        Err(e) => render(&api, &who, layout::alert(&e)).await,
    }
}

pub async fn revoke(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    Form(form): Form<Revoke>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (db, actor) = (api.workspaces.db().clone(), who.actor());
    let done = blocking(move || {
        let reason = (!form.reason.trim().is_empty()).then(|| form.reason.trim().to_owned());
        decisions::revoke(&db, Kind::Approval, &id, reason.as_deref(), &actor)
    })
    .await;
    match done {
        Ok(()) => Redirect::to("/approvals").into_response(),
        Err(e) => render(&api, &who, layout::alert(&e)).await,
    }
}

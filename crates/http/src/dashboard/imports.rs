//! `/imports`: forms to import a preset or a git toolkit (checked as the API checks them,
//! errors shown at the field), the running jobs with live progress (`live.js`), and the
//! history with each job's result or error.

use super::layout::short;
use super::{blocking, check_csrf, layout, patterns};

use crate::api::Api;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cloud_harness_auth::Identity;
use cloud_harness_error::Error;
use cloud_harness_workspace::imports::Job;
use maud::{html, Markup};
use serde_json::{json, Value};
use std::sync::Arc;

const HISTORY: usize = 100;

/// Both forms' fields; `kind` says which form was sent.
#[derive(serde::Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewImport {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    url: String,
    #[serde(default, rename = "ref")]
    git_ref: String,
    #[serde(default)]
    instance_id: String,
    #[serde(default)]
    include: String,
    #[serde(default)]
    exclude: String,
    #[serde(default)]
    csrf: String,
}

#[derive(serde::Deserialize)]
pub(crate) struct Csrf {
    #[serde(default)]
    csrf: String,
}

impl NewImport {
    /// The toolkit spec the API would be sent (empty fields left out).
    fn spec(&self) -> Value {
        let mut v = json!({ "kind": self.kind });
        let mut put = |k: &str, s: &str| {
            if !s.trim().is_empty() {
                v[k] = json!(s.trim());
            }
        };
        if self.kind == "git" {
            put("url", &self.url);
            put("ref", &self.git_ref);
            let instance = match self.instance_id.trim() {
                "" => super::instance_from_url(&self.url),
                given => given.to_owned(),
            };
            put("instanceId", &instance);
            let (include, exclude) = (patterns(&self.include), patterns(&self.exclude));
            if !include.is_empty() || !exclude.is_empty() {
                v["skills"] = json!({ "include": include, "exclude": exclude });
            }
        } else {
            put("id", &self.id);
            put("version", &self.version);
        }
        v
    }
}

pub async fn page(State(api): State<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    render(&api, &who, NewImport::default(), None).await
}

pub async fn submit(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Form(form): Form<NewImport>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (imports, spec, actor) = (api.imports.clone(), form.spec(), who.actor());
    match blocking(move || imports.submit(spec, &actor)).await {
        // Post, redirect, get: a reload does not import twice.
        Ok(_) => Redirect::to("/imports").into_response(),
        Err(e) => {
            let mut r = render(&api, &who, form, Some(e.clone())).await;
            *r.status_mut() = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            r
        }
    }
}

pub async fn cancel(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    Form(form): Form<Csrf>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (imports, actor) = (api.imports.clone(), who.actor());
    match blocking(move || imports.cancel(&id, &actor)).await {
        Ok(_) => Redirect::to("/imports").into_response(),
        Err(e) => layout::error(&who, &e),
    }
}

async fn render(api: &Arc<Api>, who: &Identity, form: NewImport, error: Option<Error>) -> Response {
    let a = api.clone();
    let data = blocking(move || {
        let jobs = a.imports.list(HISTORY)?;
        let registry = cloud_harness_curation::registry::load(a.workspaces.db())?;
        let ids: Vec<String> = registry.ids().into_iter().map(str::to_owned).collect();
        Ok((jobs, ids))
    })
    .await;
    let (jobs, presets) = match data {
        Ok(d) => d,
        Err(e) => return layout::error(who, &e),
    };
    let (running, ended): (Vec<&Job>, Vec<&Job>) = jobs
        .iter()
        .partition(|j| matches!(j.state.as_str(), "queued" | "running"));
    let e = error.as_ref();
    let sent = |kind: &str| form.kind == kind;
    layout::page(
        "Imports",
        "/imports",
        who,
        html! {
            p { "An import brings a toolkit into the store, so every workspace that asks for it later starts warm, without the network." }
            @if layout::operator(who) {
                div.columns {
                    section aria-labelledby="import-preset" {
                        h2 id="import-preset" { "Import a preset" }
                        @if sent("preset") { @if let Some(e) = e { (layout::alert(e)) } }
                        form.stack method="post" action="/imports" {
                            (layout::csrf(who))
                            input type="hidden" name="kind" value="preset";
                            label { "Preset" select name="id" {
                                @for p in &presets { option value=(p) selected[sent("preset") && form.id == *p] { (p) } }
                            } }
                            @if sent("preset") { (layout::field_error(e, "id")) }
                            label { "Version (a tag or commit; empty: the pin, or the default branch)" input type="text" name="version" value=(if sent("preset") { form.version.as_str() } else { "" }); }
                            @if sent("preset") { (layout::field_error(e, "version")) }
                            button type="submit" { "Import preset" }
                        }
                    }
                    section aria-labelledby="import-git" {
                        h2 id="import-git" { "Import a git toolkit" }
                        @if sent("git") { @if let Some(e) = e { (layout::alert(e)) } }
                        form.stack method="post" action="/imports" {
                            (layout::csrf(who))
                            input type="hidden" name="kind" value="git";
                            (git_fields(&form, e))
                            button type="submit" { "Import git toolkit" }
                        }
                    }
                }
            }
            h2 { "Running" }
            @if running.is_empty() {
                p.empty { "No job is running. Import a toolkit above to start one." }
            } @else {
                p { a href="/imports" { "Refresh" } " (this page follows the jobs by itself where scripts run)" }
                (jobs_table(who, &running, true))
            }
            h2 { "History" }
            @if ended.is_empty() {
                p.empty { "No import has ended yet." }
            } @else {
                (jobs_table(who, &ended, false))
            }
        },
    )
}

/// The git form's fields, as sent when the form comes back with an error.
fn git_fields(form: &NewImport, e: Option<&Error>) -> Markup {
    let git = form.kind == "git";
    let val = |s: &str| if git { s.to_owned() } else { String::new() };
    let err = |f: &str| {
        if git {
            layout::field_error(e, f)
        } else {
            html! {}
        }
    };
    html! {
        label { "Repository URL (HTTPS, on the allowlist)" input type="url" name="url" required value=(val(&form.url)); }
        (err("url"))
        label { "Commit (or a tag; empty: the default branch head)" input type="text" name="ref" value=(val(&form.git_ref)); }
        (err("ref"))
        label { "Instance id (empty: the repository's name)" input type="text" name="instanceId" value=(val(&form.instance_id)); }
        (err("instanceId"))
        label { "Include (skill names or globs, comma-separated; empty: all)" input type="text" name="include" value=(val(&form.include)); }
        (err("skills.include"))
        label { "Exclude (comma-separated)" input type="text" name="exclude" value=(val(&form.exclude)); }
        (err("skills.exclude"))
    }
}

fn jobs_table(who: &Identity, jobs: &[&Job], live: bool) -> Markup {
    html! {
        table {
            thead { tr { th { "Job" } th { "Toolkit" } th { "State" } th { "Phase" } th { "Progress" } th { "Result" } th { "By" } @if live { th { span.sr-only { "Actions" } } } } }
            tbody { @for j in jobs {
                tr data-job=(j.id) data-live[live] {
                    td { code { (j.id) } br; small { (layout::when(j.created_at)) } }
                    td { (toolkit_name(&j.toolkit)) }
                    td data-field="state" { (j.state) }
                    td data-field="phase" { (j.phase.as_deref().unwrap_or("")) }
                    td data-field="bytes" {
                        @if let Some(b) = j.bytes.or(j.result.as_ref().and_then(|r| r["bytes"].as_u64())) { (b) " bytes" }
                    }
                    td {
                        @if let Some(r) = &j.result {
                            (r["skills"]) " skills at " code { (short(r["commit"].as_str().unwrap_or(""))) }
                            @if r["warm"] == true { " (already warm)" }
                            @if let Some(p) = r["problems"].as_object().filter(|p| !p.is_empty()) {
                                br;
                                a.badge.problems href={ "/library?problems=on&toolkit=" (r["instanceId"].as_str().unwrap_or("")) } {
                                    (p.len()) " break the Agent Skills specification"
                                }
                            }
                        }
                        @if let Some(e) = &j.error {
                            span.error { strong { (e["code"].as_str().unwrap_or("")) } ": " (e["message"].as_str().unwrap_or("")) }
                        }
                    }
                    td { (j.actor) }
                    @if live { td { @if layout::operator(who) {
                        form.inline method="post" action={ "/imports/" (j.id) "/cancel" } {
                            (layout::csrf(who))
                            button type="submit" aria-label={ "Cancel " (j.id) } { "Cancel" }
                        }
                    } } }
                }
            } }
        }
    }
}

/// What a job's toolkit is called: its preset id, or its instance id and URL.
pub(crate) fn toolkit_name(t: &Value) -> String {
    match (
        t["id"].as_str(),
        t["instanceId"].as_str(),
        t["url"].as_str(),
    ) {
        (Some(id), _, _) => id.to_owned(),
        (_, Some(i), Some(u)) => format!("{i} ({u})"),
        (_, _, Some(u)) => u.to_owned(),
        _ => t.to_string(),
    }
}

//! `/sets`: the skill sets; `/sets/new` and `/sets/{id}`: a set's members as a form (each a
//! registry entry or a git URL and commit, with include/exclude and scope), a preview of what
//! the set would serve before it is saved, and its revisions with what changed in each.

pub(super) mod diff;
mod form;
pub(super) mod labels;
mod revisions;

use super::{blocking, check_csrf, layout, tiers};
use crate::api::Api;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cloud_harness_auth::Identity;
use cloud_harness_control::toolkit::Scope;
use cloud_harness_curation::sets::{self, Revision};
use cloud_harness_error::{Code, Error};
use cloud_harness_skills::spec::Validation;
use cloud_harness_workspace::preview::Preview;
use form::{Row, SetForm};
use maud::{html, Markup};
use revisions::{history, revision_item};
use std::sync::Arc;

/// Blank member rows under the filled ones (a form without script cannot add rows).
const BLANK_ROWS: usize = 2;

pub async fn list(State(api): State<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    let db = api.workspaces.db().clone();
    let all = match blocking(move || sets::list(&db)).await {
        Ok(s) => s,
        Err(e) => return layout::error(&who, &e),
    };
    layout::page(
        "Sets",
        "/sets",
        &who,
        html! {
            p { "A set names toolkits that open together: an agent asks for " code { "{\"kind\": \"set\", \"id\": …}" } " in workspace_open." }
            @if layout::operator(&who) { p { a.button href="/sets/new" { "New set" } } }
            @if all.is_empty() {
                p.empty { "No set yet. Make one with New set: pick toolkits from the registry or give a git URL and commit." }
            } @else {
                table { thead { tr { th { "Set" } th { "Description" } th { "Members" } th { "Revision" } th { "Last edit" } } }
                    tbody { @for s in &all { tr {
                        td { a href={ "/sets/" (s.id) } { (s.id) } }
                        td { (s.description) }
                        td { (s.members.len()) }
                        td { (s.revision) }
                        td { (s.actor) ", " (layout::when(s.created_at)) }
                    } } }
                }
            }
        },
    )
}

pub async fn new(State(api): State<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    render(&api, &who, SetForm::default(), None, None, None).await
}

#[derive(serde::Deserialize, Default)]
pub struct At {
    revision: Option<i64>,
}

pub async fn show(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    q: Result<Query<At>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let revision = q.map(|q| q.0.revision).unwrap_or_default();
    let db = api.workspaces.db().clone();
    let asked = id.clone();
    let found = blocking(move || {
        Ok((
            sets::get(&db, &asked, None)?,
            sets::get(&db, &asked, revision)?,
        ))
    })
    .await;
    let (current, shown) = match found {
        Ok(s) => s,
        Err(e) => return layout::error(&who, &e),
    };
    shown_page(&api, &who, current, &shown, None).await
}

/// The set's page at its latest revision, with what an action on it ran into.
pub(super) async fn with_error(api: &Arc<Api>, who: &Identity, id: &str, e: Error) -> Response {
    let (db, asked) = (api.workspaces.db().clone(), id.to_owned());
    match blocking(move || sets::get(&db, &asked, None)).await {
        Ok(current) => shown_page(api, who, current.clone(), &current, Some(e)).await,
        Err(_) => layout::error(who, &e),
    }
}

/// The set's page: `current` its latest revision, `shown` the one filling the form.
async fn shown_page(
    api: &Arc<Api>,
    who: &Identity,
    current: Revision,
    shown: &Revision,
    error: Option<Error>,
) -> Response {
    // An older revision fills the form: saving it makes a new revision with its members.
    let form = SetForm {
        id: current.id.clone(),
        description: shown.description.clone(),
        validation: shown.validation,
        revision: Some(current.revision),
        rows: shown.members.iter().map(Row::of).collect(),
        ..SetForm::default()
    };
    render(api, who, form, Some(current), None, error).await
}

/// `POST /sets/new`: preview, or make the set.
pub async fn create(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    save(api, who, None, fields).await
}

/// `POST /sets/{id}`: preview, or save a new revision.
pub async fn update(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    save(api, who, Some(id), fields).await
}

async fn save(
    api: Arc<Api>,
    who: Identity,
    editing: Option<String>,
    fields: Vec<(String, String)>,
) -> Response {
    let mut form = SetForm::parse(fields);
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    if let Some(id) = &editing {
        form.id = id.clone();
    }
    let (ws, actor) = (api.workspaces.clone(), who.actor());
    let members = form.members();
    let (set_id, description, revision, preview, validation) = (
        form.id.clone(),
        form.description.clone(),
        form.revision,
        form.preview,
        form.validation,
    );
    let is_edit = editing.is_some();
    let outcome = blocking(move || {
        let members = members?;
        if preview {
            if !is_edit {
                sets::check_id(&set_id)?;
            }
            let registry = cloud_harness_curation::registry::load(ws.db())?;
            let specs = sets::check_members(&members, ws.hosts(), &registry)?;
            return ws
                .preview(&specs, Some(&set_id), validation, &actor)
                .map(Some);
        }
        if is_edit {
            let revision = revision.ok_or_else(|| {
                Error::field(
                    Code::InvalidArgument,
                    "revision",
                    "the form lost its revision: reload the page",
                )
            })?;
            sets::edit(
                ws.db(),
                ws.hosts(),
                &set_id,
                revision,
                Some(&description),
                Some(&members),
                Some(validation),
                &actor,
            )?;
        } else {
            sets::create(
                ws.db(),
                ws.hosts(),
                &set_id,
                &description,
                &members,
                validation,
                &actor,
            )?;
        }
        Ok(None)
    })
    .await;
    let current = match &editing {
        Some(id) => {
            let (db, id) = (api.workspaces.db().clone(), id.clone());
            blocking(move || sets::get(&db, &id, None)).await.ok()
        }
        None => None,
    };
    match outcome {
        Ok(None) => Redirect::to(&format!("/sets/{}", form.id)).into_response(),
        Ok(Some(preview)) => render(&api, &who, form, current, Some(preview), None).await,
        Err(e) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            let mut r = render(&api, &who, form, current, None, Some(e)).await;
            *r.status_mut() = status;
            r
        }
    }
}

async fn render(
    api: &Arc<Api>,
    who: &Identity,
    form: SetForm,
    current: Option<Revision>,
    preview: Option<Preview>,
    error: Option<Error>,
) -> Response {
    let a = api.clone();
    let shown = current.as_ref().map(|c| c.id.clone());
    let data = blocking(move || {
        let registry = cloud_harness_curation::registry::load(a.workspaces.db())?;
        let ids: Vec<String> = registry.ids().into_iter().map(str::to_owned).collect();
        let (history, labels) = match &shown {
            Some(id) => {
                let target = cloud_harness_curation::labels::Target::Set(id.clone());
                let labels = cloud_harness_curation::labels::list(a.workspaces.db(), &target)?;
                (history(a.workspaces.db(), id)?, labels)
            }
            None => (Vec::new(), Vec::new()),
        };
        Ok((ids, history, labels))
    })
    .await;
    let (entries, history, labels) = match data {
        Ok(d) => d,
        Err(e) => return layout::error(who, &e),
    };
    let e = error.as_ref();
    let title = match &current {
        Some(c) => format!("Set {}", c.id),
        None => "New set".to_owned(),
    };
    let action = match &current {
        Some(c) => format!("/sets/{}", c.id),
        None => "/sets/new".to_owned(),
    };
    let rows = form.rows.len() + BLANK_ROWS;
    layout::page(
        &title,
        "/sets",
        who,
        html! {
            p { a href="/sets" { "All sets" } }
            @if let Some(c) = &current {
                p { "Revision " strong { (c.revision) } " by " (c.actor) ", " (layout::when(c.created_at)) "." }
            }
            @if let Some(e) = e { (layout::alert(e)) }
            @if layout::operator(who) {
                form.stack method="post" action=(action) aria-label="Set" {
                    (layout::csrf(who))
                    @if let Some(r) = form.revision { input type="hidden" name="revision" value=(r); }
                    @if current.is_none() {
                        label { "Set id (lowercase letters, digits, hyphens)" input type="text" name="id" required value=(form.id); }
                        (layout::field_error(e, "id"))
                    }
                    label { "Description" textarea name="description" rows="2" { (form.description) } }
                    (layout::field_error(e, "description"))
                    label {
                        "Skills that break the Agent Skills specification"
                        select name="validation" {
                            option value="warn" selected[form.validation == Validation::Warn] { "serve them, with their problems shown" }
                            option value="refuse" selected[form.validation == Validation::Refuse] { "do not serve them" }
                        }
                    }
                    fieldset {
                        legend { "Members" }
                        @if let Some(e) = e.filter(|e| e.details["field"] == "members") { span.field-error role="alert" { (e.message) } }
                        @for i in 0..rows {
                            @let row = form.rows.get(i).cloned().unwrap_or_default();
                            (member_row(i, &row, &entries, e))
                        }
                        p.hint { "Save or preview to get more empty rows; choose “unused” to remove a member." }
                    }
                    div.actions {
                        button type="submit" name="action" value="preview" { "Preview" }
                        button type="submit" name="action" value="save" { "Save" }
                    }
                }
            }
            @if let Some(p) = &preview { (preview_section(p)) }
            @if let Some(c) = &current {
                @if !layout::operator(who) { (members_table(c)) }
                (super::labels::section(who, &action, super::labels::Kind::Set, &shown_labels(&labels)))
                h2 { "Revisions" }
                ol.revisions reversed { @for (r, changes) in &history { li { (revision_item(who, &c.id, r, changes)) } } }
            }
        },
    )
}

fn member_row(i: usize, row: &Row, entries: &[String], e: Option<&Error>) -> Markup {
    let name = |f: &str| format!("m{i}.{f}");
    html! {
        div.member role="group" aria-label={ "Member " (i + 1) } {
            label { "Toolkit" select name=(name("toolkit")) {
                option value="" selected[row.toolkit.is_empty()] { "unused" }
                @for id in entries { option value=(id) selected[row.toolkit == *id] { "registry: " (id) } }
                option value="git" selected[row.toolkit == "git"] { "a git repository (below)" }
            } }
            label { "Git URL" input type="url" name=(name("url")) value=(row.url); }
            label { "Commit (registry: empty takes the pin)" input type="text" name=(name("ref")) value=(row.git_ref); }
            label { "Instance id (empty: the repository's name)" input type="text" name=(name("instanceId")) value=(row.instance_id); }
            label { "Include" input type="text" name=(name("include")) value=(row.include) placeholder="names or globs, comma-separated"; }
            label { "Exclude" input type="text" name=(name("exclude")) value=(row.exclude); }
            label { "Scope" select name=(name("scope")) {
                option value="owner" selected[row.scope != "workspace"] { "owner (read-only mount)" }
                option value="workspace" selected[row.scope == "workspace"] { "workspace (written into the tree)" }
            } }
            (layout::field_error(e, &format!("members[{i}]")))
        }
    }
}

fn members_table(c: &Revision) -> Markup {
    html! {
        table { thead { tr { th { "Member" } th { "Definition" } } }
            tbody { @for m in &c.members { tr {
                td { (Row::of(m).toolkit) }
                td { code { (serde_json::to_string(m).unwrap_or_default()) } }
            } } }
        }
    }
}

fn preview_section(p: &Preview) -> Markup {
    let conflicts: Vec<_> = p.index.conflicts().collect();
    html! {
        section.preview aria-labelledby="preview" {
            h2 id="preview" { "Preview" }
            p { "Not saved yet. A workspace of this set would get:" }
            table { thead { tr { th { "Toolkit" } th { "Scope" } th { "Commit" } th { "Skills" } th { "From" } } }
                tbody { @for t in &p.toolkits { tr {
                    td { (t.instance_id) br; small { (t.url) } }
                    td { (if t.scope == Scope::Workspace { "workspace" } else { "owner" }) }
                    td { code { (layout::short(&t.commit)) } }
                    td {
                        @match &t.signature {
                            Some(v) if !v.served() => { "none: not served (signature " (v.status.as_str()) ")" }
                            _ => { (t.skills) }
                        }
                    }
                    td { (if t.warm { "the store (warm)" } else { "fetched now" }) }
                } } }
            }
            @if conflicts.is_empty() {
                p role="status" { "No conflict: " (p.index.winners().count()) " skills would be served." }
            } @else {
                div.warn role="alert" {
                    p { strong { (conflicts.len()) " launch conflict(s)" } ": a workspace of this set would be refused until an operator settles them (the Conflicts page, once an open meets them)." }
                    ul { @for c in &conflicts { li { (c.name) ": " @for (i, k) in c.conflict.iter().enumerate() { @if i > 0 { ", " } (p.index.source(k).id) } } } }
                }
            }
            (tiers::drawing(&p.index, "What the set would serve"))
        }
    }
}

/// The set's labels as the page shows them.
fn shown_labels(labels: &[cloud_harness_curation::labels::Label]) -> Vec<super::labels::Shown<'_>> {
    labels
        .iter()
        .filter_map(|l| {
            Some(super::labels::Shown {
                name: &l.name,
                revision: l.revision,
                value: l.value.as_deref()?,
                canary: l.canary.as_ref(),
            })
        })
        .collect()
}

//! `/registry`: the entries presets resolve against, each with its pin; an entry's page
//! (`/registry/{owner}/{name}`) has its pin history, "check for updates", moving the pin and
//! rolling it back, and its version labels (`labels`); and a form adds an entry.

use super::labels::{rolled_back, Kind, LabelForm, RollbackForm, Shown};
use super::{blocking, check_csrf, layout};
use crate::api::Api;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cloud_harness_auth::Identity;
use cloud_harness_control::toolkit::Scope;
use cloud_harness_curation::labels;
use cloud_harness_curation::registry::{self, Entry, NewEntry, Pin};
use cloud_harness_error::{Code, Error};
use maud::{html, Markup};
use std::sync::Arc;

use super::layout::short;

#[derive(serde::Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AddForm {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    commit: String,
    #[serde(default)]
    default_scope: String,
    #[serde(default)]
    csrf: String,
}

#[derive(serde::Deserialize)]
pub(crate) struct PinForm {
    #[serde(default)]
    commit: String,
    #[serde(default)]
    reason: String,
    /// The pin the move replaces, as compared (the confirm form's).
    #[serde(default)]
    from: String,
    #[serde(default)]
    csrf: String,
}

#[derive(serde::Deserialize)]
pub(crate) struct Csrf {
    #[serde(default)]
    csrf: String,
}

pub async fn list(State(api): State<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    render_list(&api, &who, AddForm::default(), None).await
}

async fn render_list(
    api: &Arc<Api>,
    who: &Identity,
    form: AddForm,
    error: Option<Error>,
) -> Response {
    let db = api.workspaces.db().clone();
    let entries: Vec<Entry> =
        match blocking(move || Ok(registry::load(&db)?.entries().cloned().collect())).await {
            Ok(e) => e,
            Err(e) => return layout::error(who, &e),
        };
    let e = error.as_ref();
    let mut r = layout::page(
        "Registry",
        "/registry",
        who,
        html! {
            p { "Presets resolve here. A pinned entry opens at its pin, so a warm start needs no network; an unpinned one follows its default branch." }
            table { thead { tr { th { "Entry" } th { "Description" } th { "Repository" } th { "Pin" } th { "Origin" } } }
                tbody { @for en in &entries { tr {
                    td { a href={ "/registry/" (en.preset.id) } { (en.preset.id) } br; small { (en.preset.name) } }
                    td { (en.preset.description) }
                    td { small { (en.preset.url) } }
                    td { @match &en.pin {
                        Some(p) => { code { (short(&p.commit)) } br; small { (p.actor) ", " (layout::when(p.created_at)) } }
                        None => { em { "unpinned (default branch)" } }
                    } }
                    td { (en.origin) }
                } } }
            }
            @if layout::operator(who) {
                h2 id="add-entry" { "Add an entry" }
                @if let Some(e) = e { (layout::alert(e)) }
                form.stack method="post" action="/registry" aria-labelledby="add-entry" {
                    (layout::csrf(who))
                    label { "Id (owner/name)" input type="text" name="id" required value=(form.id); }
                    (layout::field_error(e, "id"))
                    label { "Name" input type="text" name="name" required value=(form.name); }
                    (layout::field_error(e, "name"))
                    label { "Description" input type="text" name="description" required value=(form.description); }
                    (layout::field_error(e, "description"))
                    label { "Repository URL (HTTPS, on the allowlist)" input type="url" name="url" required value=(form.url); }
                    (layout::field_error(e, "url"))
                    label { "Commit to pin" input type="text" name="commit" required value=(form.commit); }
                    (layout::field_error(e, "commit"))
                    label { "Default scope" select name="defaultScope" {
                        option value="owner" selected[form.default_scope != "workspace"] { "owner" }
                        option value="workspace" selected[form.default_scope == "workspace"] { "workspace" }
                    } }
                    button type="submit" { "Add entry" }
                }
            }
        },
    );
    if let Some(e) = e {
        *r.status_mut() = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    }
    r
}

pub async fn add(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Form(form): Form<AddForm>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (ws, actor, f) = (api.workspaces.clone(), who.actor(), form.clone());
    let made = blocking(move || {
        let new = NewEntry {
            id: f.id.trim().to_owned(),
            name: f.name.trim().to_owned(),
            description: f.description.trim().to_owned(),
            url: f.url.trim().to_owned(),
            layout: Default::default(),
            default_scope: if f.default_scope == "workspace" {
                Scope::Workspace
            } else {
                Scope::Owner
            },
            session_start_skill: None,
            commit: f.commit.trim().to_owned(),
            validation: Default::default(),
            allow_unreachable: false,
        };
        registry::add(ws.db(), ws.provisioner(), new, &actor)
    })
    .await;
    match made {
        Ok(e) => Redirect::to(&format!("/registry/{}", e.preset.id)).into_response(),
        Err(e) => render_list(&api, &who, form, Some(e)).await,
    }
}

pub async fn entry(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path((owner, name)): Path<(String, String)>,
) -> Response {
    render_entry(&api, &who, &format!("{owner}/{name}"), html! {}).await
}

async fn render_entry(api: &Arc<Api>, who: &Identity, id: &str, notice: Markup) -> Response {
    let (db, asked) = (api.workspaces.db().clone(), id.to_owned());
    let found = blocking(move || {
        let r = registry::load(&db)?;
        let entry = r.find(&asked).cloned().ok_or_else(|| {
            Error::field(Code::NotFound, "id", format!("no registry entry {asked:?}"))
        })?;
        Ok((entry, registry::history(&db, &asked)?))
    })
    .await;
    let (entry, pins): (Entry, Vec<Pin>) = match found {
        Ok(v) => v,
        Err(e) => return layout::error(who, &e),
    };
    let base = format!("/registry/{id}");
    layout::page(
        &entry.preset.id,
        "/registry",
        who,
        html! {
            p { a href="/registry" { "All entries" } }
            (notice)
            dl.facts {
                dt { "Name" } dd { (entry.preset.name) }
                dt { "Description" } dd { (entry.preset.description) }
                dt { "Repository" } dd { code { (entry.preset.url) } }
                dt { "Pin" } dd { @match &entry.pin {
                    Some(p) => { code { (p.commit) } }
                    None => { em { "unpinned: opens follow the default branch" } }
                } }
                dt { "Tested at" } dd { code { (entry.preset.tested_commit) } }
                dt { "Origin" } dd { (entry.origin) }
            }
            @if layout::operator(who) {
                div.columns {
                    section aria-labelledby="updates" {
                        h2 id="updates" { "Updates" }
                        form method="post" action={ (base) "/check" } {
                            (layout::csrf(who))
                            button type="submit" { "Check for updates" }
                        }
                        form method="post" action={ (base) "/rollback" } {
                            (layout::csrf(who))
                            button type="submit" disabled[pins.len() < 2] { "Roll back to the previous pin" }
                        }
                    }
                    section aria-labelledby="move-pin" {
                        h2 id="move-pin" { "Move the pin" }
                        form.stack method="post" action={ (base) "/pin" } aria-labelledby="move-pin" {
                            (layout::csrf(who))
                            label { "Commit" input type="text" name="commit" required; }
                            label { "Reason" input type="text" name="reason"; }
                            div.actions {
                                button type="submit" formaction={ (base) "/diff" } { "Compare first" }
                                button type="submit" { "Move pin" }
                            }
                        }
                    }
                }
            }
            (super::labels::section(who, &base, Kind::Entry, &shown_labels(&entry)))
            h2 { "Pin history" }
            @if pins.is_empty() { p.empty { "Never pinned." } }
            table { thead { tr { th { "Commit" } th { "By" } th { "Reason" } th { "From" } th { "Until" } } }
                tbody { @for p in &pins { tr {
                    td { code { (short(&p.commit)) } }
                    td { (p.actor) }
                    td { (p.reason.as_deref().unwrap_or("")) }
                    td { (layout::when(p.created_at)) }
                    td { @match p.superseded_at { Some(t) => { (layout::when(t)) } None => { strong { "in force" } } } }
                } } }
            }
        },
    )
}

/// An action on the entry `owner/name`: the form's CSRF token checked, `work` run with the
/// server's workspaces, the acting operator and the entry id, the entry's page shown again with
/// what came of it (`said`) or the error.
async fn act<T: Send + 'static>(
    api: Arc<Api>,
    who: Identity,
    (owner, name): (String, String),
    csrf: &str,
    work: impl FnOnce(&cloud_harness_workspace::Workspaces, &str, &str) -> cloud_harness_error::Result<T>
        + Send
        + 'static,
    said: impl FnOnce(T) -> Markup,
) -> Response {
    if let Err(e) = check_csrf(&who, csrf) {
        return layout::error(&who, &e);
    }
    let (ws, actor, id) = (
        api.workspaces.clone(),
        who.actor(),
        format!("{owner}/{name}"),
    );
    let asked = id.clone();
    let done = blocking(move || work(&ws, &asked, &actor)).await;
    let notice = match done {
        Ok(v) => said(v),
        Err(e) => layout::alert(&e),
    };
    render_entry(&api, &who, &id, notice).await
}

pub async fn check(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(entry): Path<(String, String)>,
    Form(form): Form<Csrf>,
) -> Response {
    let work = |ws: &cloud_harness_workspace::Workspaces, id: &str, actor: &str| {
        registry::check_updates(ws.db(), ws.provisioner(), id, actor)
    };
    let (me, base) = (who.clone(), format!("/registry/{}/{}", entry.0, entry.1));
    act(api, who, entry, &form.csrf, work, move |r| {
        let head = r["head"].as_str().unwrap_or_default().to_owned();
        html! {
            p role="status" {
                @if r["upToDate"] == true { "Up to date: the pin is the default branch head, " code { (short(&head)) } "." }
                @else { "The default branch head is " code { (head) } "; see what it changes before moving the pin to it." }
            }
            @if r["upToDate"] != true && r["pinned"].is_string() {
                form method="post" action={ (base) "/diff" } {
                    (layout::csrf(&me))
                    input type="hidden" name="commit" value=(head);
                    button type="submit" { "Compare the head with the pin" }
                }
            }
        }
    })
    .await
}

/// What moving the pin to the form's commit would change (both acquired first), shown
/// above the entry with the form that confirms the move.
pub async fn diff(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(entry): Path<(String, String)>,
    Form(form): Form<PinForm>,
) -> Response {
    let commit = form.commit.trim().to_owned();
    let work = move |ws: &cloud_harness_workspace::Workspaces, id: &str, actor: &str| {
        let (db, p) = (ws.db(), ws.provisioner());
        let diff = cloud_harness_curation::pin_diff::diff(db, p, id, None, &commit, actor)?;
        let serving = ws.serving_preset(id, &diff.from.commit);
        Ok((diff, serving))
    };
    let (me, base) = (who.clone(), format!("/registry/{}/{}", entry.0, entry.1));
    let reason = form.reason.trim().to_owned();
    act(api, who, entry, &form.csrf, work, move |(diff, serving)| {
        super::pin_diff::section(&me, &base, &diff, &serving, &reason)
    })
    .await
}

pub async fn pin(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(entry): Path<(String, String)>,
    Form(form): Form<PinForm>,
) -> Response {
    let (commit, reason) = (form.commit.trim().to_owned(), form.reason.trim().to_owned());
    let from = form.from.trim().to_owned();
    let work = move |ws: &cloud_harness_workspace::Workspaces, id: &str, actor: &str| {
        let reason = (!reason.is_empty()).then_some(reason.as_str());
        let from = (!from.is_empty()).then_some(from.as_str());
        registry::pin(ws.db(), ws.provisioner(), id, &commit, reason, from, actor)
    };
    act(api, who, entry, &form.csrf, work, |p| {
        html! { p role="status" { "Pinned at " code { (p.commit) } "." } }
    })
    .await
}

pub async fn rollback(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(entry): Path<(String, String)>,
    Form(form): Form<Csrf>,
) -> Response {
    let work = |ws: &cloud_harness_workspace::Workspaces, id: &str, actor: &str| {
        registry::rollback(ws.db(), ws.provisioner(), id, actor)
    };
    act(api, who, entry, &form.csrf, work, |p| {
        html! { p role="status" { "Rolled back: pinned at " code { (p.commit) } " again." } }
    })
    .await
}

/// The label form: the label moved to its commit, with a canary if one is given.
pub async fn move_label(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(entry): Path<(String, String)>,
    Form(form): Form<LabelForm>,
) -> Response {
    let mv = form.to_move(Kind::Entry);
    let label = form.label.trim().to_owned();
    let work = move |ws: &cloud_harness_workspace::Workspaces, id: &str, actor: &str| {
        let target = labels::Target::Entry(id.to_owned());
        labels::move_to(
            ws.db(),
            Some(ws.provisioner()),
            &target,
            &label,
            &mv?,
            actor,
        )
    };
    act(api, who, entry, &form.csrf, work, |l| {
        html! { p role="status" { "The label " code { (l.name) } " is at label revision " (l.revision) "." } }
    })
    .await
}

pub async fn rollback_label(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path((owner, name, label)): Path<(String, String, String)>,
    Form(form): Form<RollbackForm>,
) -> Response {
    let from = form.from();
    let work = move |ws: &cloud_harness_workspace::Workspaces, id: &str, actor: &str| {
        let target = labels::Target::Entry(id.to_owned());
        labels::rollback(
            ws.db(),
            Some(ws.provisioner()),
            &target,
            &label,
            from,
            actor,
        )
    };
    act(api, who, (owner, name), &form.csrf, work, |l| {
        rolled_back(&l)
    })
    .await
}

/// The entry's labels as the page shows them.
fn shown_labels(entry: &Entry) -> Vec<Shown<'_>> {
    entry
        .labels
        .iter()
        .map(|(name, p)| Shown {
            name,
            revision: p.revision,
            value: &p.value,
            canary: p.canary.as_ref(),
        })
        .collect()
}

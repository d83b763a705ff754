//! `/workspaces`: the open workspaces; `/workspaces/{id}`: one, with its toolkits, executor
//! and its resolution drawn as the four tiers side by side; a button closes it.

use super::{blocking, check_csrf, layout, tiers};
use crate::api::Api;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cloud_harness_auth::Identity;
use maud::{html, Markup};
use serde_json::{json, Value};
use std::sync::Arc;

use super::layout::short;

#[derive(serde::Deserialize)]
pub(crate) struct Csrf {
    #[serde(default)]
    csrf: String,
}

pub async fn list(State(api): State<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    let open: Vec<Value> = api
        .workspaces
        .open_workspaces()
        .iter()
        .map(|w| w.summary())
        .collect();
    let opening = api
        .workspaces
        .opening_of(&cloud_harness_control::principal::Principal::of(&who));
    layout::page(
        "Workspaces",
        "/workspaces",
        &who,
        html! {
            @if !opening.is_empty() {
                h2 { "Opening" }
                table { thead { tr { th { "Workspace" } th { "Key" } th { "Step" } th { "Progress" } th { "Fetched" } th { "Started" } } }
                    tbody { @for o in &opening {
                        tr data-opening=(o["workspace"].as_str().unwrap_or("")) {
                            td { code { (o["workspace"].as_str().unwrap_or("")) } }
                            td { (o["idempotencyKey"].as_str().unwrap_or("")) }
                            td data-field="step" { (o["step"].as_str().unwrap_or("")) }
                            td data-field="steps" { (o["done"]) " of " (o["total"]) " steps" }
                            td data-field="bytes" { (o["bytes"]) " bytes" }
                            td { (layout::when(o["startedAt"].as_i64().unwrap_or(0))) }
                        }
                    } }
                }
                h2 { "Open" }
            }
            @if open.is_empty() {
                p.empty { "No workspace is open. An agent opens one with the MCP tool workspace_open; it shows here with its tiers." }
            } @else {
                table { thead { tr { th { "Workspace" } th { "Key" } th { "Toolkits" } th { "Skills" } th { "Executor" } th { "Opened" } th { span.sr-only { "Actions" } } } }
                    tbody { @for w in &open {
                        @let id = w["workspace"].as_str().unwrap_or("");
                        tr {
                            td { a href={ "/workspaces/" (id) } { code { (id) } } }
                            td { (w["idempotencyKey"].as_str().unwrap_or("")) }
                            td { (toolkit_names(&w["toolkits"])) }
                            td { (w["skills"]) }
                            td { (w["executor"].as_str().unwrap_or("none")) }
                            td { (opened(&w["createdAt"])) }
                            td { (close_button(&who, id)) }
                        }
                    } }
                }
            }
        },
    )
}

/// A workspace's `createdAt` (seconds since the epoch).
fn opened(at: &Value) -> String {
    layout::when(at.as_i64().unwrap_or(0) * 1000)
}

fn toolkit_names(t: &Value) -> String {
    t.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["instanceId"].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

fn close_button(who: &Identity, id: &str) -> Markup {
    html! { @if layout::operator(who) {
        form.inline method="post" action={ "/workspaces/" (id) "/close" } {
            (layout::csrf(who))
            button.danger type="submit" aria-label={ "Close " (id) } { "Close" }
        }
    } }
}

pub async fn show(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    let ws = match api.workspaces.get(&id) {
        Ok(ws) => ws,
        Err(e) => return layout::error(&who, &e),
    };
    let record = ws.summary();
    let generation = ws.generation();
    let result = ws.result();
    let executor = &result["executor"];
    layout::page(
        &format!("Workspace {id}"),
        "/workspaces",
        &who,
        html! {
            p { a href="/workspaces" { "All workspaces" } }
            dl.facts {
                dt { "Key" } dd { (record["idempotencyKey"].as_str().unwrap_or("")) }
                dt { "Opened" } dd { (opened(&record["createdAt"])) }
                dt { "Generation" } dd { code { (generation.digest()) } }
                dt { "Executor" } dd { @if executor.is_null() { "none" } @else {
                    (executor["kind"].as_str().unwrap_or(""))
                    @if let Some(id) = executor["id"].as_str() { " " code { (short(id)) } }
                    ", network " (executor["network"].as_str().unwrap_or("")) ", working tree at " code { (executor["paths"]["workspace"].as_str().unwrap_or("")) }
                } }
                dt { "Skills mount" } dd { code { (result["skillsMount"].as_str().unwrap_or("not mounted")) } }
            }
            h2 { "Toolkits" }
            table { thead { tr { th { "Toolkit" } th { "Scope" } th { "Commit" } th { "Skills" } th { "Start" } } }
                tbody { @for t in result["toolkits"].as_array().into_iter().flatten() { tr {
                    td { (t["instanceId"].as_str().unwrap_or("")) br; small { (t["url"].as_str().unwrap_or("")) } }
                    td { (t["scope"].as_str().unwrap_or("")) }
                    td { code { (short(t["commit"].as_str().unwrap_or(""))) } }
                    td { (t["skillCount"]) }
                    td { (if t["warm"] == true { "warm" } else { "fetched" }) }
                } } }
            }
            h2 { "Tiers" }
            p.legend { span.copy.serves { "serves" } " " span.copy.override { "serves (override)" } " " span.copy.shadowed { "shadowed" } " " span.copy.conflict { "conflict" } }
            (tiers::drawing(&generation.index, "What this workspace serves"))
            (close_button(&who, &id))
        },
    )
}

pub async fn close(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    Form(form): Form<Csrf>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (ws, actor) = (api.workspaces.clone(), who.actor());
    let done = blocking(move || {
        let owner = ws.get(&id).map(|w| w.owner().to_owned()).ok();
        let closed = ws.close(&id)?;
        cloud_harness_control::audit::event(
            ws.db(),
            &actor,
            "workspace.close",
            &format!("workspace:{id}"),
            &json!({ "owner": owner }),
        )?;
        Ok(closed)
    })
    .await;
    match done {
        Ok(_) => Redirect::to("/workspaces").into_response(),
        Err(e) => layout::error(&who, &e),
    }
}

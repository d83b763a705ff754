//! `/tokens`: the tokens, a form to make one (its secret shown once), a button to revoke one.

use super::{blocking, check_csrf, layout};
use crate::api::Api;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::{Extension, Form};
use cloud_harness_auth::http::CSRF_FIELD;
use cloud_harness_auth::{self as auth, Identity, Role};
use maud::{html, Markup};
use std::sync::Arc;

#[derive(serde::Deserialize)]
pub struct NewToken {
    name: String,
    role: String,
    #[serde(default)]
    csrf: String,
}

#[derive(serde::Deserialize)]
pub struct Revoke {
    #[serde(default)]
    csrf: String,
}

async fn render(api: &Arc<Api>, who: &Identity, notice: Markup) -> Response {
    let db = api.workspaces.db().clone();
    let tokens = match blocking(move || auth::list(&db, true)).await {
        Ok(t) => t,
        Err(e) => return layout::error(who, &e),
    };
    let usage = crate::usage::all(&api.workspaces);
    let limits = cloud_harness_control::limits::quotas().limits;
    let csrf = who.csrf.clone().unwrap_or_default();
    layout::page(
        "Tokens",
        "/tokens",
        who,
        html! {
            (notice)
            h2 { "Make a token" }
            form.filters method="post" action="/tokens" {
                input type="hidden" name=(CSRF_FIELD) value=(csrf);
                label { "Name" input type="text" name="name" required pattern="[A-Za-z0-9._\\-]{1,64}"; }
                label { "Role" select name="role" {
                    option value="client" { "client (MCP tools, reads)" }
                    option value="operator" { "operator (everything)" }
                } }
                button type="submit" { "Make token" }
            }
            h2 { "Tokens" }
            @if tokens.is_empty() { p.empty { "No token yet." } }
            table { thead { tr { th { "Name" } th { "Role" } th { "Made by" } th { "State" } th { span.sr-only { "Actions" } } } }
                tbody { @for t in &tokens { tr {
                    td { (t.name) }
                    td { (t.role.as_str()) }
                    td { (t.created_by) }
                    td { @if t.revoked_at.is_some() { "revoked" } @else { "active" } }
                    td { @if t.revoked_at.is_none() {
                        form.inline method="post" action={ "/tokens/" (t.name) "/revoke" } {
                            input type="hidden" name=(CSRF_FIELD) value=(csrf);
                            button type="submit" aria-label={ "Revoke " (t.name) } { "Revoke" }
                        }
                    } }
                } } }
            }
            h2 #usage { "Usage against limits" }
            p { "What each principal holds now (hourly budgets: what the last hour took), against its limit ("
                code { "[limits]" } " in the configuration)." }
            @if usage.is_empty() { p.empty { "Nobody has used anything yet." } }
            @else {
                // Focusable: on a narrow screen it scrolls, and a keyboard must reach it.
                table aria-label="Usage against limits" tabindex="0" {
                    thead { tr { th scope="col" { "Principal" } @for (limit, _) in &usage[0].1 { th scope="col" { (limit) } } } }
                    tbody { @for (principal, used) in &usage { tr {
                        th scope="row" { (principal) }
                        @for (limit, n) in used {
                            td { (n) " / " (limits.get(limit)) }
                        }
                    } } }
                }
            }
        },
    )
}

pub async fn list(State(api): State<Arc<Api>>, Extension(who): Extension<Identity>) -> Response {
    render(&api, &who, html! {}).await
}

pub async fn create(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Form(form): Form<NewToken>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (db, actor) = (api.workspaces.db().clone(), who.actor());
    let made =
        blocking(move || auth::create(&db, &form.name, Role::parse(&form.role)?, &actor)).await;
    let notice = match made {
        Ok(t) => html! {
            section.secret role="status" {
                p { "Token " strong { (t.info.name) } " made. Copy its secret now: it is not shown again." }
                pre { code { (t.token) } }
            }
        },
        Err(e) => html! { p role="alert" { strong { (e.code.as_str()) } ": " (e.message) } },
    };
    render(&api, &who, notice).await
}

pub async fn revoke(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(name): Path<String>,
    Form(form): Form<Revoke>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (db, actor) = (api.workspaces.db().clone(), who.actor());
    let done = blocking(move || auth::revoke(&db, &name, &actor)).await;
    let notice = match done {
        Ok(t) => html! { p role="status" { "Token " strong { (t.name) } " revoked." } },
        Err(e) => html! { p role="alert" { strong { (e.code.as_str()) } ": " (e.message) } },
    };
    render(&api, &who, notice).await
}

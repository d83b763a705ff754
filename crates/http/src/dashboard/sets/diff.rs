//! `POST /sets/{id}/diff`: what a revision of a set serves that the one before it does not,
//! each revision previewed as a workspace of it would open (its members acquired).

use crate::api::Api;
use crate::dashboard::{blocking, check_csrf, layout, pin_diff};
use axum::extract::{Path, State};
use axum::response::Response;
use axum::{Extension, Form};
use cloud_harness_auth::Identity;
use maud::html;
use std::sync::Arc;

#[derive(serde::Deserialize)]
pub struct Asked {
    #[serde(default)]
    from: Option<i64>,
    #[serde(default)]
    to: Option<i64>,
    #[serde(default)]
    csrf: String,
}

pub async fn page(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    Form(asked): Form<Asked>,
) -> Response {
    if let Err(e) = check_csrf(&who, &asked.csrf) {
        return layout::error(&who, &e);
    }
    let (a, actor, set) = (api.clone(), who.actor(), id.clone());
    let found = blocking(move || a.workspaces.set_diff(&set, asked.from, asked.to, &actor)).await;
    let d = match found {
        Ok(d) => d,
        Err(e) => return layout::error(&who, &e),
    };
    let from_to = html! { "Revision " (d.from) " to revision " (d.to) ": " };
    let old = format!("revision {} of the set", d.from);
    layout::page(
        &format!("Set {}: revision {} to {}", d.id, d.from, d.to),
        "/sets",
        &who,
        html! {
            p { a href={ "/sets/" (d.id) } { "Back to the set" } }
            section aria-labelledby="diff" {
                h2 id="diff" { "What a workspace of revision " (d.to) " serves differently" }
                @if !d.conflicts_after.is_empty() {
                    p.warn { "Revision " (d.to) " has launch conflicts, refused at open until settled: "
                        @for (i, n) in d.conflicts_after.iter().enumerate() { @if i > 0 { ", " } code { (n) } } "." }
                }
                (pin_diff::changes(from_to, &d.changes, &d.serving_from, &old))
            }
        },
    )
}

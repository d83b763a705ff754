//! `/audit`: the audit log, newest first, filtered by actor, action and subject.

use super::{blocking, layout};
use crate::api::Api;
use axum::extract::{Query, State};
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::{Identity, Role};
use cloud_harness_control::audit::Filter;
use cloud_harness_error::{Code, Error};
use maud::html;
use std::sync::Arc;

#[derive(serde::Deserialize, Default)]
pub(crate) struct Filters {
    #[serde(default)]
    actor: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    subject: String,
}

pub async fn page(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    q: Result<Query<Filters>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if who.role < Role::Operator {
        return layout::error(
            &who,
            &Error::new(Code::Forbidden, "the audit log is for operators"),
        );
    }
    let f = q.map(|q| q.0).unwrap_or_default();
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let filter = Filter {
        actor: some(&f.actor),
        action: some(&f.action),
        subject: some(&f.subject),
    };
    let db = api.workspaces.db().clone();
    let entries =
        match blocking(move || cloud_harness_control::audit::list(&db, &filter, None, 200)).await {
            Ok((e, _)) => e,
            Err(e) => return layout::error(&who, &e),
        };
    layout::page(
        "Audit",
        "/audit",
        &who,
        html! {
            form.filters method="get" action="/audit" {
                label { "Actor" input type="text" name="actor" value=(f.actor); }
                label { "Action" input type="text" name="action" value=(f.action); }
                label { "Subject" input type="text" name="subject" value=(f.subject); }
                button type="submit" { "Filter" }
            }
            @if entries.is_empty() { p.empty { "Nothing recorded matches." } }
            table { thead { tr { th { "When (UTC ms)" } th { "Actor" } th { "Action" } th { "Subject" } th { "Details" } } }
                tbody { @for e in &entries { tr {
                    td { (e.at) }
                    td { (e.actor) }
                    td { (e.action) }
                    td { (e.subject) }
                    td { code { (e.details.to_string()) } }
                } } }
            }
        },
    )
}

//! A set's version labels, moved and rolled back from its page (`POST /sets/{id}/labels`,
//! `POST /sets/{id}/labels/{label}/rollback`): the page again (or what came of a rollback),
//! an error said on the set's page.

use crate::api::Api;
use crate::dashboard::labels::{rolled_back, Kind, LabelForm, RollbackForm};
use crate::dashboard::{blocking, check_csrf, layout};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cloud_harness_auth::Identity;
use cloud_harness_curation::labels::{self, Target};
use maud::html;
use std::sync::Arc;

pub async fn move_label(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    Form(form): Form<LabelForm>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (db, actor, label) = (
        api.workspaces.db().clone(),
        who.actor(),
        form.label.trim().to_owned(),
    );
    let mv = form.to_move(Kind::Set);
    let target = Target::Set(id.clone());
    match blocking(move || labels::move_to(&db, None, &target, &label, &mv?, &actor)).await {
        Ok(_) => Redirect::to(&format!("/sets/{id}#labels")).into_response(),
        Err(e) => super::with_error(&api, &who, &id, e).await,
    }
}

pub async fn rollback_label(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path((id, label)): Path<(String, String)>,
    Form(form): Form<RollbackForm>,
) -> Response {
    if let Err(e) = check_csrf(&who, &form.csrf) {
        return layout::error(&who, &e);
    }
    let (db, actor, from) = (api.workspaces.db().clone(), who.actor(), form.from());
    let target = Target::Set(id.clone());
    match blocking(move || labels::rollback(&db, None, &target, &label, from, &actor)).await {
        Ok(l) => layout::page(
            &format!("Set {id}: label {}", l.name),
            "/sets",
            &who,
            html! {
                (rolled_back(&l))
                p { a href={ "/sets/" (id) "#labels" } { "Back to the set" } }
            },
        ),
        Err(e) => super::with_error(&api, &who, &id, e).await,
    }
}

//! `/library` (every skill, searched, filtered, paged) and `/skills/{digest}` (one skill:
//! its SKILL.md rendered, its front matter, files, provenance and where it is used).

use super::{blocking, layout, markdown};
use crate::api::Api;
use crate::auth::Identity;
use crate::library::Search;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::Extension;
use cloud_harness_fs::cas::Digest;
use cloud_harness_fs::{Code, Error};
use maud::html;
use std::sync::Arc;

const PAGE: usize = 50;

#[derive(serde::Deserialize, Default)]
pub struct Filters {
    #[serde(default)]
    q: String,
    #[serde(default)]
    tier: String,
    #[serde(default)]
    toolkit: String,
    #[serde(default)]
    warnings: Option<String>,
    #[serde(default)]
    page: usize,
}

pub async fn list(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    q: Result<Query<Filters>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let f = q.map(|q| q.0).unwrap_or_default();
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let search = Search {
        text: some(&f.q),
        tier: some(&f.tier),
        toolkit: some(&f.toolkit),
        warnings: f.warnings.is_some(),
        offset: f.page * PAGE,
        limit: PAGE,
    };
    let a = api.clone();
    let found = blocking(move || a.library.search(a.workspaces.store(), &search)).await;
    let (skills, total) = match found {
        Ok(v) => v,
        Err(e) => return layout::error(&who, &e),
    };
    let link = |page: usize| {
        format!(
            "/library?q={}&tier={}&toolkit={}{}&page={page}",
            urlencode(&f.q),
            urlencode(&f.tier),
            urlencode(&f.toolkit),
            if f.warnings.is_some() {
                "&warnings=on"
            } else {
                ""
            }
        )
    };
    layout::page(
        "Library",
        "/library",
        &who,
        html! {
            form.search method="get" action="/library" role="search" {
                label { "Search" input type="search" name="q" value=(f.q) placeholder="name, description or toolkit"; }
                label { "Tier" select name="tier" {
                    option value="" selected[f.tier.is_empty()] { "any" }
                    option value="builtin" selected[f.tier == "builtin"] { "built-in" }
                    option value="store" selected[f.tier == "store"] { "toolkits" }
                } }
                label { "Toolkit" input type="text" name="toolkit" value=(f.toolkit); }
                label { "With warnings" input type="checkbox" name="warnings" checked[f.warnings.is_some()]; }
                button type="submit" { "Search" }
            }
            p { (total) " skills" @if total > 0 { ", showing " (f.page * PAGE + 1) "–" (f.page * PAGE + skills.len()) } }
            @if skills.is_empty() {
                p.empty { "No skill matches. Try fewer words, or import a toolkit." }
            } @else {
                table { thead { tr { th { "Skill" } th { "Description" } th { "Toolkit" } th { "Tier" } th { "Warnings" } } }
                    tbody { @for s in &skills { tr {
                        td { a href={ "/skills/" (s.digest) } { (s.name) } }
                        td { (s.description) }
                        td { (s.toolkit) }
                        td { (s.tier) }
                        td { @if !s.warnings.is_empty() { span.warn { (s.warnings.len()) } } }
                    } } }
                }
            }
            nav aria-label="Pages" {
                @if f.page > 0 { a href=(link(f.page - 1)) rel="prev" { "Previous" } " " }
                @if (f.page + 1) * PAGE < total { a href=(link(f.page + 1)) rel="next" { "Next" } }
            }
        },
    )
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub async fn skill(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(digest): Path<String>,
) -> Response {
    let a = api.clone();
    let found = blocking(move || {
        let digest = Digest::parse(&digest)
            .map_err(|_| Error::field(Code::InvalidArgument, "digest", "not a skill digest"))?;
        let ws = &a.workspaces;
        let copies: Vec<crate::library::Skill> = a
            .library
            .all(ws.store())?
            .iter()
            .flat_map(|b| {
                b.iter()
                    .filter(|s| s.digest == digest)
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        let first = copies
            .first()
            .cloned()
            .ok_or_else(|| Error::not_found(format!("no skill {digest} in the library")))?;
        let files = crate::library::files(ws.store(), &digest)?;
        let skill_md = files
            .iter()
            .find(|f| f["path"] == "SKILL.md")
            .and_then(|f| f["digest"].as_str().and_then(|d| Digest::parse(d).ok()))
            .map(|d| ws.store().blob_up_to(&d, 1 << 20))
            .transpose()?
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let registry = crate::registry::load(ws.db())?;
        let sets = crate::sets::list(ws.db())?;
        let used = crate::library::used_by(ws, &registry, &sets, &copies);
        Ok((first, copies, files, skill_md, used))
    })
    .await;
    let (s, copies, files, skill_md, used) = match found {
        Ok(v) => v,
        Err(e) => return layout::error(&who, &e),
    };
    let (front, body) = markdown::split_front_matter(&skill_md);
    let rendered = markdown::render(body);
    layout::page(
        &s.name,
        "/library",
        &who,
        html! {
            p { (s.description) }
            @if !s.warnings.is_empty() {
                section aria-label="Warnings" { @for w in &s.warnings { p.warn role="note" { (w) } } }
            }
            h2 { "SKILL.md" }
            @if let Some(fm) = front { h3 { "Front matter" } pre { (fm) } }
            div.rendered { (maud::PreEscaped(rendered)) }
            h2 { "Files" }
            table { thead { tr { th { "Path" } th { "Size" } th { "Digest" } } }
                tbody { @for f in &files { tr {
                    td { code { (f["path"].as_str().unwrap_or("")) } }
                    td { (f["size"]) }
                    td { code { (f["digest"].as_str().unwrap_or("")) } }
                } } }
            }
            h2 { "Provenance and use" }
            table { thead { tr { th { "Toolkit" } th { "URL" } th { "Commit" } th { "Used by" } } }
                tbody { @for (c, u) in copies.iter().zip(&used) { tr {
                    td { (c.toolkit) " (" (c.tier) ")" }
                    td { (c.url.as_deref().unwrap_or("built in")) }
                    td { code { (c.commit.as_deref().unwrap_or("")) } }
                    td {
                        (u["workspaces"].as_array().map_or(0, |a| a.len())) " workspaces, "
                        (u["sets"].as_array().map_or(0, |a| a.len())) " sets, "
                        (u["registry"].as_array().map_or(0, |a| a.len())) " registry entries"
                    }
                } } }
            }
            p { "Digest " code { (s.digest) } }
        },
    )
}

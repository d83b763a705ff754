//! `/skills/{digest}`: one skill — its SKILL.md rendered (sanitized), its front matter, its
//! files (text shown, binary offered for download), provenance, where it is used, and every
//! other copy of the same name with which copy each open workspace serves.
//! `/skills/{digest}/files/{*path}`: one file's bytes, never as a page of this origin.

use super::{blocking, layout, markdown};
use crate::api::Api;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cloud_harness_auth::Identity;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Store};
use cloud_harness_workspace::library::Skill;
use maud::html;
use serde_json::Value;
use std::sync::Arc;

/// Files up to this size are shown on the page when they are text.
const SHOWN: u64 = 64 << 10;
/// The most a download serves (the store's own limits are lower still).
const MAX_DOWNLOAD: u64 = 64 << 20;

/// A file of the skill as the page shows it.
struct File {
    path: String,
    size: u64,
    digest: String,
    /// Its text, when it is small text.
    text: Option<String>,
}

/// Where an open workspace resolves the skill's name: the copy it serves (its digest and
/// source), and whether this copy is among those it shadows.
struct Winner {
    workspace: String,
    served: Option<(Digest, String)>,
    this_shadowed: bool,
}

fn text_of(bytes: Vec<u8>) -> Option<String> {
    if bytes.contains(&0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

fn files(store: &Store, digest: &Digest) -> Result<Vec<File>> {
    cloud_harness_workspace::library::files(store, digest)?
        .iter()
        .map(|f| {
            let size = f["size"].as_u64().unwrap_or(0);
            let digest = f["digest"].as_str().unwrap_or_default().to_owned();
            let text = match Digest::parse(&digest) {
                Ok(d) if size <= SHOWN => text_of(store.blob_up_to(&d, SHOWN)?),
                _ => None,
            };
            Ok(File {
                path: f["path"].as_str().unwrap_or_default().to_owned(),
                size,
                digest,
                text,
            })
        })
        .collect()
}

pub async fn page(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path(digest): Path<String>,
) -> Response {
    let a = api.clone();
    let viewer = cloud_harness_control::principal::Principal::of(&who);
    let found = blocking(move || {
        let digest = Digest::parse(&digest)
            .map_err(|_| Error::field(Code::InvalidArgument, "digest", "not a skill digest"))?;
        let ws = &a.workspaces;
        let bundles = a.library.all(ws.store())?;
        let skills = || bundles.iter().flat_map(|b| b.iter());
        let copies: Vec<Skill> = skills().filter(|s| s.digest == digest).cloned().collect();
        let first = copies
            .first()
            .cloned()
            .ok_or_else(|| Error::not_found(format!("no skill {digest} in the library")))?;
        let others: Vec<Skill> = skills()
            .filter(|s| s.name == first.name && s.digest != digest)
            .cloned()
            .collect();
        let files = files(ws.store(), &digest)?;
        // Read once: `files` holds it already unless it is large or not UTF-8.
        let skill_md = match files.iter().find(|f| f.path == "SKILL.md") {
            Some(File { text: Some(t), .. }) => t.clone(),
            Some(f) => match Digest::parse(&f.digest) {
                Ok(d) => String::from_utf8_lossy(&ws.store().blob_up_to(&d, 1 << 20)?).into_owned(),
                Err(_) => String::new(),
            },
            None => String::new(),
        };
        let registry = cloud_harness_curation::registry::load(ws.db())?;
        let sets = cloud_harness_curation::sets::list(ws.db())?;
        let used =
            cloud_harness_workspace::library::used_by(ws, &viewer, &registry, &sets, &copies);
        let winners: Vec<Winner> = ws
            .open_workspaces_of(&viewer)
            .iter()
            .filter_map(|w| {
                let g = w.generation();
                let r = g.index.lookup(&first.name)?;
                Some(Winner {
                    workspace: w.id.clone(),
                    served: r
                        .winner
                        .as_ref()
                        .map(|c| (c.digest(), g.index.source(c).id.clone())),
                    this_shadowed: r
                        .shadowed
                        .iter()
                        .chain(&r.conflict)
                        .any(|c| c.digest() == digest),
                })
            })
            .collect();
        Ok((first, copies, others, files, skill_md, used, winners))
    })
    .await;
    let (s, copies, others, files, skill_md, used, winners) = match found {
        Ok(v) => v,
        Err(e) => return layout::error(&who, &e),
    };
    let (front, body) = markdown::split_front_matter(&skill_md);
    let rendered = markdown::render(body);
    let file_url = |path: &str| {
        let parts: Vec<String> = path
            .split('/')
            .map(|p| form_urlencoded::byte_serialize(p.as_bytes()).collect())
            .collect();
        format!("/skills/{}/files/{}", s.digest, parts.join("/"))
    };
    layout::page(
        &s.name,
        "/library",
        &who,
        html! {
            p { (s.description) }
            section aria-labelledby="spec" {
                h2 id="spec" { "Agent Skills specification " (super::library::spec_badge(&s.problems)) }
                @if s.problems.is_empty() {
                    p { "This skill follows the specification." }
                } @else {
                    ul { @for p in &s.problems { li { code { (p.rule) } " " (p.message) } } }
                }
            }
            @if !s.warnings.is_empty() {
                section aria-label="Warnings" { @for w in &s.warnings { p.warn role="note" { (w) } } }
            }
            h2 { "SKILL.md" }
            @if let Some(fm) = front { h3 { "Front matter" } pre { (fm) } }
            div.rendered { (maud::PreEscaped(rendered)) }
            h2 { "Files" }
            table { thead { tr { th { "Path" } th { "Size" } th { "Digest" } } }
                tbody { @for f in &files { tr {
                    td {
                        @match &f.text {
                            Some(text) => details { summary { code { (f.path) } } pre aria-label={ "File " (f.path) } { (text) } }
                            None => { code { (f.path) } " " a href=(file_url(&f.path)) download { "download" } }
                        }
                    }
                    td { (f.size) }
                    td { code { (super::layout::short(f.digest.trim_start_matches("sha256:"))) } }
                } } }
            }
            h2 { "Provenance and use" }
            table { thead { tr { th { "Toolkit" } th { "URL" } th { "Commit" } th { "Used by" } } }
                tbody { @for (c, u) in copies.iter().zip(&used) { tr {
                    td { (c.toolkit) " (" (c.tier) ")" }
                    td { (c.url.as_deref().unwrap_or("built in")) }
                    td { code { (c.commit.as_deref().unwrap_or("")) } }
                    td {
                        (u["workspaces"].as_array().map_or(0, Vec::len)) " workspaces, "
                        (u["sets"].as_array().map_or(0, Vec::len)) " sets, "
                        (u["registry"].as_array().map_or(0, Vec::len)) " registry entries"
                    }
                } } }
            }
            h2 { "Other copies of " (s.name) }
            @if others.is_empty() { p.empty { "No other toolkit in the store defines " (s.name) "." } }
            @else {
                table { thead { tr { th { "Toolkit" } th { "Commit" } th { "Copy" } } }
                    tbody { @for o in &others { tr {
                        td { (o.toolkit) " (" (o.tier) ")" }
                        td { code { (o.commit.as_deref().map(super::layout::short).unwrap_or("")) } }
                        td { a href={ "/skills/" (o.digest) } { code { (super::layout::short(&o.digest.hex())) } } }
                    } } }
                }
            }
            @if !winners.is_empty() {
                h3 { "Which copy each open workspace serves" }
                table { thead { tr { th { "Workspace" } th { "Serves" } th { "This copy" } } }
                    tbody { @for w in &winners { tr {
                        td { a href={ "/workspaces/" (w.workspace) } { code { (w.workspace) } } }
                        td { @match &w.served {
                            Some((d, source)) => { (source) " " a href={ "/skills/" (d) } { code { (super::layout::short(&d.hex())) } } }
                            None => { span.error { "a conflict, unsettled" } }
                        } }
                        td { @match &w.served {
                            Some((d, _)) if *d == s.digest => { strong { "served" } }
                            _ if w.this_shadowed => { "shadowed" }
                            _ => { "not in it" }
                        } }
                    } } }
                }
            }
            p { "Digest " code { (s.digest) } }
        },
    )
}

/// One file of the skill: bytes as they are, sent so no browser runs them here — text as
/// plain text, anything else as a download, in a sandbox either way.
pub async fn file(
    State(api): State<Arc<Api>>,
    Extension(who): Extension<Identity>,
    Path((digest, path)): Path<(String, String)>,
) -> Response {
    let a = api.clone();
    let found = blocking(move || {
        let digest = Digest::parse(&digest)
            .map_err(|_| Error::field(Code::InvalidArgument, "digest", "not a skill digest"))?;
        let store = a.workspaces.store();
        // Only a skill the library knows (not any tree of the store) is served.
        if !a
            .library
            .all(store)?
            .iter()
            .any(|b| b.iter().any(|s| s.digest == digest))
        {
            return Err(Error::not_found(format!(
                "no skill {digest} in the library"
            )));
        }
        let all = cloud_harness_workspace::library::files(store, &digest)?;
        let f: &Value = all
            .iter()
            .find(|f| f["path"] == path.as_str())
            .ok_or_else(|| {
                Error::not_found(format!(
                    "the skill has no file {:?}",
                    cloud_harness_control::input::shown(&path)
                ))
            })?;
        let d = Digest::parse(f["digest"].as_str().unwrap_or_default())
            .map_err(|_| Error::not_found("no such file"))?;
        let bytes = store.blob_up_to(&d, MAX_DOWNLOAD)?;
        let name = path.rsplit('/').next().unwrap_or("file").to_owned();
        Ok((bytes, name))
    })
    .await;
    let (bytes, name) = match found {
        Ok(v) => v,
        Err(e) => return layout::error(&who, &e),
    };
    let text = !bytes.contains(&0) && std::str::from_utf8(&bytes).is_ok();
    let safe_name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut r = (StatusCode::OK, bytes).into_response();
    let h = r.headers_mut();
    let kind = if text {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    };
    h.insert(header::CONTENT_TYPE, kind.parse().expect("a header"));
    let disposition = if text {
        "inline".to_owned()
    } else {
        format!("attachment; filename=\"{safe_name}\"")
    };
    if let Ok(v) = disposition.parse() {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        "content-security-policy",
        "sandbox; default-src 'none'".parse().expect("a header"),
    );
    h.insert(
        "x-content-type-options",
        "nosniff".parse().expect("a header"),
    );
    r
}

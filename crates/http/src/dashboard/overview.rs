//! `/`: open workspaces, pending approvals and launch conflicts, recent imports, the store,
//! how fetches and executors run; or, signed out, how to sign in.

use super::{blocking, layout};
use crate::api::Api;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use cloud_harness_auth::Identity;
use maud::html;
use std::sync::Arc;

pub async fn page(State(api): State<Arc<Api>>, who: Option<Extension<Identity>>) -> Response {
    let Some(Extension(who)) = who else {
        return layout::respond(
            axum::http::StatusCode::OK,
            html! {
                (maud::DOCTYPE)
                html lang="en" {
                    head { meta charset="utf-8"; title { "Sign in · Cloud Harness" } link rel="stylesheet" href="/assets/app.css"; }
                    body { main {
                        h1 { "Cloud Harness" }
                        p { "Not signed in. Open the login link " code { "cloud-harness serve --http" } " left in " code { "<home>/operator-token" } " at its first start, or make one with " code { "cloud-harness token login-url" } "." }
                    } }
                }
            },
        );
    };
    let a = api.clone();
    let data = blocking(move || {
        let ws = &a.workspaces;
        let open: Vec<serde_json::Value> =
            ws.open_workspaces().iter().map(|w| w.summary()).collect();
        let pending = cloud_harness_curation::decisions::pending(ws.db(), ws.home())?;
        let conflicts = cloud_harness_curation::conflicts::list(ws.db(), false)?;
        let imports = a.imports.list(5)?;
        let bundles = cloud_harness_provision::index::BundleIndex::open(ws.store())
            .list()?
            .len();
        Ok((
            open,
            pending,
            conflicts,
            imports,
            (bundles, store_bytes(ws.store().root())),
            ws.provisioning(),
        ))
    })
    .await;
    let executor = api.workspaces.executor_kind();
    let (open, pending, conflicts, imports, (bundles, bytes), provisioning) = match data {
        Ok(d) => d,
        Err(e) => return layout::error(&who, &e),
    };
    layout::page(
        "Overview",
        "/",
        &who,
        html! {
            section.cards aria-label="At a glance" {
                a.card href="/workspaces" { div.n { (open.len()) } "open workspaces" }
                a.card href="/approvals" { div.n { (pending.len()) } "runs waiting for approval" }
                a.card href="/conflicts" { div.n { (conflicts.len()) } "launch conflicts to settle" }
                a.card href="/library" { div.n { (bundles) } "toolkit bundles in the store, " (mib(bytes)) }
            }
            h2 { "Open workspaces" }
            @if open.is_empty() {
                p.empty { "No workspace is open. An agent opens one with the MCP tool workspace_open." }
            } @else {
                table { thead { tr { th { "Workspace" } th { "Key" } th { "Skills" } th { "Conflicts" } th { "Executor" } } }
                    tbody { @for w in &open { tr {
                        td { a href={ "/workspaces/" (w["workspace"].as_str().unwrap_or("")) } { code { (w["workspace"].as_str().unwrap_or("")) } } }
                        td { (w["idempotencyKey"].as_str().unwrap_or("")) }
                        td { (w["skills"]) }
                        td { (w["conflicts"]) }
                        td { (w["executor"].as_str().unwrap_or("none")) }
                    } } }
                }
            }
            h2 { "Recent imports" }
            @if imports.is_empty() {
                p.empty { "No import yet." }
            } @else {
                table { thead { tr { th { "Job" } th { "Toolkit" } th { "State" } } }
                    tbody { @for j in &imports { tr {
                        td { code { (j.id) } }
                        td { (j.toolkit["instanceId"].as_str().or(j.toolkit["id"].as_str()).unwrap_or("")) }
                        td { (j.state) @if let Some(p) = &j.phase { " (" (p) ")" } }
                    } } }
                }
            }
            h2 { "Provisioning and executors" }
            p { "Fetches run: " strong { (provisioning["mode"].as_str().unwrap_or("")) }
                @if provisioning["mode"] == "container" { " (a helper container per fetch, on an internal network behind the egress proxy)" }
                @else { " (in this process, through the egress proxy)" } }
            p { "Skill scripts run in: " strong { @match executor {
                Some(k) => { (serde_json::to_value(k).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()) " executors" }
                None => { "nowhere: no executor is configured, so skills_run refuses" }
            } } }
            @if let Some(warnings) = provisioning["warnings"].as_array() {
                @for w in warnings { p.warn role="note" { (w.as_str().unwrap_or("")) } }
            }
        },
    )
}

/// The store's size, walked at most every [`SIZE_TTL`] (a walk of a large store takes tens
/// of milliseconds; the figure is a gauge, not an account).
fn store_bytes(root: &std::path::Path) -> u64 {
    static KEPT: std::sync::Mutex<Option<(std::path::PathBuf, std::time::Instant, u64)>> =
        std::sync::Mutex::new(None);
    let mut kept = KEPT.lock().expect("size lock");
    match &*kept {
        Some((r, at, n)) if r == root && at.elapsed() < SIZE_TTL => *n,
        _ => {
            let n = bytes_under(root);
            *kept = Some((root.to_path_buf(), std::time::Instant::now(), n));
            n
        }
    }
}

const SIZE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// The bytes of the files under `dir` (the store's objects and index).
fn bytes_under(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => pending.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

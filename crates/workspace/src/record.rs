//! What is kept on disk for each workspace: `<home>/workspaces/<id>/workspace.json`, enough
//! to serve it again after a restart and to reach its executor from `cloud-harness exec`.

use crate::session_start::SessionStart;
use crate::stack::OwnerBundle;
use cloud_harness_control::home::write_atomic;
use cloud_harness_error::{Error, Result};
use cloud_harness_executor as executor;
use cloud_harness_store::cas::Digest;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub id: String,
    /// The principal that opened it (`token:alice`); empty in records from before owners
    /// were kept, which only operators reach.
    #[serde(default)]
    pub owner: String,
    pub idempotency_key: String,
    pub request_digest: Digest,
    pub created_at: u64,
    pub owner_bundles: Vec<OwnerBundle>,
    /// Workspace-scope skills by name, with the toolkit each came from.
    pub workspace_skills: BTreeMap<String, String>,
    pub session_start: Vec<SessionStart>,
    /// The workspace's executor; absent in records written before executors existed.
    #[serde(default)]
    pub executor: Option<executor::Spec>,
    /// Opened with `idlePause: false`: it never pauses.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub never_pause: bool,
    pub result: Value,
}

pub fn workspaces_dir(home: &Path) -> PathBuf {
    home.join("workspaces")
}

pub fn record_path(dir: &Path) -> PathBuf {
    dir.join("workspace.json")
}

/// A workspace id as `workspace_open` makes them: `ws_` and 32 hex digits. Anything else
/// names no workspace (and never a path outside the workspaces folder).
pub fn check_id(id: &str) -> Result<()> {
    let ok = id
        .strip_prefix("ws_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(not_found(id))
    }
}

pub fn not_found(id: &str) -> Error {
    let shown: String = id.chars().take(80).collect();
    Error::not_found(format!("no open workspace {shown:?}"))
        .with_details(json!({ "field": "workspace" }))
}

impl Record {
    /// The sets the workspace's toolkits came from.
    pub fn sets(&self) -> Vec<String> {
        let mut sets: Vec<String> = self.result["toolkits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["set"]["id"].as_str().map(str::to_owned))
            .collect();
        sets.dedup();
        sets
    }

    pub fn save(&self, dir: &Path) -> Result<()> {
        write_atomic(
            &record_path(dir),
            &serde_json::to_vec_pretty(self).expect("records serialize"),
        )
    }

    pub fn load(dir: &Path) -> Result<Record> {
        let path = record_path(dir);
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::internal(format!("{}: {e}", path.display())))
    }

    /// The record of the open workspace `id` under `home`.
    pub fn find(home: &Path, id: &str) -> Result<(PathBuf, Record)> {
        check_id(id)?;
        let dir = workspaces_dir(home).join(id);
        if !record_path(&dir).is_file() {
            return Err(not_found(id));
        }
        let record = Record::load(&dir)?;
        Ok((dir, record))
    }
}

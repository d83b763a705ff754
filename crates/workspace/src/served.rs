//! One open workspace: its places, record, mounts and live tiers, its executor and runs, its
//! generation and the pages it served. What it does is spread over the files of the concept
//! (`listing`, `read`, `catalog`, `run`), each an `impl Workspace` of its own.

use super::mounts;
use super::pages::Pages;
use super::record::Record;
use crate::session_start::SessionStart;
use cloud_harness_control::state::Db;
use cloud_harness_error::{Error, Result};
use cloud_harness_executor::{Executor, Places};
use cloud_harness_mount::live::LiveTiers;
use cloud_harness_skills::generation::Generation;
use cloud_harness_skills::namespace::Namespace;
use cloud_harness_store::cas::{Digest, Store};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// An open workspace.
pub struct Workspace {
    pub id: String,
    pub dir: PathBuf,
    pub(super) places: Places,
    pub(super) record: Record,
    pub(super) store: Store,
    pub(super) merged: Arc<Namespace>,
    /// The owner tier alone (the `owner-skills` mount), kept to mount again after a pause.
    pub(super) owner_view: Arc<Namespace>,
    pub(super) mounts: Mutex<Vec<mounts::Mounted>>,
    pub(super) live: Mutex<Option<LiveTiers>>,
    pub(super) executor: Option<Executor>,
    /// Cancelled when the workspace closes: its running scripts are killed.
    pub(super) runs: CancellationToken,
    /// Scripts running now.
    pub(super) running: Arc<std::sync::atomic::AtomicUsize>,
    /// The merged view's generation, changed by live tiers.
    pub(super) changes: tokio::sync::watch::Sender<Digest>,
    /// The listing pages served last, for the generation they were built from.
    pub(super) pages: Pages,
    /// Where each served skill comes from, for the uses counted (`skill_usage`).
    pub(super) origins: Arc<crate::origins::Origins>,
    /// The state database: the approvals each run checks, the refusals it records.
    pub(super) db: Db,
    /// When it was last used, and whether it is paused (`pause`).
    pub(super) idle: crate::idle::Idle,
}
impl Workspace {
    /// Waits (a bounded time) until no script of this workspace runs.
    pub(super) fn wait_for_runs(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.running.load(std::sync::atomic::Ordering::SeqCst) > 0
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets go of its live tier and mounts; a bubblewrap sandbox first, whose namespace holds
    /// copies of the mounts (each unmount would wait in vain for its session to end). A
    /// Docker container stays.
    pub(super) fn release(&self) -> Result<()> {
        if let Some(executor) = &self.executor {
            executor.idle();
        }
        self.live.lock().expect("live lock").take();
        mounts::release(&mut self.mounts.lock().expect("mount lock"))
    }

    /// Whether it is paused while idle (`pause`).
    pub fn is_paused(&self) -> bool {
        self.idle.paused()
    }

    /// The principal that opened it (empty for workspaces from before owners were kept).
    pub fn owner(&self) -> &str {
        &self.record.owner
    }

    /// The session-start instructions it serves: an owner-tier toolkit's only while its
    /// tier still serves it (one whose signature was withdrawn is left out of the stack when
    /// the workspace is next made live, and its instructions with it).
    pub fn session_start(&self) -> Vec<SessionStart> {
        let g = self.merged.generation();
        let served = |toolkit: &str| {
            let id = format!("owner:{toolkit}");
            g.index.sources.iter().any(|s| s.id == id)
        };
        self.record
            .session_start
            .iter()
            .filter(|s| {
                !self
                    .record
                    .owner_bundles
                    .iter()
                    .any(|b| b.instance_id == s.toolkit)
                    || served(&s.toolkit)
            })
            .cloned()
            .collect()
    }

    /// What the API's list of workspaces shows of one.
    pub fn summary(&self) -> Value {
        let g = self.generation();
        json!({
            "workspace": self.id,
            "owner": self.record.owner,
            "state": "open",
            "paused": self.is_paused(),
            "idlePause": !self.record.never_pause,
            "idempotencyKey": self.record.idempotency_key,
            "createdAt": self.record.created_at,
            "generation": g.digest(),
            "skills": g.index.winners().count(),
            "conflicts": g.index.conflicts().count(),
            "executor": self.executor.as_ref().map(|e| e.spec.kind),
            "toolkits": self.record.result.get("toolkits").cloned().unwrap_or(Value::Null),
        })
    }

    /// Whether its mounts are served: each is among `ours` (the points of this project's FUSE
    /// mounts, from one read of the table for every workspace) and its session is served. Nothing is read through the mounts: a read of
    /// its own mount that is in flight when the server is killed waits for an answer only the
    /// dead server could give, so the process never ends and its unmount guard never acts.
    /// A paused workspace, or one being paused or resumed now, has none to check.
    pub fn check_mounts(
        &self,
        ours: &std::collections::HashSet<&std::path::Path>,
    ) -> std::result::Result<(), String> {
        let Ok(mounts) = self.mounts.try_lock() else {
            return Ok(());
        };
        mounts.iter().try_for_each(|m| m.check(ours))
    }

    /// What `workspace_open` returned for it.
    pub fn result(&self) -> &Value {
        &self.record.result
    }

    pub fn generation(&self) -> Arc<Generation> {
        self.merged.generation()
    }

    /// Each change of what the workspace serves (a live tier's new generation); ends when
    /// the workspace closes.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<Digest> {
        self.changes.subscribe()
    }

    /// The merged view inside the executor, when the skills are mounted and there is one.
    pub(super) fn skills_root(&self) -> Option<String> {
        let mounted = !self.mounts.lock().expect("mount lock").is_empty();
        let executor = self.executor.as_ref()?;
        mounted.then(|| executor.paths().skills())
    }

    /// The digest of a served skill.
    pub fn skill(&self, name: &str) -> Result<Digest> {
        let g = self.generation();
        let c = g.index.winner(name).ok_or_else(|| {
            Error::not_found(format!("workspace {} serves no skill {name:?}", self.id))
                .with_details(json!({ "field": "skill" }))
        })?;
        Ok(c.digest())
    }

    /// What the served skill `name` breaks of the Agent Skills specification.
    pub fn problems(&self, name: &str) -> Result<Vec<cloud_harness_skills::spec::Problem>> {
        let g = self.generation();
        let c = g.index.winner(name).ok_or_else(|| {
            Error::not_found(format!("workspace {} serves no skill {name:?}", self.id))
                .with_details(json!({ "field": "skill" }))
        })?;
        Ok(c.info.problems.clone())
    }

    pub fn store(&self) -> &Store {
        &self.store
    }
}

//! Workspaces: a project's working tree, its skills and its executor.
//!
//! Opening one fetches the project repository (the same allowlist and proxy as toolkits,
//! always in-process), acquires every toolkit, materializes workspace-scope toolkits into
//! `.cloud-harness/skills/`, builds the tier stack, refuses unsettled conflicts, mounts the
//! merged view and the owner tier, and makes the executor that shows them. Everything is
//! checked before anything is mounted, and a failure removes the half-made workspace (its
//! container included). Opening is idempotent by key, across concurrent calls and restarts:
//! the same key and request give the same result; the same key with another request is a
//! CONFLICT.
//!
//! ```text
//! <home>/workspaces/<id>/workspace.json      the record
//! <home>/workspaces/<id>/repo/               the working tree          → /workspace
//! <home>/workspaces/<id>/mounts/             a shared mount            → /opt/cloud-harness
//! <home>/workspaces/<id>/mounts/skills/        the merged view (FUSE)
//! <home>/workspaces/<id>/mounts/owner-skills/  the owner tier (FUSE)
//! <home>/workspaces/<id>/mounts/.by-digest/    approved skill copies, by digest
//! <home>/workspaces/<id>/etc/                the executor's passwd, group, hosts
//! ```

mod listing;
mod materialize;
mod mounts;
mod read;
mod record;
mod request;
mod roots;
mod run;

pub use read::{check_skill_path, Page};
pub use record::Record;
pub use request::OpenRequest;
pub use run::RunRequest;

use crate::executor::{self, Executor, Kind, Places};
use crate::keyed_lock::KeyedLock;
use crate::operator::Operator;
use crate::provision::{fetch, Acquired, Provisioner};
use crate::session_start::{self, SessionStart};
use crate::stack::{OwnerBundle, TierInputs};
use crate::toolkit::{self, Revision, Scope};
use cloud_harness_fs::cas::{Digest, Store};
use cloud_harness_fs::discovery::SkillCache;
use cloud_harness_fs::generation::{Generation, View};
use cloud_harness_fs::live::LiveTiers;
use cloud_harness_fs::namespace::Namespace;
use cloud_harness_fs::resolver::{Override, Tier};
use cloud_harness_fs::{Code, Error, Result};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

pub use crate::executor::WORKSPACE_SKILLS;

/// An open workspace.
pub struct Workspace {
    pub id: String,
    pub dir: PathBuf,
    places: Places,
    record: Record,
    store: Store,
    merged: Arc<Namespace>,
    mounts: Mutex<Vec<mounts::Mounted>>,
    live: Mutex<Option<LiveTiers>>,
    executor: Option<Executor>,
    /// Cancelled when the workspace closes: its running scripts are killed.
    runs: CancellationToken,
    /// Scripts running now.
    running: Arc<std::sync::atomic::AtomicUsize>,
}

pub struct Workspaces {
    home: PathBuf,
    provisioner: Provisioner,
    executors: executor::Settings,
    /// The executor backend new workspaces get, if any.
    executor_kind: Option<Kind>,
    open: Mutex<HashMap<String, Arc<Workspace>>>,
    /// Idempotency keys in use: the request each was opened with and its workspace. Filled
    /// from the workspace records at start-up, so it needs no file of its own.
    keys: Mutex<HashMap<String, (Digest, String)>>,
    key_locks: KeyedLock,
    mounting: bool,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn new_id() -> String {
    format!("ws_{}", uuid::Uuid::new_v4().simple())
}

/// Removes a half-made workspace (its executor, mounts and folder) unless disarmed.
struct Cleanup {
    dir: Option<PathBuf>,
    executor: Option<Executor>,
    store: Store,
}

impl Cleanup {
    fn disarm(&mut self) -> Option<Executor> {
        self.dir = None;
        self.executor.take()
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            if let Some(e) = self.executor.take() {
                if let Err(err) = e.remove() {
                    tracing::error!(error = %err, "removing a half-made executor failed");
                }
            }
            let places = Places::of(&dir);
            mounts::clear(&places.mounts);
            mounts::unshare(&places.mounts);
            if let Some(id) = dir.file_name().and_then(|n| n.to_str()) {
                let _ = roots::unpin(&self.store, id);
            }
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

impl Workspaces {
    /// The workspaces under `home`; those left open by a previous run are mounted again.
    pub fn new(home: PathBuf, provisioner: Provisioner, mounting: bool) -> Result<Workspaces> {
        Workspaces::with_executors(home, provisioner, mounting, executor::Settings::from_env()?)
    }

    /// The same, with explicit executor settings.
    pub fn with_executors(
        home: PathBuf,
        provisioner: Provisioner,
        mounting: bool,
        executors: executor::Settings,
    ) -> Result<Workspaces> {
        let dir = record::workspaces_dir(&home);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let executor_kind = executors.kind()?;
        match executor_kind {
            None => tracing::warn!("no executor: install bubblewrap or start a Docker engine; skills_run refuses to run scripts"),
            Some(Kind::Host) => tracing::warn!("CLOUD_HARNESS_EXECUTOR=host: scripts run on the host, for development only"),
            Some(_) => {}
        }
        let ws = Workspaces {
            home,
            provisioner,
            executors,
            executor_kind,
            open: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
            key_locks: KeyedLock::default(),
            mounting,
        };
        ws.restore();
        Ok(ws)
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    pub fn store(&self) -> &Store {
        &self.provisioner.store
    }

    fn restore(&self) {
        let Ok(entries) = fs::read_dir(record::workspaces_dir(&self.home)) else {
            return;
        };
        for entry in entries.flatten() {
            if !record::record_path(&entry.path()).is_file() {
                // A workspace whose open was cut short (the server killed before its record
                // was written): nothing of it may stay.
                self.sweep(&entry.path());
                continue;
            }
            let record = match Record::load(&entry.path()) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "unreadable workspace record");
                    continue;
                }
            };
            let id = record.id.clone();
            self.keys.lock().expect("keys lock").insert(
                record.idempotency_key.clone(),
                (record.request_digest, id.clone()),
            );
            let overrides = match Operator::load(&self.home) {
                Ok(o) => o.overrides,
                Err(e) => {
                    tracing::error!(workspace = %id, error = %e, "cannot restore workspace");
                    continue;
                }
            };
            let places = Places::of(&entry.path());
            // The container (if any) lives on; a record from before executors gets one now.
            let executor = match record.executor.clone() {
                Some(spec) => Some(Executor::attach(spec, places.clone(), &id)),
                None => self.make_executor(&places, &id).ok().flatten(),
            };
            match self.activate(record, &entry.path(), &overrides, false, &mut Vec::new()) {
                Ok(mut ws) => {
                    tracing::info!(workspace = %id, "workspace restored");
                    ws.executor = executor;
                    self.open
                        .lock()
                        .expect("workspaces lock")
                        .insert(id, Arc::new(ws));
                }
                Err(e) => tracing::error!(workspace = %id, error = %e, "cannot restore workspace"),
            }
        }
    }

    /// Removes a half-made workspace found at start-up: its container (found by its label),
    /// its mounts, its roots and its folder.
    fn sweep(&self, dir: &Path) {
        let Some(id) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            return;
        };
        if record::check_id(&id).is_err() {
            return;
        }
        tracing::warn!(workspace = %id, "removing a workspace whose open never finished");
        if self.executor_kind == Some(Kind::Docker) {
            if let Err(e) = executor::docker::remove_by_dir(dir) {
                tracing::error!(workspace = %id, error = %e, "cannot remove its container");
            }
        }
        drop(Cleanup {
            dir: Some(dir.to_path_buf()),
            executor: None,
            store: self.store().clone(),
        });
    }

    pub fn get(&self, id: &str) -> Result<Arc<Workspace>> {
        self.open
            .lock()
            .expect("workspaces lock")
            .get(id)
            .cloned()
            .ok_or_else(|| record::not_found(id))
    }

    fn make_executor(&self, places: &Places, id: &str) -> Result<Option<Executor>> {
        let Some(kind) = self.executor_kind else {
            return Ok(None);
        };
        // The executor's egress proxy: its own allowlist, the operator's ranges and pins.
        let egress_proxy = || {
            let image = match self.provisioner.sandbox() {
                Some(s) => s.helper_image()?,
                None => {
                    return Err(Error::new(
                        Code::Upstream,
                        "egress for executors needs a Docker engine (CLOUD_HARNESS_CONTAINERS=off leaves none)",
                    ))
                }
            };
            let hosts =
                crate::provision::hosts::HostPolicy::new(&self.executors.allowed_hosts, "")?;
            let env = self.provisioner.egress.with_hosts(hosts).proxy_env();
            Ok(executor::docker::EgressProxy { image, env })
        };
        Executor::create(&self.executors, kind, places, id, egress_proxy).map(Some)
    }

    /// `workspace_open`.
    pub fn open(&self, request: OpenRequest) -> Result<Value> {
        let key = request.idempotency_key.clone();
        request::check_key(&key)?;
        let toolkits = toolkit::resolve_request(&request.toolkits, self.provisioner.hosts())?;
        if !request.allow_toolkit_workspace_changes {
            if let Some((i, _)) = toolkits
                .iter()
                .enumerate()
                .find(|(_, t)| t.scope == Scope::Workspace)
            {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "allowToolkitWorkspaceChanges",
                    format!("toolkits[{i}] has scope `workspace`, which writes into the working tree; set allowToolkitWorkspaceChanges to true to allow it"),
                ));
            }
        }
        let repo_url = match &request.repository_url {
            Some(url) => Some(self.provisioner.hosts().check(url, "repositoryUrl")?),
            None => None,
        };
        let digest = request::request_digest(&request, &toolkits);

        // One open per key at a time; the others then find its workspace.
        self.key_locks.with(&key, || {
            self.open_locked(&request, &toolkits, repo_url.as_deref(), digest)
        })
    }

    fn open_locked(
        &self,
        request: &OpenRequest,
        toolkits: &[toolkit::Toolkit],
        repo_url: Option<&str>,
        digest: Digest,
    ) -> Result<Value> {
        let key = request.idempotency_key.clone();
        let existing = self.keys.lock().expect("keys lock").get(&key).cloned();
        if let Some((existing_digest, workspace)) = existing {
            if existing_digest != digest {
                return Err(Error::conflict(format!(
                    "idempotencyKey {key:?} was used for a different request (workspace {workspace}); use a new key for a new request"
                ))
                .with_details(json!({ "field": "idempotencyKey", "workspace": workspace })));
            }
            // One key owns at most one workspace: one that could not be served again after a
            // restart keeps its key until it is closed.
            return match self.get(&workspace) {
                Ok(ws) => Ok(ws.record.result.clone()),
                Err(_) => Err(Error::conflict(format!(
                    "idempotencyKey {key:?} belongs to workspace {workspace}, which could not be served again after a restart (the server's log says why); close it with workspace_close to free the key"
                ))
                .with_details(json!({ "field": "idempotencyKey", "workspace": workspace }))),
            };
        }

        let id = new_id();
        let dir = record::workspaces_dir(&self.home).join(&id);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut cleanup = Cleanup {
            dir: Some(dir.clone()),
            executor: None,
            store: self.store().clone(),
        };
        let places = Places::of(&dir);
        let repo = &places.repo;
        let mut repository = Value::Null;
        match repo_url {
            Some(fetched) => {
                let deadline =
                    Instant::now() + Duration::from_secs(self.provisioner.limits.max_seconds);
                let commit = fetch::clone_worktree(
                    fetched,
                    &Revision::DefaultHead,
                    &self.provisioner.transport()?,
                    repo,
                    deadline,
                )
                .map_err(|e| self.provisioner.explain(fetched, e))?;
                repository = json!({ "url": request.repository_url, "fetchedUrl": fetched, "commit": commit.to_string() });
            }
            None => fs::create_dir_all(repo).map_err(|e| Error::io(repo, e))?,
        }

        let mut acquired: Vec<(toolkit::Toolkit, Acquired)> = Vec::new();
        for t in toolkits {
            let a = self.provisioner.acquire(t)?;
            acquired.push((t.clone(), a));
        }
        let overrides = Operator::load(&self.home)?.overrides;
        let workspace_skills =
            materialize::workspace_scope(self.store(), repo, &acquired, &overrides)?;
        if matches!(self.executor_kind, Some(Kind::Docker | Kind::Bwrap))
            && nix::unistd::geteuid().is_root()
        {
            materialize::hand_over(repo, self.executors.uid, self.executors.gid)?;
        }
        let owner_bundles: Vec<OwnerBundle> = acquired
            .iter()
            .filter(|(t, _)| t.scope == Scope::Owner)
            .map(|(t, a)| OwnerBundle {
                instance_id: t.instance_id.clone(),
                bundle: a.record.bundle,
                url: a.record.key.url.clone(),
                commit: a.record.key.commit.clone(),
            })
            .collect();
        let session_start: Vec<SessionStart> = acquired
            .iter()
            .filter_map(|(t, a)| {
                let skill = t.session_start_skill.as_deref()?;
                session_start::from_bundle(self.store(), &a.record.bundle, &t.instance_id, skill)
            })
            .collect();

        let record = Record {
            id: id.clone(),
            idempotency_key: key.clone(),
            request_digest: digest,
            created_at: now_secs(),
            owner_bundles,
            workspace_skills,
            session_start,
            executor: None,
            result: Value::Null,
        };
        let mut warnings = Vec::new();
        let mut ws = self.activate(record, &dir, &overrides, true, &mut warnings)?;
        cleanup.executor = self.make_executor(&places, &id)?;
        ws.record.executor = cleanup.executor.as_ref().map(|e| e.spec.clone());
        match self.executor_kind {
            None => warnings.push(executor::missing().message),
            Some(Kind::Host) => warnings.push(
                "CLOUD_HARNESS_EXECUTOR=host: scripts run on the host as the server's user, for development only".into(),
            ),
            Some(_) => {}
        }
        ws.executor = cleanup.disarm();
        ws.record.result = self.open_result(&ws, &acquired, repository, warnings);
        if let Err(e) = ws.record.save(&dir) {
            // Armed again: nothing of a workspace without a record stays.
            let _ = Cleanup {
                dir: Some(dir),
                executor: ws.executor.take(),
                store: self.store().clone(),
            };
            return Err(e);
        }
        let result = ws.record.result.clone();
        self.keys
            .lock()
            .expect("keys lock")
            .insert(key, (digest, id.clone()));
        self.open
            .lock()
            .expect("workspaces lock")
            .insert(id, Arc::new(ws));
        Ok(result)
    }

    /// The tier stack of a workspace: built-in, its owner bundles, the workspace-scope folder
    /// and the project's own skills, with the operator's overrides.
    fn stack_inputs(record: &Record, repo: &Path, overrides: &[Override]) -> TierInputs {
        let ws_dir = repo.join(WORKSPACE_SKILLS);
        TierInputs {
            builtin: true,
            owner_bundles: record.owner_bundles.clone(),
            owner_dirs: Vec::new(),
            workspace_dirs: if ws_dir.is_dir() {
                vec![ws_dir]
            } else {
                Vec::new()
            },
            repository: Some(repo.to_path_buf()),
            overrides: overrides.to_vec(),
            confine: Some(repo.to_path_buf()),
        }
    }

    /// Builds a workspace's stack from its record and mounts it. A new workspace
    /// (`reject_conflicts`) is refused on an unsettled conflict; a restored one is served as
    /// it stands.
    fn activate(
        &self,
        record: Record,
        dir: &Path,
        overrides: &[Override],
        reject_conflicts: bool,
        warnings: &mut Vec<String>,
    ) -> Result<Workspace> {
        let places = Places::of(dir);
        let cache = SkillCache::default();
        let spec = Workspaces::stack_inputs(&record, &places.repo, overrides)
            .stack(self.store(), &cache)?;
        let generation = Arc::new(spec.generation(self.store(), &cache)?);
        if reject_conflicts {
            if let Some(err) = generation.index.conflict_error() {
                return Err(err);
            }
        }
        let store = self.store().clone();
        roots::pin(&store, &record.id, &generation)?;
        let merged = Arc::new(Namespace::new(
            store.clone(),
            View::Merged,
            generation.clone(),
        ));
        let owner = Arc::new(Namespace::new(
            store.clone(),
            View::Tier(Tier::Owner),
            generation,
        ));
        // Only long-lived containers need the propagation (bubblewrap binds afresh each time).
        let kind = record
            .executor
            .as_ref()
            .map(|e| e.kind)
            .or(self.executor_kind);
        if kind == Some(Kind::Docker) {
            mounts::share(&places.mounts)?;
        } else {
            fs::create_dir_all(&places.mounts).map_err(|e| Error::io(&places.mounts, e))?;
        }
        let (mounted, mut targets) = if self.mounting {
            mounts::mount(&places.mounts, merged.clone(), owner, warnings)?
        } else {
            (Vec::new(), mounts::unmounted(merged.clone(), owner))
        };
        // Each new generation of a live tier is rooted as soon as it is served.
        if let Some((ns, invalidate)) = targets.pop() {
            let (pinned, pin_store, id) = (ns.clone(), store.clone(), record.id.clone());
            targets.push((
                ns,
                Box::new(move |items: &[_]| {
                    invalidate(items);
                    if let Err(e) = roots::pin(&pin_store, &id, &pinned.generation()) {
                        tracing::error!(workspace = %id, error = %e, "cannot root a new generation");
                    }
                }),
            ));
        }
        let live = LiveTiers::start(spec, store.clone(), Arc::new(cache), targets);
        Ok(Workspace {
            id: record.id.clone(),
            dir: dir.to_path_buf(),
            places,
            record,
            store,
            merged,
            mounts: Mutex::new(mounted),
            live: Mutex::new(Some(live)),
            executor: None,
            runs: CancellationToken::new(),
            running: Arc::default(),
        })
    }

    /// What `workspace_open` returns (and returns again for the same key).
    fn open_result(
        &self,
        ws: &Workspace,
        acquired: &[(toolkit::Toolkit, Acquired)],
        repository: Value,
        warnings: Vec<String>,
    ) -> Value {
        let toolkits: Vec<Value> = acquired
            .iter()
            .map(|(t, a)| {
                json!({
                    "instanceId": t.instance_id,
                    "preset": t.preset,
                    "scope": t.scope,
                    "url": a.record.key.url,
                    "commit": a.record.key.commit,
                    "bundle": a.record.bundle,
                    "manifest": a.record.manifest,
                    "skillCount": a.record.skills,
                    "warnings": a.record.warnings,
                    "warm": a.warm,
                    "mode": a.mode,
                })
            })
            .collect();
        let g = ws.merged.generation();
        let index = &g.index;
        let skills: Vec<Value> = index
            .winners()
            .map(|c| ws.skill_json(index, c, true))
            .collect();
        let mut shadowed = Vec::new();
        for r in index.resolutions() {
            if let Some(w) = &r.winner {
                for s in &r.shadowed {
                    let mut v = ws.skill_json(index, s, false);
                    v["shadowedBy"] = json!({ "tier": w.tier, "toolkit": ws.toolkit_of(index, w) });
                    shadowed.push(v);
                }
            }
        }
        let settled: Vec<Value> = index
            .resolutions()
            .iter()
            .filter(|r| r.settled_by_override)
            .map(|r| json!({ "skill": r.name, "winner": r.winner.as_ref().map(|w| index.source(w).id.clone()), "settledBy": "operator override" }))
            .collect();
        let session_start = &ws.record.session_start;
        let paths = ws.executor.as_ref().map(|e| e.paths());
        json!({
            "workspace": ws.id,
            "path": paths.as_ref().map(|p| p.workspace.clone()),
            "repository": repository,
            "skillsMount": ws.skills_root(),
            "ownerSkillsMount": ws.skills_root().and(paths.as_ref().map(|p| p.owner_skills())),
            "executor": ws.executor.as_ref().map(|e| e.describe()),
            "generation": g.digest(),
            "provisioning": self.provisioner.provisioning(),
            "toolkits": toolkits,
            "skills": skills,
            "shadowed": shadowed,
            "conflicts": settled,
            "sessionStart": if session_start.is_empty() { Value::Null } else { json!(session_start) },
            "warnings": warnings,
        })
    }

    /// `workspace_close`: kills its runs, removes its executor, unmounts, forgets the key,
    /// removes the working tree. The store keeps the bundles.
    pub fn close(&self, id: &str) -> Result<Value> {
        let ws = match self.get(id) {
            Ok(ws) => ws,
            Err(e) => return self.discard(id).map_err(|_| e),
        };
        ws.runs.cancel();
        ws.wait_for_runs(Duration::from_secs(10));
        if let Some(e) = &ws.executor {
            e.remove()?;
        }
        ws.release()?;
        mounts::unshare(&ws.places.mounts);
        roots::unpin(self.store(), id)?;
        self.open.lock().expect("workspaces lock").remove(id);
        self.keys
            .lock()
            .expect("keys lock")
            .remove(&ws.record.idempotency_key);
        fs::remove_dir_all(&ws.dir).map_err(|e| Error::io(&ws.dir, e))?;
        Ok(json!({ "workspace": id, "closed": true }))
    }

    /// Closes a workspace that has a record but could not be served again after a restart:
    /// its executor, roots, mounts and folder go, and its key is free.
    fn discard(&self, id: &str) -> Result<Value> {
        let (dir, record) = Record::find(&self.home, id)?;
        let places = Places::of(&dir);
        if let Some(spec) = record.executor {
            Executor::attach(spec, places.clone(), id).remove()?;
        }
        mounts::clear(&places.mounts);
        mounts::unshare(&places.mounts);
        roots::unpin(self.store(), id)?;
        self.keys
            .lock()
            .expect("keys lock")
            .remove(&record.idempotency_key);
        fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(json!({ "workspace": id, "closed": true }))
    }

    /// Unmounts every workspace (server shutdown); their records, shared mount folders and
    /// containers stay, so a restart serves them again.
    pub fn shutdown(&self) {
        let all: Vec<Arc<Workspace>> = self
            .open
            .lock()
            .expect("workspaces lock")
            .drain()
            .map(|(_, w)| w)
            .collect();
        for ws in all {
            ws.runs.cancel();
            if let Err(e) = ws.release() {
                tracing::error!(workspace = %ws.id, error = %e, "unmount failed");
            }
        }
    }
}

/// Whether the merged skills view of a workspace's places is mounted (by a running server).
pub fn is_mounted(places: &Places) -> bool {
    mounts::is_mount_point(&places.mounts.join(mounts::SKILLS))
}

impl Workspace {
    /// Waits (a bounded time) until no script of this workspace runs.
    fn wait_for_runs(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.running.load(std::sync::atomic::Ordering::SeqCst) > 0
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn release(&self) -> Result<()> {
        self.live.lock().expect("live lock").take();
        mounts::release(&mut self.mounts.lock().expect("mount lock"))
    }

    pub fn session_start(&self) -> &[SessionStart] {
        &self.record.session_start
    }

    pub fn generation(&self) -> Arc<Generation> {
        self.merged.generation()
    }

    /// The merged view inside the executor, when the skills are mounted and there is one.
    fn skills_root(&self) -> Option<String> {
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

    pub fn store(&self) -> &Store {
        &self.store
    }
}

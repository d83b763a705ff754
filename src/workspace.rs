//! Workspaces: a project's working tree with its skills.
//!
//! Opening one fetches the project repository (the same allowlist and proxy as toolkits,
//! always in-process), acquires every toolkit, materializes workspace-scope toolkits into
//! `.cloud-harness/skills/`, builds the tier stack, refuses unsettled conflicts, and mounts the
//! merged view and the owner tier. Everything is checked before anything is mounted, and a
//! failure removes the half-made workspace. Opening is idempotent by key, across concurrent
//! calls and restarts: the same key and request give the same result; the same key with another
//! request is a CONFLICT.

use crate::builtin;
use crate::home::write_atomic;
use crate::operator::Operator;
use crate::provision::{fetch, Acquired, Provisioner};
use crate::session_start::{self, SessionStart};
use crate::toolkit::{self, Revision, Scope, ToolkitSpec};
use cloud_harness_fs::cas::{self, Digest, Limits, Store};
use cloud_harness_fs::discovery::SkillCache;
use cloud_harness_fs::fuse::{self, MountConfig};
use cloud_harness_fs::generation::{Generation, View};
use cloud_harness_fs::live::{LiveTiers, Target};
use cloud_harness_fs::namespace::Namespace;
use cloud_harness_fs::resolver::{self, Candidate, Index, Override, Tier};
use cloud_harness_fs::stack::StackSpec;
use cloud_harness_fs::{relpath, Code, Error, Result};
use nix::errno::Errno;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Where workspace-scope toolkits are materialized, inside the working tree.
pub const WORKSPACE_SKILLS: &str = ".cloud-harness/skills";

/// A validated `workspace_open` request.
#[derive(Debug, Clone)]
pub struct OpenRequest {
    pub repository_url: Option<String>,
    pub idempotency_key: String,
    pub toolkits: Vec<ToolkitSpec>,
    pub allow_toolkit_workspace_changes: bool,
}

/// What makes two requests "the same": every field but the key, with the toolkits as they
/// resolve (defaults filled in, presets expanded), so spelling a default out changes nothing.
fn request_digest(request: &OpenRequest, toolkits: &[toolkit::Toolkit]) -> Digest {
    let canonical = json!({
        "repositoryUrl": request.repository_url,
        "toolkits": toolkits,
        "allowToolkitWorkspaceChanges": request.allow_toolkit_workspace_changes,
    });
    Digest::of(&serde_json::to_vec(&canonical).expect("requests serialize"))
}

/// An owner-tier bundle of a workspace, enough to rebuild its stack after a restart.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BundleInput {
    instance_id: String,
    bundle: Digest,
    url: String,
    commit: String,
}

/// What is kept on disk for each workspace.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    id: String,
    idempotency_key: String,
    request_digest: Digest,
    created_at: u64,
    owner_bundles: Vec<BundleInput>,
    /// Workspace-scope skills by name, with the toolkit each came from.
    workspace_skills: BTreeMap<String, String>,
    session_start: Vec<SessionStart>,
    result: Value,
}

struct Mounted {
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// An open workspace.
pub struct Workspace {
    pub id: String,
    pub dir: PathBuf,
    pub repo: PathBuf,
    record: Record,
    store: Store,
    merged: Arc<Namespace>,
    mounts: Mutex<Vec<Mounted>>,
    live: Mutex<Option<LiveTiers>>,
}

pub struct Workspaces {
    home: PathBuf,
    provisioner: Provisioner,
    open: Mutex<HashMap<String, Arc<Workspace>>>,
    /// Idempotency keys in use: the request each was opened with and its workspace. Filled
    /// from the workspace records at start-up, so it needs no file of its own.
    keys: Mutex<HashMap<String, (Digest, String)>>,
    key_locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
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

/// Removes a half-made workspace unless disarmed.
struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            for sub in ["skills", "owner-skills"] {
                let _ = fuse::unmount(&dir.join(sub));
            }
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

impl Workspaces {
    /// The workspaces under `home`; those left open by a previous run are mounted again.
    pub fn new(home: PathBuf, provisioner: Provisioner, mounting: bool) -> Result<Workspaces> {
        fs::create_dir_all(home.join("workspaces")).map_err(|e| Error::io(&home, e))?;
        let ws = Workspaces {
            home,
            provisioner,
            open: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
            key_locks: Mutex::new(HashMap::new()),
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

    fn record_path(&self, id: &str) -> PathBuf {
        self.home.join("workspaces").join(id).join("workspace.json")
    }

    fn restore(&self) {
        let Ok(entries) = fs::read_dir(self.home.join("workspaces")) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path().join("workspace.json");
            let Ok(bytes) = fs::read(&path) else { continue };
            let record: Record = match serde_json::from_slice(&bytes) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "unreadable workspace record");
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
            match self.activate(record, &entry.path(), &overrides, false, &mut Vec::new()) {
                Ok(ws) => {
                    tracing::info!(workspace = %id, "workspace restored");
                    self.open
                        .lock()
                        .expect("workspaces lock")
                        .insert(id, Arc::new(ws));
                }
                Err(e) => tracing::error!(workspace = %id, error = %e, "cannot restore workspace"),
            }
        }
    }

    pub fn get(&self, id: &str) -> Result<Arc<Workspace>> {
        self.open
            .lock()
            .expect("workspaces lock")
            .get(id)
            .cloned()
            .ok_or_else(|| {
                Error::not_found(format!("no open workspace {id:?}"))
                    .with_details(json!({ "field": "workspace" }))
            })
    }

    /// `workspace_open`.
    pub fn open(&self, request: OpenRequest) -> Result<Value> {
        let key = request.idempotency_key.clone();
        if key.is_empty() || key.chars().count() > 200 || key.chars().any(char::is_control) {
            return Err(Error::field(
                Code::InvalidArgument,
                "idempotencyKey",
                "must be 1-200 characters, none of them control characters",
            ));
        }
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
        let digest = request_digest(&request, &toolkits);

        // One open per key at a time; the others then find its workspace.
        let lock = self
            .key_locks
            .lock()
            .expect("key lock table")
            .entry(key.clone())
            .or_default()
            .clone();
        let _held = lock.lock().expect("key lock");
        let existing = self.keys.lock().expect("keys lock").get(&key).cloned();
        if let Some((existing_digest, workspace)) = existing {
            if existing_digest != digest {
                return Err(Error::conflict(format!(
                    "idempotencyKey {key:?} was used for a different request (workspace {workspace}); use a new key for a new request"
                ))
                .with_details(json!({ "field": "idempotencyKey", "workspace": workspace })));
            }
            if let Ok(ws) = self.get(&workspace) {
                return Ok(ws.record.result.clone());
            }
        }

        let id = new_id();
        let dir = self.home.join("workspaces").join(&id);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut cleanup = Cleanup(Some(dir.clone()));
        let repo = dir.join("repo");
        let mut repository = Value::Null;
        match &repo_url {
            Some(fetched) => {
                let deadline =
                    Instant::now() + Duration::from_secs(self.provisioner.limits.max_seconds);
                let commit = fetch::clone_worktree(
                    fetched,
                    &Revision::DefaultHead,
                    &self.provisioner.transport()?,
                    &repo,
                    deadline,
                )
                .map_err(|e| self.provisioner.explain(fetched, e))?;
                repository = json!({ "url": request.repository_url, "fetchedUrl": fetched, "commit": commit.to_string() });
            }
            None => fs::create_dir_all(&repo).map_err(|e| Error::io(&repo, e))?,
        }

        let mut acquired: Vec<(toolkit::Toolkit, Acquired)> = Vec::new();
        for t in &toolkits {
            let a = self.provisioner.acquire(t)?;
            acquired.push((t.clone(), a));
        }
        let overrides = Operator::load(&self.home)?.overrides;
        let workspace_skills = self.materialize_workspace_scope(&repo, &acquired, &overrides)?;
        let owner_bundles: Vec<BundleInput> = acquired
            .iter()
            .filter(|(t, _)| t.scope == Scope::Owner)
            .map(|(t, a)| BundleInput {
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
            result: Value::Null,
        };
        let mut warnings = Vec::new();
        let mut ws = self.activate(record, &dir, &overrides, true, &mut warnings)?;
        ws.record.result = self.open_result(&ws, &acquired, repository, warnings);
        write_atomic(
            &self.record_path(&id),
            &serde_json::to_vec_pretty(&ws.record).expect("records serialize"),
        )?;
        cleanup.0 = None;
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

    /// Writes workspace-scope skills into `.cloud-harness/skills/`, all or nothing. Two of
    /// these toolkits bringing one skill name are resolved like any same-tier collision (an
    /// operator override settles it); a skill of the same name already there with other
    /// content is a CONFLICT naming both digests.
    fn materialize_workspace_scope(
        &self,
        repo: &Path,
        acquired: &[(toolkit::Toolkit, Acquired)],
        overrides: &[Override],
    ) -> Result<BTreeMap<String, String>> {
        let target = repo.join(WORKSPACE_SKILLS);
        let cache = SkillCache::default();
        let sources = acquired
            .iter()
            .filter(|(t, _)| t.scope == Scope::Workspace)
            .map(|(t, a)| {
                crate::provision::bundle_source(
                    self.store(),
                    &cache,
                    Tier::Workspace,
                    &t.instance_id,
                    &a.record.key.url,
                    &a.record.key.commit,
                    a.record.bundle,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let index = resolver::resolve(&sources, overrides);
        if let Some(err) = index.conflict_error() {
            return Err(err);
        }
        let wanted: BTreeMap<String, (Digest, String)> = index
            .winners()
            .map(|c| {
                let toolkit = index.source(c).provenance.toolkit.clone();
                (c.name.clone(), (c.digest(), toolkit.unwrap_or_default()))
            })
            .collect();
        // Check everything before writing anything.
        let mut to_write = Vec::new();
        for (name, (digest, toolkit)) in &wanted {
            let dest = target.join(name);
            if fs::symlink_metadata(&dest).is_ok() {
                let existing = self.store().import_dir(&dest, &Limits::default())?.digest;
                if existing != *digest {
                    return Err(Error::conflict(format!(
                        "skill `{name}` is already in {WORKSPACE_SKILLS} with other content ({existing}); toolkit `{toolkit}` brings {digest}; nothing was written"
                    ))
                    .with_details(json!({ "skill": name, "existing": existing, "incoming": digest, "toolkit": toolkit })));
                }
            } else {
                to_write.push((dest, *digest));
            }
        }
        let mut written = Vec::new();
        for (dest, digest) in to_write {
            fs::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
            if let Err(e) = cas::materialize(self.store(), &digest, &dest) {
                for done in written {
                    let _ = fs::remove_dir_all(done);
                }
                return Err(e);
            }
            written.push(dest);
        }
        Ok(wanted
            .into_iter()
            .map(|(name, (_, toolkit))| (name, toolkit))
            .collect())
    }

    /// The tier stack of a workspace: built-in, its owner bundles, the workspace-scope folder
    /// and the project's own skills, with the operator's overrides.
    fn stack(
        &self,
        record: &Record,
        repo: &Path,
        cache: &SkillCache,
        overrides: &[Override],
    ) -> Result<StackSpec> {
        let store = self.store();
        let mut spec = StackSpec {
            repository: Some(repo.to_path_buf()),
            overrides: overrides.to_vec(),
            ..StackSpec::default()
        };
        spec.trees.push(builtin::source(store, cache)?);
        for b in &record.owner_bundles {
            spec.trees.push(crate::provision::bundle_source(
                store,
                cache,
                Tier::Owner,
                &b.instance_id,
                &b.url,
                &b.commit,
                b.bundle,
            )?);
        }
        let ws_dir = repo.join(WORKSPACE_SKILLS);
        if ws_dir.is_dir() {
            spec.dirs.push((Tier::Workspace, ws_dir));
        }
        Ok(spec)
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
        let cache = SkillCache::default();
        let spec = self.stack(&record, &dir.join("repo"), &cache, overrides)?;
        let generation = spec.generation(self.store(), &cache)?;
        if reject_conflicts {
            if let Some(err) = generation.index.conflict_error() {
                return Err(err);
            }
        }
        self.mount(
            record,
            dir,
            spec,
            Arc::new(generation),
            Arc::new(cache),
            warnings,
        )
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
        let skills: Vec<Value> = index.winners().map(|c| ws.skill_json(index, c)).collect();
        let mut shadowed = Vec::new();
        for r in index.resolutions() {
            if let Some(w) = &r.winner {
                for s in &r.shadowed {
                    let mut v = ws.skill_json(index, s);
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
        json!({
            "workspace": ws.id,
            "path": ws.repo,
            "repository": repository,
            "skillsMount": ws.mount_path(),
            "ownerSkillsMount": ws.mount_path().map(|_| ws.dir.join("owner-skills")),
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

    fn mount(
        &self,
        record: Record,
        dir: &Path,
        spec: StackSpec,
        generation: Arc<Generation>,
        cache: Arc<SkillCache>,
        warnings: &mut Vec<String>,
    ) -> Result<Workspace> {
        let store = self.store().clone();
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
        let mut mounts = Vec::new();
        let mut targets: Vec<Target> = Vec::new();
        if self.mounting {
            for (ns, sub) in [(merged.clone(), "skills"), (owner.clone(), "owner-skills")] {
                let path = dir.join(sub);
                fs::create_dir_all(&path).map_err(|e| Error::io(&path, e))?;
                match fuse::mount(ns.clone(), &path, &MountConfig::default()) {
                    Ok(m) => {
                        let notifier = m.notifier.clone();
                        let thread = std::thread::Builder::new()
                            .name(format!("fuse-{sub}"))
                            .spawn(move || {
                                if let Err(e) = m.run() {
                                    tracing::error!(error = %e, "skills file system stopped");
                                }
                            })
                            .map_err(|e| Error::internal(format!("spawning a FUSE thread: {e}")))?;
                        mounts.push(Mounted {
                            path,
                            thread: Some(thread),
                        });
                        targets.push((
                            ns,
                            Box::new(move |items: &[_]| fuse::invalidate(&notifier, items)),
                        ));
                    }
                    Err(e) => {
                        warnings.push(format!(
                            "skills are not mounted ({e}); skills_read and skills_run still work"
                        ));
                        break;
                    }
                }
            }
        }
        if mounts.len() < 2 {
            for m in &mounts {
                let _ = fuse::unmount(&m.path);
            }
            mounts.clear();
            targets = vec![
                (merged.clone(), Box::new(|_: &[_]| {})),
                (owner, Box::new(|_: &[_]| {})),
            ];
        }
        let live = LiveTiers::start(spec, store.clone(), cache, targets);
        Ok(Workspace {
            id: record.id.clone(),
            dir: dir.to_path_buf(),
            repo: dir.join("repo"),
            record,
            store,
            merged,
            mounts: Mutex::new(mounts),
            live: Mutex::new(Some(live)),
        })
    }

    /// `workspace_close`: unmounts, forgets the key, removes the working tree. The store keeps
    /// the bundles.
    pub fn close(&self, id: &str) -> Result<Value> {
        let ws = self.get(id)?;
        ws.release()?;
        self.open.lock().expect("workspaces lock").remove(id);
        self.keys
            .lock()
            .expect("keys lock")
            .remove(&ws.record.idempotency_key);
        fs::remove_dir_all(&ws.dir).map_err(|e| Error::io(&ws.dir, e))?;
        Ok(json!({ "workspace": id, "closed": true }))
    }

    /// Unmounts every workspace (server shutdown); their records stay, so a restart restores
    /// them.
    pub fn shutdown(&self) {
        let all: Vec<Arc<Workspace>> = self
            .open
            .lock()
            .expect("workspaces lock")
            .drain()
            .map(|(_, w)| w)
            .collect();
        for ws in all {
            if let Err(e) = ws.release() {
                tracing::error!(workspace = %ws.id, error = %e, "unmount failed");
            }
        }
    }
}

/// A skill as listings show it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SkillView<'a> {
    name: &'a str,
    description: &'a str,
    tier: Tier,
    toolkit: Option<&'a str>,
    source: &'a str,
    digest: Digest,
    user_only: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    served: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shadowed: Option<Vec<SkillView<'a>>>,
}

#[derive(Serialize)]
struct Listing<'a> {
    workspace: &'a str,
    generation: Digest,
    count: usize,
    skills: Vec<SkillView<'a>>,
    conflicts: Vec<Value>,
}

/// One page of a file.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Page {
    pub skill: String,
    pub path: String,
    pub size: u64,
    pub offset: u64,
    pub length: u64,
    /// `utf-8` or `base64`.
    pub encoding: &'static str,
    pub content: String,
    pub eof: bool,
    /// The offset of the next page, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
}

/// A file inside a skill, given in `field`: relative, inside the skill folder, naming a file.
pub fn check_skill_path<'a>(path: &'a str, field: &str) -> Result<Vec<&'a str>> {
    if path.len() > 4096 {
        return Err(Error::field(
            Code::InvalidArgument,
            field,
            format!("{path:?} is longer than 4096 bytes"),
        ));
    }
    let parts = relpath::segments(path, field, "the skill folder")?;
    if parts.is_empty() {
        return Err(Error::field(
            Code::InvalidArgument,
            field,
            format!("{path:?} names no file"),
        ));
    }
    Ok(parts)
}

impl Workspace {
    fn release(&self) -> Result<()> {
        self.live.lock().expect("live lock").take();
        let mut mounts = self.mounts.lock().expect("mount lock");
        for m in mounts.iter_mut() {
            fuse::unmount(&m.path)
                .map_err(|e| Error::internal(format!("unmounting {}: {e}", m.path.display())))?;
            if let Some(t) = m.thread.take() {
                let _ = t.join();
            }
        }
        mounts.clear();
        Ok(())
    }

    pub fn session_start(&self) -> &[SessionStart] {
        &self.record.session_start
    }

    pub fn generation(&self) -> Arc<Generation> {
        self.merged.generation()
    }

    pub fn mount_path(&self) -> Option<PathBuf> {
        let mounts = self.mounts.lock().expect("mount lock");
        mounts.first().map(|m| m.path.clone())
    }

    fn toolkit_of<'a>(&'a self, index: &'a Index, c: &'a Candidate) -> Option<&'a str> {
        match c.tier {
            Tier::Workspace => self
                .record
                .workspace_skills
                .get(&c.name)
                .map(String::as_str),
            _ => index.source(c).provenance.toolkit.as_deref(),
        }
    }

    fn view<'a>(&'a self, index: &'a Index, c: &'a Candidate) -> SkillView<'a> {
        SkillView {
            name: &c.name,
            description: &c.info.meta.description,
            tier: c.tier,
            toolkit: self.toolkit_of(index, c),
            source: &index.source(c).id,
            digest: c.digest(),
            user_only: c.info.meta.user_only,
            served: None,
            shadowed: None,
        }
    }

    fn skill_json(&self, index: &Index, c: &Candidate) -> Value {
        serde_json::to_value(self.view(index, c)).expect("views serialize")
    }

    /// `skills_list`: every visible skill, or one tier's, with its shadowed candidates.
    pub fn list(&self, tier: Option<Tier>, include_shadowed: bool) -> Value {
        let g = self.generation();
        let index = &g.index;
        let mut skills = Vec::new();
        for r in index.resolutions() {
            let Some(winner) = &r.winner else { continue };
            let shown = match tier {
                None => Some(winner),
                // A tier's own view: its best candidate, served or shadowed.
                Some(t) => std::iter::once(winner)
                    .chain(r.shadowed.iter())
                    .find(|c| c.tier == t),
            };
            let Some(c) = shown else { continue };
            let mut v = self.view(index, c);
            v.served = Some(std::ptr::eq(c, winner));
            if include_shadowed {
                v.shadowed = Some(
                    r.shadowed
                        .iter()
                        .filter(|s| !std::ptr::eq(*s, c))
                        .map(|s| self.view(index, s))
                        .collect(),
                );
            }
            skills.push(v);
        }
        let conflicts: Vec<Value> = index.conflicts().map(|r| index.conflict_json(r)).collect();
        serde_json::to_value(Listing {
            workspace: &self.id,
            generation: g.digest(),
            count: skills.len(),
            skills,
            conflicts,
        })
        .expect("listings serialize")
    }

    /// The folder and digest of a served skill.
    pub fn skill(&self, name: &str) -> Result<(Digest, Option<PathBuf>)> {
        let g = self.generation();
        let c = g.index.winner(name).ok_or_else(|| {
            Error::not_found(format!("workspace {} serves no skill {name:?}", self.id))
                .with_details(json!({ "field": "skill" }))
        })?;
        Ok((c.digest(), self.mount_path().map(|m| m.join(name))))
    }

    /// Reads a page of a skill's file, as the mount serves it (from the store, without going
    /// through the kernel).
    pub fn read(&self, skill: &str, path: &str, offset: u64, length: u64) -> Result<Page> {
        let parts = check_skill_path(path, "path")?;
        self.skill(skill)?;
        let missing = || {
            Error::not_found(format!("skill {skill} has no file {path:?}"))
                .with_details(json!({ "field": "path" }))
        };
        let full: Vec<&str> = std::iter::once(skill)
            .chain(parts.iter().copied())
            .collect();
        let want = length.min(u32::MAX as u64) as u32;
        let (size, bytes) = match self.merged.read_path(&full, offset, want) {
            Ok(Some(found)) => found,
            Ok(None) => return Err(missing()),
            Err(Errno::EISDIR) => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "path",
                    format!("{path:?} is a folder"),
                ))
            }
            Err(Errno::ELOOP) => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "path",
                    format!("{path:?} goes through a symlink loop"),
                ))
            }
            Err(e) => return Err(Error::internal(format!("reading {skill}/{path}: {e}"))),
        };
        let length = bytes.len() as u64;
        let end = offset.saturating_add(length);
        let (encoding, content) = match String::from_utf8(bytes) {
            Ok(text) => ("utf-8", text),
            Err(e) => {
                use base64::Engine;
                (
                    "base64",
                    base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
                )
            }
        };
        Ok(Page {
            skill: skill.to_owned(),
            path: parts.join("/"),
            size,
            offset,
            length,
            encoding,
            content,
            eof: end >= size,
            next_offset: (end < size).then_some(end),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }
}

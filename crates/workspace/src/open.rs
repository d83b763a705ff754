//! Opening a workspace: the request checked, the project cloned, the toolkits acquired and
//! materialized, the tier stack built and mounted, the executor made, the result recorded.

use super::{keys, materialize, record, request, Cleanup, OpenRequest, Record, Workspaces};
use crate::progress::OpenProgress;
use crate::session_start::{self, SessionStart};
use crate::stack::OwnerBundle;
use cloud_harness_control::principal::Principal;
use cloud_harness_control::toolkit::{self, Revision, Scope};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_executor::{self as executor, Executor, Kind, Places};
use cloud_harness_provision::{fetch, Acquired};
use cloud_harness_store::cas::Digest;
use serde_json::{json, Value};
use std::fs;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What an open works from besides the request: its toolkits resolved, where each came from
/// (a set, or the request itself), who asked.
#[derive(Clone, Copy)]
struct Asked<'a> {
    toolkits: &'a [toolkit::Toolkit],
    origins: &'a [Option<Value>],
    /// The principal opening it, who will own it.
    actor: &'a str,
    progress: &'a Arc<OpenProgress>,
}

pub(crate) fn new_id() -> String {
    format!("ws_{}", uuid::Uuid::new_v4().simple())
}

impl Workspaces {
    /// `workspace_open`, by the local user who started the process.
    pub fn open(&self, request: OpenRequest) -> Result<Value> {
        self.open_as(request, &Principal::local())
    }

    /// `workspace_open` asked by `who`, who owns the workspace: their idempotency keys are
    /// theirs alone, and their open workspaces count against their limit.
    pub fn open_as(&self, request: OpenRequest, who: &Principal) -> Result<Value> {
        self.open_watched(request, who, &Arc::default())
    }

    /// [`Workspaces::open_as`], showing its steps in `progress` as it goes; cancelling
    /// `progress` stops it (CANCELLED) with nothing it made kept.
    pub fn open_watched(
        &self,
        request: OpenRequest,
        who: &Principal,
        progress: &Arc<OpenProgress>,
    ) -> Result<Value> {
        let actor = who.name.as_str();
        let key = request.idempotency_key.clone();
        request::check_key(&key)?;
        let registry = cloud_harness_curation::registry::load(&self.db)?;
        let forms = request::digest_forms(&request.toolkits, self.provisioner.hosts(), &registry)?;
        let digest = request::request_digest(&request, &forms);
        // One open per key at a time; the others then find its workspace.
        self.key_locks.with(&format!("{actor}\n{key}"), || {
            // A request seen before is answered before its sets and labels are looked up:
            // they may have changed, or gone, since.
            if self.holding_key(actor, &key).is_none() {
                if let Some(bound) = keys::find(&self.db, actor, &key)? {
                    return self.replay(&key, bound, digest);
                }
            }
            self.open_unbound(&request, &registry, who, progress, digest)
        })
    }

    /// [`Self::open_watched`] of a request whose key is not bound yet: its sets expanded, its
    /// toolkits resolved (labels with their canaries), then opened.
    fn open_unbound(
        &self,
        request: &OpenRequest,
        registry: &cloud_harness_control::presets::registry::Registry,
        who: &Principal,
        progress: &Arc<OpenProgress>,
        digest: Digest,
    ) -> Result<Value> {
        let actor = who.name.as_str();
        // Labels' canaries are chosen by who opens and the key: the same request always
        // lands on the same side.
        let seed = format!("{actor}\n{}", request.idempotency_key);
        let expanded =
            cloud_harness_curation::sets::expand(&self.db, &request.toolkits, Some(&seed))?;
        let mut toolkits = toolkit::resolve_request_seeded(
            &expanded.specs,
            self.provisioner.hosts(),
            registry,
            Some(&seed),
        )?;
        expanded.apply_validation(&mut toolkits);
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
        let asked = Asked {
            toolkits: &toolkits,
            origins: &expanded.origins,
            actor,
            progress,
        };
        self.open_locked(request, &asked, repo_url.as_deref(), digest)
    }

    fn open_locked(
        &self,
        request: &OpenRequest,
        asked: &Asked,
        repo_url: Option<&str>,
        digest: Digest,
    ) -> Result<Value> {
        let key = request.idempotency_key.clone();
        let owner = asked.actor;
        // A workspace being restored holds its key before the database may say so.
        if let Some(holder) = self.holding_key(owner, &key) {
            return Err(holder.key_taken(&key, &digest));
        }
        if let Some(bound) = keys::find(&self.db, owner, &key)? {
            return self.replay(&key, bound, digest);
        }
        // Cancelled already, or the server stopping: no spare taken, no key claimed.
        asked.progress.check()?;
        if self.openings.is_stopping() {
            return Err(crate::progress::stopping());
        }
        // A spare executor, if one is ready, names the workspace: it was made for that id.
        let spare = self.spares.as_ref().and_then(|s| s.take());
        let id = spare.as_ref().map_or_else(new_id, |s| s.id.clone());
        // Listed while it runs, for the API and the dashboard to show, and for a stopping
        // server to wait for (it admits none after it began).
        let listed = self.openings.list(&id, owner, &key, asked.progress.clone());
        let _listed = match listed {
            Ok(listed) => listed,
            Err(e) => {
                if let (Some(spares), Some(spare)) = (&self.spares, spare) {
                    spares.give_back(spare);
                }
                return Err(e);
            }
        };
        let max = cloud_harness_control::limits::quotas().limits.workspaces;
        let claim = keys::claim(&self.db, owner, &key, &digest, &id, max);
        let spare = match (spare, &claim) {
            (Some(spare), Ok(keys::Claim::Claimed)) => Some(spare.executor),
            (Some(spare), _) => {
                if let Some(spares) = &self.spares {
                    spares.give_back(spare);
                }
                None
            }
            (None, _) => None,
        };
        match claim? {
            keys::Claim::Claimed => {}
            keys::Claim::Full => {
                return Err(cloud_harness_control::limits::exceeded(
                    "workspaces",
                    max,
                    Duration::from_secs(60),
                    "too many open workspaces; close one with workspace_close",
                ))
            }
            keys::Claim::Taken => {
                // Another process bound the key between the look and the claim.
                let bound = keys::find(&self.db, owner, &key)?.ok_or_else(|| {
                    Error::internal(format!(
                        "idempotencyKey {key:?} was bound and freed at once"
                    ))
                })?;
                return self.replay(&key, bound, digest);
            }
        }
        cloud_harness_error::failpoint::point("open.claimed");
        // A panic is an error like another: the half-made workspace is removed as it unwinds,
        // and the key and its count against the owner's limit are freed here.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.open_new(request, asked, repo_url, digest, &id, spare)
        }))
        .unwrap_or_else(|_| {
            Err(Error::internal(
                "the open stopped unexpectedly (the server's log says where)",
            ))
        });
        match &opened {
            // Cancelled as it ended: nobody will have its answer, so it is undone.
            Ok(_) if asked.progress.is_cancelled() => {
                if let Err(closing) = self.close(&id) {
                    tracing::error!(workspace = %id, error = %closing, "undoing a cancelled open failed");
                }
                return Err(asked.progress.check().expect_err("it was cancelled"));
            }
            Ok(_) => {
                cloud_harness_error::failpoint::point("open.saved");
                if let Err(e) = keys::opened(&self.db, &id) {
                    // Not served half: an open the database did not record is undone (a
                    // close that cannot finish keeps it as failed, for a second close).
                    if let Err(closing) = self.close(&id) {
                        tracing::error!(workspace = %id, error = %closing, "undoing an open failed");
                    }
                    return Err(e);
                }
            }
            Err(_) => keys::release(&self.db, &id)?,
        }
        cloud_harness_error::failpoint::point("open.recorded");
        opened
    }

    fn open_new(
        &self,
        request: &OpenRequest,
        asked: &Asked,
        repo_url: Option<&str>,
        digest: Digest,
        id: &str,
        spare: Option<Executor>,
    ) -> Result<Value> {
        let Asked {
            toolkits,
            origins,
            actor,
            progress,
        } = *asked;
        // The project's clone, each toolkit, workspace-scope skills, the mounts, the executor.
        progress.plan(u64::from(repo_url.is_some()) + toolkits.len() as u64 + 3);
        let key = request.idempotency_key.clone();
        let id = id.to_owned();
        let dir = record::workspaces_dir(&self.home).join(&id);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        cloud_harness_error::failpoint::point("open.folder_made");
        let mut cleanup = Cleanup {
            dir: Some(dir.clone()),
            executor: spare,
            store: self.store().clone(),
        };
        let places = Places::of(&dir);
        let repo = &places.repo;
        let mut repository = Value::Null;
        match repo_url {
            Some(fetched) => {
                progress.step("cloning the project")?;
                // A project's clone always goes to the network: one of the opener's budget.
                cloud_harness_control::limits::quotas().acquisition(actor)?;
                let started = Instant::now();
                let deadline = started + Duration::from_secs(self.provisioner.limits.max_seconds);
                let commit = fetch::clone_worktree(
                    fetched,
                    &Revision::DefaultHead,
                    &self.provisioner.transport()?,
                    repo,
                    deadline,
                    self.provisioner.project_limits,
                )
                .map_err(|e| self.provisioner.explain(fetched, e, started))?;
                repository = json!({ "url": request.repository_url, "fetchedUrl": fetched, "commit": commit.to_string() });
                progress.advance();
            }
            None => fs::create_dir_all(repo).map_err(|e| Error::io(repo, e))?,
        }

        let mut acquired: Vec<(toolkit::Toolkit, Acquired)> = Vec::new();
        // When each default-head toolkit's head was found (ms).
        let mut resolved_at: Vec<Option<i64>> = Vec::new();
        progress.step("acquiring toolkits")?;
        let all = self.acquire_all(toolkits, actor, &id, progress);
        // A cancel that came during the fetches stops the open here, once they are in the
        // store.
        progress.check()?;
        for (t, a) in toolkits.iter().zip(all?) {
            resolved_at.push(a.resolved_at);
            acquired.push((t.clone(), a.acquired));
        }
        // The trust policy's verdict on each toolkit: one it refuses is acquired (and listed)
        // but serves nothing.
        let mut warnings = Vec::new();
        let verdicts = self.judge_signatures(&acquired, actor, &id, &mut warnings)?;
        let served: Vec<(toolkit::Toolkit, Acquired)> = acquired
            .iter()
            .zip(&verdicts)
            .filter(|(_, v)| v.as_ref().is_none_or(|v| v.served()))
            .map(|(a, _)| a.clone())
            .collect();
        // The overrides for the sets the toolkits came from, and the global ones.
        let sets: Vec<String> = origins
            .iter()
            .flatten()
            .filter_map(|o| o["id"].as_str().map(str::to_owned))
            .collect();
        let overrides =
            cloud_harness_curation::decisions::in_force(&self.db, &self.home)?.overrides_for(&sets);
        progress.step("writing workspace-scope skills")?;
        let (workspace_skills, refused) =
            materialize::workspace_scope(self.store(), repo, &served, &overrides)?;
        progress.advance();
        if matches!(self.executor_kind, Some(Kind::Docker | Kind::Bwrap))
            && nix::unistd::geteuid().is_root()
        {
            materialize::hand_over(repo, self.executors.uid, self.executors.gid)?;
        }
        let owner_bundles = owner_bundles(&served);
        let session_start: Vec<SessionStart> = served
            .iter()
            .filter_map(|(t, a)| {
                let skill = t.session_start_skill.as_deref()?;
                session_start::from_bundle(
                    self.store(),
                    &a.record.bundle,
                    &t.instance_id,
                    skill,
                    t.layout.validation,
                )
            })
            .collect();

        let record = Record {
            id: id.clone(),
            owner: actor.to_owned(),
            idempotency_key: key.clone(),
            request_digest: digest,
            created_at: now_secs(),
            owner_bundles,
            workspace_skills,
            session_start,
            executor: None,
            never_pause: !request.idle_pause,
            result: Value::Null,
        };
        warnings.extend(refused);
        let act = self.activator();
        progress.step("mounting the skills")?;
        let mut ws = act.activate(record, &dir, &overrides, true, &mut warnings)?;
        cloud_harness_error::failpoint::point("open.mounted");
        progress.advance();
        progress.step("making the executor")?;
        if cleanup.executor.is_none() {
            cleanup.executor = act.make_executor(&places, &id)?;
        }
        cloud_harness_error::failpoint::point("open.executor_made");
        progress.advance();
        // The last look: a cancel that came while the executor was made still undoes it all.
        progress.check()?;
        ws.record.executor = cleanup.executor.as_ref().map(|e| e.spec.clone());
        match self.executor_kind {
            None => warnings.push(executor::missing().message),
            Some(Kind::Host) => warnings.push(
                "CLOUD_HARNESS_EXECUTOR=host: scripts run on the host as the server's user, for development only".into(),
            ),
            Some(_) => {}
        }
        ws.executor = cleanup.disarm();
        ws.record.result = self.open_result(&ws, &acquired, &verdicts, repository, warnings);
        // The set (and revision) each toolkit a set brought came from; when the head of each
        // default-head toolkit was found.
        if let Some(listed) = ws.record.result["toolkits"].as_array_mut() {
            for ((t, origin), at) in listed.iter_mut().zip(origins).zip(&resolved_at) {
                if let Some(set) = origin {
                    t["set"] = set.clone();
                }
                if let Some(at) = at {
                    t["resolvedAt"] = json!(at);
                }
            }
        }
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
        let owner = ws.record.owner.clone();
        self.open
            .lock()
            .expect("workspaces lock")
            .insert(id, Arc::new(ws));
        self.catalogue_changed(&owner);
        Ok(result)
    }
}

/// The owner-scope toolkits of an open, as the bundles its owner tier serves.
pub(super) fn owner_bundles(acquired: &[(toolkit::Toolkit, Acquired)]) -> Vec<OwnerBundle> {
    acquired
        .iter()
        .filter(|(t, _)| t.scope == Scope::Owner)
        .map(|(t, a)| OwnerBundle {
            instance_id: t.instance_id.clone(),
            bundle: a.record.bundle,
            url: a.record.key.url.clone(),
            commit: a.record.key.commit.clone(),
            validation: t.layout.validation,
        })
        .collect()
}

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
//!
//! The crate composes provisioning, curation, the skills model, the mount and the executor
//! into workspaces; it knows nothing of the protocols (MCP, HTTP) that call it.

mod acquire;
mod activate;
mod builtin;
mod catalog;
mod discard;
mod failure;
#[cfg(test)]
mod fake_guard;
mod folder_bind;
mod idle;
pub mod imports;
mod keys;
pub mod library;
mod listing;
pub mod session_start;
pub mod stack;
pub use catalog::{FolderEntry, SkillFile};
pub use listing::cursor_name;
pub use pages::ListPage;
mod materialize;
mod mounts;
mod open;
mod open_result;
mod origins;
mod pages;
pub mod pause;
pub mod preview;
pub mod progress;
mod read;
mod readiness;
mod record;
mod replay;
mod request;
mod restore;
mod roots;
mod run;
mod served;
pub mod serving;
mod serving_from;
pub mod set_diff;
mod skill_usage;
mod spares;
mod stop;
mod trust;
pub mod unused_skills;
pub use served::Workspace;

pub use failure::Failure;
pub use read::{check_skill_path, Page, MAX_SKILL_PATH};
pub use record::{workspaces_dir, Record};
pub use request::OpenRequest;
pub use run::blocking;
pub use run::RunRequest;

use cloud_harness_control::keyed_lock::KeyedLock;
use cloud_harness_control::principal::Principal;
use cloud_harness_control::state::Db;
use cloud_harness_error::{Error, Result};
use cloud_harness_executor::{self as executor, Executor, Kind, Places};
use cloud_harness_mount::guard::Guards;
use cloud_harness_provision::Provisioner;
use cloud_harness_store::cas::Store;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use cloud_harness_executor::WORKSPACE_SKILLS;

/// Changes of the catalogue a slow listener may fall behind by before it is told only that
/// something changed.
const CATALOGUE_CHANGES: usize = 256;

pub struct Workspaces {
    home: PathBuf,
    provisioner: Arc<Provisioner>,
    executors: executor::Settings,
    /// The executor backend new workspaces get, if any.
    executor_kind: Option<Kind>,
    open: Arc<Mutex<HashMap<String, Arc<Workspace>>>>,
    /// Workspaces that could not be served again after a restart, with why; each stays until
    /// it is closed (or, restored late, is served).
    failed: Arc<Mutex<HashMap<String, Failure>>>,
    /// How long start-up waits for the workspaces being restored.
    restore_timeout: Duration,
    /// The inotify watches the live tiers of all workspaces share, and what one may hold.
    watches: cloud_harness_mount::watch::Pool,
    watch_budget: cloud_harness_mount::watch::Budget,
    /// The control plane's database: idempotency keys, decisions, the audit log.
    db: Db,
    /// One open per key at a time in this process (the database's unique key guards the
    /// others).
    key_locks: KeyedLock,
    mounting: bool,
    /// The program whose `prewarm` command walks each new mount once (this server's own
    /// binary); without one, mounts stay cold until read.
    prewarm: Option<PathBuf>,
    /// The process (`program mount-guard`, the same program) that detaches the mounts if this
    /// one dies without unmounting them; started at the first mount.
    guards: Option<Arc<cloud_harness_mount::guard::Guards>>,
    /// Sent whenever what the open workspaces serve, together, changes: one opens or closes,
    /// or a live tier changes one.
    catalogue: tokio::sync::broadcast::Sender<Arc<str>>,
    /// Docker executors made ahead of the opens that take them.
    spares: Option<spares::Spares>,
    /// The opens in progress, with how far each is.
    openings: progress::Openings,
    /// This home is served by this process alone: let go of at the end of a shutdown (or
    /// last, when dropped), so a restart in the same process can take it.
    serving: Mutex<Option<serving::Serving>>,
    /// The start-up's restore, still running in the background past its wait maybe.
    restoring: Mutex<Option<restore::Steps>>,
    /// A stop that found opens or restores still running: the home stays locked.
    kept_home: std::sync::atomic::AtomicBool,
    /// Which keys must sign which toolkits' bundles (`CLOUD_HARNESS_TRUST_POLICY`).
    trust: Arc<cloud_harness_control::signatures::policy::Policy>,
    /// The workspaces folder, a mount of its own while this server runs. Last: dropped
    /// after the workspaces, once their mounts are gone.
    folder: folder_bind::FolderBind,
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
            if let Err(e) = cloud_harness_store::removal::remove_tree(&dir) {
                tracing::error!(error = %e, "removing a half-made workspace's folder failed");
            }
        }
    }
}

impl Workspaces {
    /// The workspaces under `home`; those left open by a previous run are mounted again.
    /// Mounts are prewarmed by this program's own binary.
    pub fn new(home: PathBuf, provisioner: Provisioner, mounting: bool) -> Result<Workspaces> {
        let settings = executor::Settings::from_env()?;
        let prewarm = std::env::current_exe().ok();
        Workspaces::build(home, provisioner, mounting, settings, prewarm)
    }

    /// The same, with explicit executor settings, and mounts not prewarmed (a library's
    /// caller, such as a test, is not the `cloud-harness` binary; see [`Self::prewarming`]).
    pub fn with_executors(
        home: PathBuf,
        provisioner: Provisioner,
        mounting: bool,
        executors: executor::Settings,
    ) -> Result<Workspaces> {
        Workspaces::build(home, provisioner, mounting, executors, None)
    }

    /// New mounts from now on are walked once by `program prewarm MOUNTPOINT`, and guarded
    /// by `program mount-guard`.
    pub fn prewarming(mut self, program: PathBuf) -> Workspaces {
        // One made already (by `new`) watches what the restore mounted: it stays.
        if self.guards.is_none() {
            let serving = self.serving.lock().expect("serving lock");
            let guards = guards(program.clone(), serving.as_ref());
            drop(serving);
            self.folder.guard(&guards);
            self.guards = Some(Arc::new(guards));
        }
        self.prewarm = Some(program);
        self
    }

    fn build(
        home: PathBuf,
        provisioner: Provisioner,
        mounting: bool,
        executors: executor::Settings,
        prewarm: Option<PathBuf>,
    ) -> Result<Workspaces> {
        let dir = record::workspaces_dir(&home);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        // Before the sweep: another server's mounts under this home are live.
        let serving = serving::lock(&home)?;
        mounts::sweep(&dir);
        let executor_kind = executors.kind()?;
        let folder =
            folder_bind::FolderBind::make(&dir, mounting && executor_kind == Some(Kind::Bwrap));
        match executor_kind {
            None => tracing::warn!("no executor: install bubblewrap or start a Docker engine; skills_run refuses to run scripts"),
            Some(Kind::Host) => tracing::warn!("CLOUD_HARNESS_EXECUTOR=host: scripts run on the host, for development only"),
            // Found (and said in the log) now, not at the first run.
            Some(Kind::Bwrap) => drop(executor::cgroup::availability()),
            Some(Kind::Docker) => {}
        }
        let db = Db::open(&home)?;
        tracing::info!(
            engine = db.engine(),
            at = db.shown(),
            runner = db.runner(),
            "control-plane database"
        );
        cloud_harness_curation::registry::sync_shipped(&db)?;
        let env = cloud_harness_control::config::env_number;
        let watch_budget = cloud_harness_mount::watch::Budget {
            watches: env(
                "CLOUD_HARNESS_PROJECT_MAX_WATCHES",
                cloud_harness_mount::watch::Budget::default().watches as u64,
            )? as usize,
            ..Default::default()
        };
        let watches = cloud_harness_mount::watch::Pool::new(env(
            "CLOUD_HARNESS_PROJECT_MAX_WATCHES_TOTAL",
            cloud_harness_mount::watch::Pool::system_default() as u64,
        )? as usize);
        let restore_timeout = Duration::from_secs(env(
            "CLOUD_HARNESS_RESTORE_TIMEOUT",
            restore::TIMEOUT.as_secs(),
        )?);
        let trust = Arc::new(cloud_harness_control::signatures::policy::Policy::from_env()?);
        let ws = Workspaces {
            trust,
            home,
            provisioner: Arc::new(provisioner),
            executors,
            executor_kind,
            open: Arc::default(),
            failed: Arc::default(),
            restore_timeout,
            watches,
            watch_budget,
            db,
            key_locks: KeyedLock::default(),
            mounting,
            guards: prewarm.clone().map(|p| Arc::new(guards(p, Some(&serving)))),
            prewarm,
            catalogue: tokio::sync::broadcast::channel(CATALOGUE_CHANGES).0,
            spares: None,
            openings: Default::default(),
            serving: Mutex::new(Some(serving)),
            restoring: Mutex::default(),
            kept_home: Default::default(),
            folder,
        };
        if let Some(guards) = &ws.guards {
            ws.folder.guard(guards);
        }
        // Restoring first: it removes the folders of opens that never finished, spares of a
        // killed server among them, before any new spare is made.
        ws.restore();
        let mut ws = ws;
        let want = ws.executors.spares_for(ws.executor_kind);
        if want > 0 {
            let spares = spares::Spares::new(want, ws.activator(), ws.home.clone());
            spares.refill();
            ws.spares = Some(spares);
        }
        Ok(ws)
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// How many spare executors are ready for the next opens.
    pub fn spare_executors(&self) -> usize {
        self.spares.as_ref().map_or(0, |s| s.ready())
    }

    /// Removes the spare executors (a stopping server's); opens make their own after.
    pub fn stop_spares(&self) {
        if let Some(spares) = &self.spares {
            spares.stop();
        }
    }

    /// The trust policy opens are checked against.
    pub fn trust(&self) -> &cloud_harness_control::signatures::policy::Policy {
        &self.trust
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The hosts toolkits may come from.
    pub fn hosts(&self) -> &cloud_harness_control::hosts::HostPolicy {
        self.provisioner.hosts()
    }

    pub fn provisioner(&self) -> &Provisioner {
        &self.provisioner
    }

    pub fn store(&self) -> &Store {
        &self.provisioner.store
    }

    /// The kind of executor new workspaces get (none: scripts cannot run).
    pub fn executor_kind(&self) -> Option<Kind> {
        self.executor_kind
    }

    /// Whether executors get their whole-executor limits: nothing to say, or a note
    /// (bubblewrap without a cgroup: its runs refused, or allowed with rlimits only).
    pub fn executor_limits(&self) -> Option<String> {
        match self.executor_kind {
            Some(Kind::Bwrap) => executor::cgroup::availability().status(),
            _ => None,
        }
    }

    /// Where fetches run: the mode, the engine and its warnings (asking the engine once).
    pub fn provisioning(&self) -> Value {
        self.provisioner.provisioning()
    }

    /// Each change of what the open workspaces serve, together.
    /// Each carries the owner of the workspace that changed, so a listener is told only of
    /// what it reaches; one that falls behind is told something changed.
    pub fn catalogue_changes(&self) -> tokio::sync::broadcast::Receiver<Arc<str>> {
        self.catalogue.subscribe()
    }

    /// Tells listeners that what a workspace of `owner` serves changed.
    pub(crate) fn catalogue_changed(&self, owner: &str) {
        let _ = self.catalogue.send(Arc::from(owner));
    }

    /// The open workspaces, in id order.
    pub fn open_workspaces(&self) -> Vec<Arc<Workspace>> {
        let mut open: Vec<Arc<Workspace>> = self
            .open
            .lock()
            .expect("open lock")
            .values()
            .cloned()
            .collect();
        open.sort_by(|a, b| a.id.cmp(&b.id));
        open
    }

    /// The open workspace `id`, whoever owns it (the server's own use; callers go through
    /// [`Workspaces::get_as`]).
    pub fn get(&self, id: &str) -> Result<Arc<Workspace>> {
        let open = self.open.lock().expect("workspaces lock").get(id).cloned();
        open.ok_or_else(|| match self.failure(id) {
            Some(failed) => failed.error(),
            None => record::not_found(id),
        })
    }

    /// The open workspace `id` if `who` may reach it: NOT_FOUND otherwise, as for an id that
    /// names nothing (a client learns nothing of others' workspaces). An operator's `action`
    /// on another principal's workspace is audited with both names.
    pub fn get_as(&self, who: &Principal, id: &str, action: &str) -> Result<Arc<Workspace>> {
        let open = self.open.lock().expect("workspaces lock").get(id).cloned();
        let Some(ws) = open else {
            // One a restart could not serve again says why, to those who reach it only (one
            // look: a restore ending between two looks must not tell a stranger).
            return Err(match self.failure(id) {
                Some(f) if who.reaches(f.owner()) => f.error(),
                _ => record::not_found(id),
            });
        };
        if !who.reaches(ws.owner()) {
            return Err(record::not_found(id));
        }
        if ws.owner() != who.name {
            cloud_harness_control::audit::access(&self.db, &who.name, ws.owner(), id, action);
        }
        self.used(&ws)?;
        Ok(ws)
    }

    /// The open workspaces `who` may reach, in id order.
    pub fn open_workspaces_of(&self, who: &Principal) -> Vec<Arc<Workspace>> {
        let mut open = self.open_workspaces();
        open.retain(|w| who.reaches(w.owner()));
        open
    }

    /// The opens in progress that `who` reaches, each with its step and counts.
    pub fn opening_of(&self, who: &Principal) -> Vec<Value> {
        self.openings.of(who)
    }

    /// How many workspaces `who` has open now.
    pub fn open_count_of(&self, who: &str) -> u64 {
        let open = self.open.lock().expect("workspaces lock");
        open.values().filter(|w| w.owner() == who).count() as u64
    }

    /// `workspace_close` asked by `who`: NOT_FOUND for a workspace they may not reach.
    pub fn close_as(&self, who: &Principal, id: &str) -> Result<Value> {
        let owner = match (self.get(id), self.failure(id)) {
            (Ok(ws), _) => ws.owner().to_owned(),
            // One a restart could not serve again: its record, if it could be read, says whose.
            (Err(_), Some(f)) => f.owner().to_owned(),
            (Err(e), None) => return Err(e),
        };
        if !who.reaches(&owner) {
            return Err(record::not_found(id));
        }
        if owner != who.name {
            cloud_harness_control::audit::access(
                &self.db,
                &who.name,
                &owner,
                id,
                "workspace_close",
            );
        }
        self.close(id)
    }

    /// `workspace_close`: kills its runs, removes its executor, unmounts, forgets the key,
    /// removes the working tree. The store keeps the bundles.
    pub fn close(&self, id: &str) -> Result<Value> {
        let ws = match self.get(id) {
            Ok(ws) => ws,
            Err(_) if self.failure(id).is_some() => return self.discard(id),
            Err(e) => return self.discard(id).map_err(|_| e),
        };
        // No pause or resume from now on (a resume under way ends first).
        let closing = ws.closing();
        ws.runs.cancel();
        ws.wait_for_runs(Duration::from_secs(10));
        if let Some(e) = &ws.executor {
            e.remove()?;
        }
        ws.release()?;
        drop(closing);
        mounts::unshare(&ws.places.mounts);
        roots::unpin(self.store(), id)?;
        self.open.lock().expect("workspaces lock").remove(id);
        self.catalogue_changed(ws.owner());
        let finished = cloud_harness_store::removal::remove_tree(&ws.dir)
            .map_err(|e| Error::io(&ws.dir, e))
            .and_then(|()| keys::release(&self.db, id));
        if let Err(e) = finished {
            // Still on disk and still counted against its owner: kept as a failure, so its
            // owner sees it and a second close finishes the work.
            let reason = failure::without_host_paths(&e, &ws.dir, &self.home, self.store().root());
            let failure = Failure {
                id: id.to_owned(),
                reason,
                restoring: false,
                closing: true,
                record: Some(ws.record.clone()),
            };
            self.failed
                .lock()
                .expect("failed lock")
                .insert(id.to_owned(), failure);
            return Err(e);
        }
        Ok(json!({ "workspace": id, "closed": true }))
    }
}

/// The unmount guards of a server holding `serving`: each keeps the home locked until it has
/// detached a dead server's mounts (the next server must not mount where it still does).
fn guards(program: PathBuf, serving: Option<&serving::Serving>) -> Guards {
    let guards = Guards::new(program);
    match serving.map(serving::Serving::copy) {
        Some(Ok(file)) => guards.holding(file),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "the unmount guard cannot hold the home's lock");
            guards
        }
        None => guards,
    }
}

/// Whether the merged skills view of a workspace's places is mounted (by a running server).
pub fn is_mounted(places: &Places) -> bool {
    mounts::is_mount_point(&places.mounts.join(mounts::SKILLS))
}

//! Making a workspace live from its record: its tier stack built and mounted, its live tiers
//! watched, its executor made. Shared by a new open and by the restore at start-up, which does
//! it on threads of its own (so what it needs of the server is owned here).

use super::{mounts, roots, Record, Workspace, Workspaces, WORKSPACE_SKILLS};
use crate::origins::Origins;
use crate::skill_usage;
use crate::stack::{OwnerBundle, TierInputs};
use crate::trust;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_executor::{self as executor, Executor, Kind, Places};
use cloud_harness_mount::live::{LiveTiers, Watch};
use cloud_harness_mount::watch::{Budget, Pool};
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::generation::{Generation, View};
use cloud_harness_skills::namespace::Namespace;
use cloud_harness_skills::resolver::{Override, Tier};
use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// What making a workspace live needs of the server, owned: a workspace restored at
/// start-up is made live on a thread of its own, which may outlive the start-up.
#[derive(Clone)]
pub(super) struct Activator {
    pub(super) provisioner: Arc<cloud_harness_provision::Provisioner>,
    pub(super) executors: executor::Settings,
    pub(super) executor_kind: Option<Kind>,
    pub(super) db: cloud_harness_control::state::Db,
    pub(super) mounting: bool,
    pub(super) prewarm: Option<std::path::PathBuf>,
    pub(super) guards: Option<Arc<cloud_harness_mount::guard::Guards>>,
    pub(super) catalogue: tokio::sync::broadcast::Sender<Arc<str>>,
    pub(super) watches: Pool,
    pub(super) watch_budget: Budget,
    pub(super) trust: Arc<cloud_harness_control::signatures::policy::Policy>,
}

impl Workspaces {
    pub(super) fn activator(&self) -> Activator {
        Activator {
            provisioner: self.provisioner.clone(),
            executors: self.executors.clone(),
            executor_kind: self.executor_kind,
            db: self.db.clone(),
            mounting: self.mounting,
            prewarm: self.prewarm.clone(),
            guards: self.guards.clone(),
            catalogue: self.catalogue.clone(),
            watches: self.watches.clone(),
            watch_budget: self.watch_budget,
            trust: self.trust.clone(),
        }
    }
}

impl Activator {
    fn store(&self) -> &cloud_harness_store::cas::Store {
        &self.provisioner.store
    }

    pub(super) fn make_executor(&self, places: &Places, id: &str) -> Result<Option<Executor>> {
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
                cloud_harness_control::hosts::HostPolicy::new(&self.executors.allowed_hosts, "")?;
            let env = self.provisioner.egress.with_hosts(hosts).proxy_env();
            Ok(executor::docker::EgressProxy { image, env })
        };
        let made = Executor::create(&self.executors, kind, places, id, egress_proxy)?;
        cloud_harness_control::metrics::executor_started(kind.as_str());
        Ok(Some(self.equip(made)?))
    }

    /// `executor`, given the egress policy a bubblewrap sandbox's proxy applies when its
    /// network is `egress` (a new executor's, or one a record names after a restart).
    pub(super) fn equip(&self, executor: Executor) -> Result<Executor> {
        if executor.spec.network != executor::Network::Egress {
            return Ok(executor);
        }
        let hosts =
            cloud_harness_control::hosts::HostPolicy::new(&self.executors.allowed_hosts, "")?;
        Ok(executor.with_egress(self.provisioner.egress.with_hosts(hosts)))
    }

    /// Builds a workspace's stack from its record and mounts it. A new workspace
    /// (`reject_conflicts`) is refused on an unsettled conflict; a restored one is served as
    /// it stands.
    pub(super) fn activate(
        &self,
        record: Record,
        dir: &Path,
        overrides: &[Override],
        reject_conflicts: bool,
        warnings: &mut Vec<String>,
    ) -> Result<Workspace> {
        let places = Places::of(dir);
        let (watch, cache, generation) = self.watch_stack(&record, &places, overrides, warnings)?;
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
        // A new generation of the merged view is announced to those watching the workspace.
        let (changes, _) = tokio::sync::watch::channel(merged.generation().digest());
        let origins = Arc::new(Origins::default());
        let served = Served {
            record: &record,
            places: &places,
            merged: &merged,
            owner: &owner,
            changes: &changes,
            origins: &origins,
        };
        let (mounted, live) = self.serve(&served, watch, cache, warnings)?;
        Ok(Workspace {
            id: record.id.clone(),
            dir: dir.to_path_buf(),
            places,
            record,
            store,
            merged,
            owner_view: owner,
            mounts: Mutex::new(mounted),
            live: Mutex::new(Some(live)),
            executor: None,
            runs: CancellationToken::new(),
            running: Arc::default(),
            changes,
            pages: Default::default(),
            origins,
            db: self.db.clone(),
            idle: Default::default(),
        })
    }

    /// The workspace's tier stack, watched where it is live, and its generation now.
    pub(super) fn watch_stack(
        &self,
        record: &Record,
        places: &Places,
        overrides: &[Override],
        warnings: &mut Vec<String>,
    ) -> Result<(Watch, SkillCache, Arc<Generation>)> {
        let cache = SkillCache::default();
        let owner_bundles =
            trust::served_owner_bundles(&self.db, &self.trust, &record.owner_bundles, warnings)?;
        let watch = LiveTiers::watch(
            stack_inputs(owner_bundles, &places.repo, overrides).stack(self.store(), &cache)?,
            &self.watches,
            self.watch_budget,
        )
        .map_err(|e| Error::internal(format!("watching the workspace's folders: {e}")))?;
        warnings.extend(watch.warnings().iter().cloned());
        let generation = Arc::new(watch.spec().generation(self.store(), &cache)?);
        Ok((watch, cache, generation))
    }

    /// Mounts the workspace's views and starts its live tiers: at its open, and again when it
    /// resumes from a pause.
    pub(super) fn serve(
        &self,
        ws: &Served<'_>,
        watch: Watch,
        cache: SkillCache,
        warnings: &mut Vec<String>,
    ) -> Result<(Vec<mounts::Mounted>, LiveTiers)> {
        let (mounted, mut targets) = if self.mounting {
            // Where usage is counted, each view tells of its files' loads.
            let loads = |ns: &Arc<Namespace>| {
                let (id, owner) = (&ws.record.id, &ws.record.owner);
                cloud_harness_control::skill_usage::enabled()
                    .then(|| skill_usage::loads(id, owner, ns.clone(), ws.origins.clone()))
            };
            mounts::mount(
                &ws.places.mounts,
                ws.merged.clone(),
                ws.owner.clone(),
                [loads(ws.merged), loads(ws.owner)],
                self.prewarm.as_deref(),
                self.guards.as_ref(),
                warnings,
            )?
        } else {
            (
                Vec::new(),
                mounts::unmounted(ws.merged.clone(), ws.owner.clone()),
            )
        };
        if let Some((ns, invalidate)) = targets.first_mut().map(|t| (t.0.clone(), &mut t.1)) {
            let inner = std::mem::replace(invalidate, Box::new(|_: &[_]| {}));
            let (changes, catalogue) = (ws.changes.clone(), self.catalogue.clone());
            let owner: Arc<str> = Arc::from(ws.record.owner.as_str());
            *invalidate = Box::new(move |items: &[_]| {
                inner(items);
                let now = ns.generation().digest();
                if changes.send_if_modified(|seen| std::mem::replace(seen, now) != now) {
                    let _ = catalogue.send(owner.clone());
                }
            });
        }
        // Each new generation of a live tier is rooted as soon as it is served.
        let store = self.store().clone();
        if let Some((ns, invalidate)) = targets.pop() {
            let (pinned, pin_store, id) = (ns.clone(), store.clone(), ws.record.id.clone());
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
        Ok((mounted, watch.start(store, Arc::new(cache), targets)))
    }
}

/// What [`Activator::serve`] serves of a workspace.
pub(super) struct Served<'a> {
    pub(super) record: &'a Record,
    pub(super) places: &'a Places,
    pub(super) merged: &'a Arc<Namespace>,
    pub(super) owner: &'a Arc<Namespace>,
    pub(super) changes: &'a tokio::sync::watch::Sender<cloud_harness_store::cas::Digest>,
    /// What the mounts' loads name (`skill_usage`).
    pub(super) origins: &'a Arc<Origins>,
}

/// The tier stack of a workspace: built-in, its owner bundles, the workspace-scope folder
/// and the project's own skills, with the operator's overrides.
fn stack_inputs(
    owner_bundles: Vec<OwnerBundle>,
    repo: &Path,
    overrides: &[Override],
) -> TierInputs {
    let ws_dir = repo.join(WORKSPACE_SKILLS);
    TierInputs {
        builtin: true,
        owner_bundles,
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

//! Serving workspaces again after a restart. The workspaces left open are restored in the
//! background on a bounded pool of threads, and start-up waits for them at most
//! `CLOUD_HARNESS_RESTORE_TIMEOUT` (the database and the container engine included): one that
//! fails (its project now leads outside itself, its record is unreadable, its key cannot be
//! bound, a panic) or does not finish in time never keeps the server from starting. It is
//! kept as a [`Failure`] with its reason — calls on it say so, the API lists it — until it is
//! closed; one that finishes late is served then.

use super::activate::Activator;
use super::failure::{without_host_paths, Failure};
use super::{keys, mounts, record, roots, Cleanup, Record, Workspace, Workspaces};
use cloud_harness_error::{Error, Result};
use cloud_harness_executor::{self as executor, Executor, Kind, Places};
use cloud_harness_skills::resolver::Override;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long start-up waits for restores, unless `CLOUD_HARNESS_RESTORE_TIMEOUT` says.
pub(super) const TIMEOUT: Duration = Duration::from_secs(30);

/// Restore threads at once, at most: more workspaces wait for one of them.
const THREADS: usize = 8;

/// A workspace to serve again: its record, read at start-up.
struct Job {
    record: Record,
    dir: PathBuf,
}

/// What the restores share, and report to.
#[derive(Clone)]
struct Shared {
    act: Activator,
    open: Arc<Mutex<HashMap<String, Arc<Workspace>>>>,
    failed: Arc<Mutex<HashMap<String, Failure>>>,
    /// Steps of the start-up ended (a restore served, failed, or dropped as closed meanwhile;
    /// a half-made workspace removed; the stale keys freed), and a bell for each.
    ended: Arc<(Mutex<usize>, Condvar)>,
    home: PathBuf,
}

/// The steps of a start-up's restore, for whoever waits for them to end.
pub(crate) struct Steps {
    ended: Arc<(Mutex<usize>, Condvar)>,
    started: usize,
}

impl Steps {
    /// Waits until every step has ended, or `deadline`. Whether every one has.
    pub(crate) fn end_by(&self, deadline: Instant) -> bool {
        let (count, bell) = &*self.ended;
        let mut done = count.lock().expect("restore count lock");
        while *done < self.started {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            done = bell.wait_timeout(done, left).expect("restore count lock").0;
        }
        true
    }
}

impl Workspaces {
    /// Serves again the workspaces left open by a previous run and removes what opens cut
    /// short left; returns when all that is done, or at the restore timeout, whichever is
    /// first.
    ///
    /// Itself it reads only the workspaces' folders and records: each found is `restoring`
    /// from then on, and holds its idempotency key (see [`Workspaces::holding_key`]) until it
    /// is served, fails or is closed. Everything that may wait — the database (the
    /// operator's decisions, each key adopted), the container engine and removals of
    /// half-made workspaces, the restores themselves on at most [`THREADS`] threads — runs in
    /// the background, so a locked database or a slow engine never holds the start past its
    /// timeout; what is not done by then goes on.
    pub(super) fn restore(&self) {
        let deadline = Instant::now()
            .checked_add(self.restore_timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        let Ok(entries) = fs::read_dir(record::workspaces_dir(&self.home)) else {
            return;
        };
        let started_ms = cloud_harness_control::state::now_ms();
        let mut jobs = Vec::new();
        let mut half_made = Vec::new();
        let mut on_disk = HashSet::new();
        for entry in entries.flatten() {
            let dir = entry.path();
            if !record::record_path(&dir).is_file() {
                // A workspace whose open was cut short (the server killed before its record
                // was written): nothing of it may stay.
                half_made.push(dir);
                continue;
            }
            let Some(id) = dir
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| record::check_id(n).is_ok())
                .map(str::to_owned)
            else {
                tracing::warn!(folder = %dir.display(), "not a workspace's folder; left alone");
                continue;
            };
            on_disk.insert(id.clone());
            let record = match Record::load(&dir) {
                Ok(r) if r.id == id => r,
                Ok(r) => {
                    tracing::error!(workspace = %id, names = %r.id, "a workspace record names another workspace");
                    self.fail(&id, None, "its record names another workspace".into());
                    continue;
                }
                Err(e) => {
                    tracing::error!(workspace = %id, error = %e, "unreadable workspace record");
                    self.fail(&id, None, "its record cannot be read".into());
                    continue;
                }
            };
            self.failed.lock().expect("failed lock").insert(
                id.clone(),
                Failure {
                    id: id.clone(),
                    reason: "it is being restored".into(),
                    restoring: true,
                    closing: false,
                    record: Some(record.clone()),
                },
            );
            jobs.push(Job { record, dir });
        }
        let shared = Shared {
            act: self.activator(),
            open: self.open.clone(),
            failed: self.failed.clone(),
            ended: Arc::new((Mutex::new(0usize), Condvar::new())),
            home: self.home.clone(),
        };
        // Each restore, each half-made workspace's removal, and the keys freed, all rung.
        let started = jobs.len() + half_made.len() + 1;
        let background = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("restore".into())
            .spawn(move || background.run(jobs, half_made, on_disk, started_ms));
        if let Err(e) = spawned {
            let why = format!("no thread to restore it on ({e})");
            for f in self
                .failed
                .lock()
                .expect("failed lock")
                .values_mut()
                .filter(|f| f.restoring)
            {
                f.reason = why.clone();
                f.restoring = false;
            }
            return;
        }
        let steps = Steps {
            ended: shared.ended.clone(),
            started,
        };
        steps.end_by(deadline);
        // A stopping server waits for what is still running (see `Workspaces::shutdown`).
        *self.restoring.lock().expect("restoring lock") = Some(steps);
        for f in self
            .failed
            .lock()
            .expect("failed lock")
            .values_mut()
            .filter(|f| f.restoring)
        {
            f.reason = format!(
                "it did not finish within {} s (CLOUD_HARNESS_RESTORE_TIMEOUT)",
                self.restore_timeout.as_secs()
            );
            tracing::error!(workspace = %f.id, seconds = self.restore_timeout.as_secs(), "a workspace is still being restored; the server starts without it, and serves it if its restore ends well");
        }
    }

    /// The workspace not served (being restored, or its restore failed) that holds `owner`'s
    /// idempotency `key`: an open with it gets that workspace's answer, never a second
    /// workspace, even before the database says whose the key is.
    pub(super) fn holding_key(&self, owner: &str, key: &str) -> Option<Failure> {
        self.failed
            .lock()
            .expect("failed lock")
            .values()
            .find(|f| {
                f.record
                    .as_ref()
                    .is_some_and(|r| r.owner == owner && r.idempotency_key == key)
            })
            .cloned()
    }

    /// Keeps `id` as failed, with why.
    fn fail(&self, id: &str, record: Option<Record>, reason: String) {
        self.failed.lock().expect("failed lock").insert(
            id.to_owned(),
            Failure {
                id: id.to_owned(),
                reason,
                restoring: false,
                closing: false,
                record,
            },
        );
    }

    /// The workspace `id`, if it could not be served again after the last restart.
    pub fn failure(&self, id: &str) -> Option<Failure> {
        self.failed.lock().expect("failed lock").get(id).cloned()
    }

    /// Every workspace that could not be served again after the last restart, in id order.
    pub fn failures(&self) -> Vec<Failure> {
        let mut all: Vec<Failure> = self
            .failed
            .lock()
            .expect("failed lock")
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }
}

impl Shared {
    /// The background of a start-up's restores: reads the operator's decisions, restores the
    /// `jobs` on at most [`THREADS`] threads, and meanwhile removes what half-made workspaces
    /// left and frees the keys of workspaces no longer on disk (rows made before `started_ms`
    /// only: an open since then is not touched).
    fn run(
        self,
        jobs: Vec<Job>,
        half_made: Vec<PathBuf>,
        on_disk: HashSet<String>,
        started_ms: i64,
    ) {
        let decisions = cloud_harness_curation::decisions::in_force(&self.act.db, &self.home);
        if let Err(e) = &decisions {
            tracing::error!(error = %e, "cannot read the operator's decisions: no workspace restored");
        }
        let decisions = Arc::new(decisions.ok());
        let queue = Arc::new(Mutex::new(std::collections::VecDeque::from(jobs)));
        let threads = THREADS.min(queue.lock().expect("restore queue lock").len());
        let mut workers = Vec::new();
        for n in 0..threads {
            let (shared, queue, decisions) = (self.clone(), queue.clone(), decisions.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("restore-{n}"))
                .spawn(move || loop {
                    let job = queue.lock().expect("restore queue lock").pop_front();
                    let Some(job) = job else { return };
                    shared.restore(job, decisions.as_ref().as_ref());
                });
            match spawned {
                Ok(w) => workers.push(w),
                Err(e) => tracing::error!(error = %e, "no thread for a restore"),
            }
        }
        if workers.is_empty() {
            // No thread at all: each workspace says so.
            let left: Vec<Job> = queue
                .lock()
                .expect("restore queue lock")
                .drain(..)
                .collect();
            for job in left {
                self.failed_with(
                    &job.record.id,
                    Error::internal("no thread to restore it on"),
                    &job.dir,
                );
            }
        }
        for dir in half_made {
            sweep(&self.act, &dir);
            self.ring();
        }
        for id in keys::mine(&self.act.db).unwrap_or_default() {
            if !on_disk.contains(&id) {
                if let Err(e) = keys::release_stale(&self.act.db, &id, started_ms) {
                    tracing::error!(workspace = %id, error = %e, "cannot free the key of a half-made workspace");
                }
            }
        }
        self.ring();
        for w in workers {
            let _ = w.join();
        }
    }

    /// Whether `id` is still to be restored (not closed meanwhile).
    fn wanted(&self, id: &str) -> bool {
        self.failed
            .lock()
            .expect("failed lock")
            .get(id)
            .is_some_and(|f| f.restoring)
    }

    /// Restores one workspace and reports how it went. Its key is adopted first: bound to it
    /// in the database before it is served.
    fn restore(&self, job: Job, decisions: Option<&cloud_harness_curation::decisions::InForce>) {
        let Job { record, dir } = job;
        let (id, owner) = (record.id.clone(), record.owner.clone());
        if !self.wanted(&id) {
            self.failed_with(&id, Error::internal("closed meanwhile"), &dir);
            return;
        }
        let Some(decisions) = decisions else {
            let e = Error::internal("the operator's decisions cannot be read");
            self.failed_with(&id, e, &dir);
            return;
        };
        let overrides = decisions.overrides_for(&record.sets());
        let adopted = keys::adopt(
            &self.act.db,
            &id,
            &record.owner,
            &record.idempotency_key,
            &record.request_digest,
            record.created_at,
        );
        let outcome = adopted.and_then(|()| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                restore_one(&self.act, record, &dir, &overrides)
            }))
            .unwrap_or_else(|_| {
                Err(Error::internal(
                    "its restore stopped unexpectedly (the server's log says where)",
                ))
            })
        });
        match outcome {
            Ok(ws) => {
                let mut failed = self.failed.lock().expect("failed lock");
                // Closed meanwhile (after start-up gave up waiting): nothing of it may stay.
                if failed.get(&id).is_some_and(|f| f.restoring) {
                    // Served before it stops being a failure: a call in between finds it.
                    self.open
                        .lock()
                        .expect("workspaces lock")
                        .insert(id.clone(), Arc::new(ws));
                    failed.remove(&id);
                    drop(failed);
                    let _ = self.act.catalogue.send(Arc::from(owner.as_str()));
                    tracing::info!(workspace = %id, "workspace restored");
                } else {
                    drop(failed);
                    tracing::warn!(workspace = %id, "a workspace closed while it was being restored is removed");
                    undo(&self.act, ws);
                }
                self.ring();
            }
            Err(e) => self.failed_with(&id, e, &dir),
        }
    }

    /// A restore of `id` ends without serving it: kept as failed with why, unless it was
    /// closed meanwhile (then its key, which the restore may have bound again, is freed).
    fn failed_with(&self, id: &str, e: Error, dir: &Path) {
        let kept = match self
            .failed
            .lock()
            .expect("failed lock")
            .get_mut(id)
            .filter(|f| f.restoring)
        {
            Some(f) => {
                tracing::error!(workspace = %id, error = %e, "cannot restore workspace");
                f.reason =
                    without_host_paths(&e, dir, &self.home, self.act.provisioner.store.root());
                f.restoring = false;
                true
            }
            None => false,
        };
        if !kept {
            let _ = keys::release(&self.act.db, id);
        }
        self.ring();
    }

    fn ring(&self) {
        let (count, bell) = &*self.ended;
        *count.lock().expect("restore count lock") += 1;
        bell.notify_all();
    }
}

/// Removes a half-made workspace found at start-up: its container (found by its label), its
/// mounts, its roots and its folder.
fn sweep(act: &Activator, dir: &Path) {
    let Some(id) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
        return;
    };
    if record::check_id(&id).is_err() {
        return;
    }
    tracing::warn!(workspace = %id, "removing a workspace whose open never finished");
    if act.executor_kind == Some(Kind::Docker) {
        if let Err(e) = executor::docker::remove_by_dir(dir) {
            tracing::error!(workspace = %id, error = %e, "cannot remove its container");
        }
    }
    drop(Cleanup {
        dir: Some(dir.to_path_buf()),
        executor: None,
        store: act.provisioner.store.clone(),
    });
}

/// Serves the workspace of `record` again: its executor attached, its tiers built and
/// mounted.
fn restore_one(
    act: &Activator,
    record: Record,
    dir: &Path,
    overrides: &[Override],
) -> Result<Workspace> {
    let id = record.id.clone();
    let places = Places::of(dir);
    // The container (if any) lives on; a record from before executors gets one now.
    let executor = match record.executor.clone() {
        Some(spec) => Some(act.equip(Executor::attach(spec, places.clone(), &id))?),
        None => act.make_executor(&places, &id).ok().flatten(),
    };
    let mut warnings = Vec::new();
    let mut ws = act.activate(record, dir, overrides, false, &mut warnings)?;
    for warning in warnings {
        tracing::warn!(workspace = %id, "{warning}");
    }
    ws.executor = executor;
    Ok(ws)
}

/// Removes a workspace restored after it was closed.
fn undo(act: &Activator, ws: Workspace) {
    if let Some(e) = &ws.executor {
        let _ = e.remove();
    }
    let _ = ws.release();
    mounts::unshare(&ws.places.mounts);
    let _ = roots::unpin(&act.provisioner.store, &ws.id);
    let _ = cloud_harness_store::removal::remove_tree(&ws.dir);
    let _ = keys::release(&act.db, &ws.id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OpenRequest;
    use cloud_harness_control::hosts::HostPolicy;
    use cloud_harness_control::principal::Principal;
    use cloud_harness_executor::{Choice, Settings};
    use cloud_harness_provision::{egress::EgressPolicy, fetch::Transport, Provisioner};
    use cloud_harness_store::cas::{Digest, Store};
    use serde_json::json;

    fn workspaces(tmp: &Path) -> Workspaces {
        let store = Store::open(tmp.join("store")).unwrap();
        let transport = Transport {
            extra_ca: None,
            proxy: None,
            timeout: None,
        };
        let hosts = HostPolicy::new("", "").unwrap();
        let provisioner = Provisioner::new(
            store,
            transport,
            Default::default(),
            EgressPolicy::new(hosts, "", "").unwrap(),
        );
        let mut settings = Settings::with_kind(Kind::Host);
        settings.choice = Choice::Off;
        Workspaces::with_executors(tmp.join("home"), provisioner, false, settings).unwrap()
    }

    /// A workspace left open by a previous run: its record and an empty working tree.
    fn left_open(home: &Path, owner: &str, key: &str) -> String {
        let id = format!("ws_{}", &Digest::of(key.as_bytes()).hex()[..32]);
        let dir = record::workspaces_dir(home).join(&id);
        fs::create_dir_all(dir.join("repo")).unwrap();
        Record {
            id: id.clone(),
            owner: owner.into(),
            idempotency_key: key.into(),
            request_digest: Digest::of(b"the request it was opened with"),
            created_at: 1,
            owner_bundles: Vec::new(),
            workspace_skills: Default::default(),
            session_start: Vec::new(),
            executor: None,
            never_pause: false,
            result: json!({ "workspace": id }),
        }
        .save(&dir)
        .unwrap();
        id
    }

    fn waited_for(what: &str, mut probe: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !probe() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Threads of this process named `name` or `name-<n>` (not the test's own thread, whose
    /// name is the test's path and may start the same).
    fn threads(name: &str) -> usize {
        fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                fs::read_to_string(t.path().join("comm")).is_ok_and(|n| {
                    let n = n.trim_end();
                    n == name
                        || n.strip_prefix(name)
                            .is_some_and(|rest| rest.starts_with('-'))
                })
            })
            .count()
    }

    /// The database held locked by another process while the workspaces are restored: the
    /// start-up returns at its timeout with the workspaces `restoring` (not failed after the
    /// database's own wait), on at most [`THREADS`] threads; an open with a key of theirs
    /// makes no second workspace, and they are served once the lock is let go.
    #[test]
    fn a_locked_database_holds_neither_the_start_nor_a_key() {
        let tmp = tempfile::tempdir().unwrap();
        let mut ws = workspaces(tmp.path());
        ws.restore_timeout = Duration::from_millis(300);
        let owner = Principal::local().name;
        let all: Vec<String> = (0..THREADS + 4)
            .map(|n| left_open(&ws.home, &owner, &format!("k{n}")))
            .collect();
        let id = all[0].clone();

        let lock = rusqlite::Connection::open(ws.home.join("state.db")).unwrap();
        lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
        ws.restore();
        for each in &all {
            let f = ws.failure(each).expect("not served yet");
            assert!(f.restoring, "{f:?}");
            assert!(
                f.reason.contains("did not finish within 0 s"),
                "{}",
                f.reason
            );
        }
        // The pool's threads and the one that leads them, each waiting for the database.
        let restoring = threads("restore");
        assert!(
            (1..=THREADS + 1).contains(&restoring),
            "{restoring} restore threads"
        );

        let again = ws.open(OpenRequest {
            repository_url: None,
            idempotency_key: "k0".into(),
            toolkits: Vec::new(),
            allow_toolkit_workspace_changes: false,
            idle_pause: true,
        });
        let err = again.expect_err("a second workspace for the key");
        assert_eq!(err.code, cloud_harness_error::Code::Conflict, "{err}");
        assert!(err.message.contains(&id), "{err}");
        let folders = fs::read_dir(record::workspaces_dir(&ws.home)).unwrap();
        assert_eq!(folders.count(), all.len());

        lock.execute_batch("ROLLBACK").unwrap();
        waited_for("the workspaces are served", || {
            all.iter().all(|each| ws.get(each).is_ok())
        });
        let bound = keys::find(&ws.db, &owner, "k0")
            .unwrap()
            .expect("its key bound");
        assert_eq!(bound.workspace, id);
    }
}

//! Serving workspaces again after a restart. Each workspace left open is restored on a thread
//! of its own, and start-up waits for them at most `CLOUD_HARNESS_RESTORE_TIMEOUT`: one that
//! fails (its project now leads outside itself, its record is unreadable, a panic) or does not
//! finish in time never keeps the server from starting. It is kept as a [`Failure`] with its
//! reason — calls on it say so, the API lists it — until it is closed; one that finishes late
//! is served then.

use super::open::Activator;
use super::{keys, mounts, record, roots, Cleanup, Record, Workspace, Workspaces};
use crate::executor::{self, Executor, Kind, Places};
use cloud_harness_fs::resolver::Override;
use cloud_harness_fs::{Error, Result};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long start-up waits for restores, unless `CLOUD_HARNESS_RESTORE_TIMEOUT` says.
pub(super) const TIMEOUT: Duration = Duration::from_secs(30);

/// A workspace that could not be served again after a restart.
#[derive(Debug, Clone)]
pub struct Failure {
    pub id: String,
    /// Why, naming no path of the host.
    pub reason: String,
    /// Its restore is still running, past the time start-up waited: it is served if that
    /// ends well.
    pub restoring: bool,
    /// Its record, when it could be read.
    pub record: Option<Record>,
}

impl Failure {
    /// The principal that opened it, when its record could be read (else operators only
    /// reach it).
    pub fn owner(&self) -> &str {
        self.record.as_ref().map_or("", |r| r.owner.as_str())
    }

    pub fn state(&self) -> &'static str {
        match self.restoring {
            true => "restoring",
            false => "failed",
        }
    }

    /// What a call on the workspace gets.
    pub fn error(&self) -> Error {
        let message = match self.restoring {
            true => format!(
                "workspace {} is still being restored after the server restarted ({}); ask again later, or close it with workspace_close",
                self.id, self.reason
            ),
            false => format!(
                "workspace {} could not be restored after the server restarted: {}; close it with workspace_close, which removes it and frees its idempotency key",
                self.id, self.reason
            ),
        };
        Error::conflict(message).with_details(json!({
            "workspace": self.id,
            "state": self.state(),
            "reason": self.reason,
        }))
    }

    /// What the API's list of workspaces shows of it.
    pub fn summary(&self) -> Value {
        json!({
            "workspace": self.id,
            "owner": self.owner(),
            "state": self.state(),
            "reason": self.reason,
            "idempotencyKey": self.record.as_ref().map(|r| r.idempotency_key.clone()),
            "createdAt": self.record.as_ref().map(|r| r.created_at),
        })
    }
}

/// What a restore thread reports to.
struct Shared {
    open: Arc<Mutex<HashMap<String, Arc<Workspace>>>>,
    failed: Arc<Mutex<HashMap<String, Failure>>>,
    /// Restores ended, and a bell for each.
    ended: Arc<(Mutex<usize>, Condvar)>,
    home: PathBuf,
}

impl Workspaces {
    /// Serves again the workspaces left open by a previous run, each on a thread of its own;
    /// returns when all are served or have failed, or after the restore timeout.
    pub(super) fn restore(&self) {
        let Ok(entries) = fs::read_dir(record::workspaces_dir(&self.home)) else {
            return;
        };
        let decisions = crate::decisions::in_force(&self.db, &self.home);
        if let Err(e) = &decisions {
            tracing::error!(error = %e, "cannot read the operator's decisions: no workspace restored");
        }
        let ended = Arc::new((Mutex::new(0usize), Condvar::new()));
        let mut started = 0usize;
        let mut on_disk = HashSet::new();
        for entry in entries.flatten() {
            let dir = entry.path();
            if !record::record_path(&dir).is_file() {
                // A workspace whose open was cut short (the server killed before its record
                // was written): nothing of it may stay.
                self.sweep(&dir);
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
            let overrides = match &decisions {
                Ok(d) => d.overrides_for(&record.sets()),
                Err(_) => {
                    let why = "the operator's decisions cannot be read".into();
                    self.fail(&id, Some(record), why);
                    continue;
                }
            };
            // Before anything else: its key is its own even while it is being restored, so an
            // open with the key never makes a second workspace.
            if let Err(e) = keys::adopt(
                &self.db,
                &id,
                &record.owner,
                &record.idempotency_key,
                &record.request_digest,
                record.created_at,
            ) {
                tracing::error!(workspace = %id, error = %e, "cannot restore workspace");
                let why = without_host_paths(&e, &dir, &self.home, self.store().root());
                self.fail(&id, Some(record), why);
                continue;
            }
            self.failed.lock().expect("failed lock").insert(
                id.clone(),
                Failure {
                    id: id.clone(),
                    reason: "it is being restored".into(),
                    restoring: true,
                    record: Some(record.clone()),
                },
            );
            let shared = Shared {
                open: self.open.clone(),
                failed: self.failed.clone(),
                ended: ended.clone(),
                home: self.home.clone(),
            };
            let act = self.activator();
            // Kept for a failure to name its owner.
            let kept = record.clone();
            let spawned = std::thread::Builder::new()
                .name("restore".into())
                .spawn(move || shared.restore(&act, record, dir, overrides));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => self.fail(&id, Some(kept), format!("no thread to restore it on ({e})")),
            }
        }
        // A row whose workspace has no record (an open cut short, its folder swept above):
        // its key is free again.
        for id in keys::mine(&self.db).unwrap_or_default() {
            if !on_disk.contains(&id) {
                if let Err(e) = keys::release(&self.db, &id) {
                    tracing::error!(workspace = %id, error = %e, "cannot free the key of a half-made workspace");
                }
            }
        }
        let deadline = Instant::now()
            .checked_add(self.restore_timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        let (count, bell) = &*ended;
        let mut done = count.lock().expect("restore count lock");
        while *done < started {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            done = bell.wait_timeout(done, left).expect("restore count lock").0;
        }
        drop(done);
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

    /// Keeps `id` as failed, with why.
    fn fail(&self, id: &str, record: Option<Record>, reason: String) {
        self.failed.lock().expect("failed lock").insert(
            id.to_owned(),
            Failure {
                id: id.to_owned(),
                reason,
                restoring: false,
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

    /// Closes a workspace that has a record but is not served (its restore failed, or is
    /// still running): its executor, roots, mounts and folder go, and its key is free.
    pub(super) fn discard(&self, id: &str) -> Result<Value> {
        record::check_id(id)?;
        // Taken first: a restore that ends after this finds it closed, and undoes its work.
        let failure = self.failed.lock().expect("failed lock").remove(id);
        let removed = self.remove_unserved(id, failure.as_ref());
        if removed.is_err() {
            if let Some(f) = failure {
                self.failed
                    .lock()
                    .expect("failed lock")
                    .insert(id.to_owned(), f);
            }
        }
        removed
    }

    fn remove_unserved(&self, id: &str, failure: Option<&Failure>) -> Result<Value> {
        let dir = record::workspaces_dir(&self.home).join(id);
        let record = match Record::find(&self.home, id) {
            Ok((_, r)) => Some(r),
            Err(e) if failure.is_none() => return Err(e),
            // Unreadable, or gone: what the failure kept of it, if anything.
            Err(_) => failure.and_then(|f| f.record.clone()),
        };
        let places = Places::of(&dir);
        match record.and_then(|r| r.executor) {
            Some(spec) => Executor::attach(spec, places.clone(), id).remove()?,
            None if self.executor_kind == Some(Kind::Docker) => {
                executor::docker::remove_by_dir(&dir)?
            }
            None => {}
        }
        mounts::clear(&places.mounts);
        mounts::unshare(&places.mounts);
        roots::unpin(self.store(), id)?;
        match cloud_harness_fs::removal::remove_tree(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(&dir, e));
            }
            _ => {}
        }
        keys::release(&self.db, id)?;
        Ok(json!({ "workspace": id, "closed": true }))
    }
}

impl Shared {
    /// Restores one workspace (on its own thread) and reports how it went.
    fn restore(self, act: &Activator, record: Record, dir: PathBuf, overrides: Vec<Override>) {
        let (id, owner) = (record.id.clone(), record.owner.clone());
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            restore_one(act, record, &dir, &overrides)
        }))
        .unwrap_or_else(|_| {
            Err(Error::internal(
                "its restore stopped unexpectedly (the server's log says where)",
            ))
        });
        let mut failed = self.failed.lock().expect("failed lock");
        // Closed meanwhile (after start-up gave up waiting): nothing of it may stay.
        let wanted = failed.get(&id).is_some_and(|f| f.restoring);
        match outcome {
            Ok(ws) if wanted => {
                failed.remove(&id);
                self.open
                    .lock()
                    .expect("workspaces lock")
                    .insert(id.clone(), Arc::new(ws));
                let _ = act.catalogue.send(Arc::from(owner.as_str()));
                tracing::info!(workspace = %id, "workspace restored");
            }
            Ok(ws) => {
                drop(failed);
                tracing::warn!(workspace = %id, "a workspace closed while it was being restored is removed");
                undo(act, ws);
            }
            Err(e) => {
                tracing::error!(workspace = %id, error = %e, "cannot restore workspace");
                if let Some(f) = failed.get_mut(&id).filter(|f| f.restoring) {
                    f.reason =
                        without_host_paths(&e, &dir, &self.home, act.provisioner.store.root());
                    f.restoring = false;
                }
            }
        }
        let (count, bell) = &*self.ended;
        *count.lock().expect("restore count lock") += 1;
        bell.notify_all();
    }
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
        Some(spec) => Some(Executor::attach(spec, places.clone(), &id)),
        None => act.make_executor(&places, &id).ok().flatten(),
    };
    let mut ws = act.activate(record, dir, overrides, false, &mut Vec::new())?;
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
    let _ = cloud_harness_fs::removal::remove_tree(&ws.dir);
    let _ = keys::release(&act.db, &ws.id);
}

/// Why a restore failed, as callers may read it: the host's paths (the workspace's folder,
/// the home, the store) replaced by what they are.
fn without_host_paths(e: &Error, dir: &Path, home: &Path, store: &Path) -> String {
    let mut said = format!("{}: {}", e.code, e.message);
    let places = [
        (dir.join("repo"), "the project"),
        (dir.to_path_buf(), "the workspace's folder"),
        (home.to_path_buf(), "the server's home"),
        (store.to_path_buf(), "the store"),
    ];
    for (path, name) in places {
        let path = path.to_string_lossy().into_owned();
        if !path.is_empty() {
            said = said
                .replace(&format!("{path}/"), &format!("{name}'s "))
                .replace(&path, name);
        }
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_says_why_and_names_no_host_path() {
        let f = Failure {
            id: "ws_0123".into(),
            reason: "FORBIDDEN: the project's .agents/skills is a link".into(),
            restoring: false,
            record: None,
        };
        let e = f.error();
        assert_eq!(e.code, cloud_harness_fs::Code::Conflict);
        assert!(e.message.contains("could not be restored"), "{e}");
        assert!(e.message.contains(".agents/skills is a link"), "{e}");
        assert_eq!(e.details["state"], "failed");
        assert_eq!(f.summary()["reason"], f.reason);
    }

    #[test]
    fn reasons_name_the_project_not_the_host() {
        let home = Path::new("/srv/harness/home");
        let dir = home.join("workspaces/ws_1");
        let e = Error::io(
            &dir.join("repo/.agents/skills/x"),
            std::io::Error::from_raw_os_error(nix::libc::EACCES),
        );
        let said = without_host_paths(&e, &dir, home, Path::new("/srv/store"));
        assert!(
            said.starts_with("FORBIDDEN: the project's .agents/skills/x: "),
            "{said}"
        );
        let e = Error::internal(format!(
            "{}/state.db and /srv/store/objects",
            home.display()
        ));
        let said = without_host_paths(&e, &dir, home, Path::new("/srv/store"));
        assert_eq!(
            said,
            "INTERNAL: the server's home's state.db and the store's objects"
        );
    }
}

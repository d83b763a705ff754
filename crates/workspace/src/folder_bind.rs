//! The folder of all workspaces, a private mount of itself while a server runs on the home
//! (as root, with bubblewrap sandboxes): a sandbox then starts without the other workspaces'
//! mounts in view (`cloud_harness_executor::launch_mounts`), and no workspace's mount
//! reaches another mount namespace of the host.

use cloud_harness_executor::launch_mounts::{self, Confined};
use cloud_harness_mount::guard::{Guards, Watched};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

pub(crate) struct FolderBind {
    dir: PathBuf,
    /// Made or kept, and not yet let go of.
    held: AtomicBool,
    /// The unmount guard's record of it: detached with the mounts if this process dies.
    watched: Mutex<Option<Watched>>,
}

impl FolderBind {
    /// Binds `dir` (none of its workspaces mounted yet) onto itself if `wanted`.
    pub(crate) fn make(dir: &Path, wanted: bool) -> FolderBind {
        let held = wanted && {
            let confined = launch_mounts::confine(dir);
            tracing::debug!(folder = %dir.display(), ?confined, "the workspaces folder");
            confined != Confined::No
        };
        FolderBind {
            dir: dir.to_owned(),
            held: AtomicBool::new(held),
            watched: Mutex::default(),
        }
    }

    /// Told to `guards`, so that a server that dies leaves no bind behind.
    pub(crate) fn guard(&self, guards: &Guards) {
        if !self.held.load(Ordering::SeqCst) {
            return;
        }
        let Ok(dir) = std::fs::canonicalize(&self.dir) else {
            return;
        };
        match guards.folder(&dir) {
            Ok(watched) => *self.lock() = Some(watched),
            Err(e) => {
                tracing::warn!(error = %e, "the unmount guard was not told of the workspaces folder's mount")
            }
        }
    }

    /// Undone once no mount is left in it (a stop); kept otherwise, for the next server of
    /// the home (a Docker executor's folder stays shared over a restart).
    pub(crate) fn release(&self, guards: Option<&Guards>) {
        if !self.held.swap(false, Ordering::SeqCst) {
            return;
        }
        let undone = launch_mounts::release(&self.dir);
        let watched = self.lock().take();
        if let (true, Some(guards), Some(watched)) = (undone, guards, watched) {
            guards.forget(watched);
        }
    }

    /// Left as it is, to the unmount guard: a stop that found opens still running (they may
    /// still mount in it).
    pub(crate) fn leave(&self) {
        if self.held.swap(false, Ordering::SeqCst) {
            cloud_harness_executor::launch_mounts::leave(&self.dir);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Watched>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FolderBind {
    /// After every other part of a server dropped without a stop (a library's caller): its
    /// mounts are gone by then.
    fn drop(&mut self) {
        self.release(None);
    }
}

//! Idle workspaces pause: after `CLOUD_HARNESS_IDLE_PAUSE` seconds unused (no call that names
//! it, no script running), a workspace lets go of what costs while it waits — its two FUSE
//! mounts and their threads, its live tiers' watcher and thread, its bubblewrap sandbox — and
//! takes them back at the next call that names it, before that call goes on. Its record, its
//! working tree, its key, its roots in the store and a Docker executor's container stay: a
//! paused workspace is open, listed, counted against its owner, and a restart serves it as
//! any other. So what a runner holds follows the work being done, not the workspaces open.

use super::activate::Served;
use super::{roots, Workspace, Workspaces};
use cloud_harness_error::Result;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The default idle time before a pause.
pub const IDLE: Duration = Duration::from_secs(600);

impl Workspace {
    /// Lets go of the mounts, the live tiers and a bubblewrap sandbox, if the workspace has
    /// been unused for `idle`. One that runs a script, or that a call holds (`held`: a run
    /// waiting for its turn, a long read), is in use now. Whether it paused.
    fn pause(&self, idle: Duration, held: bool) -> Result<bool> {
        let _turning = self.idle.turning.lock().expect("pause lock");
        if held || self.running.load(Ordering::SeqCst) > 0 {
            self.idle.touch();
            return Ok(false);
        }
        if self.idle.paused() || self.idle.unused_for() < idle {
            return Ok(false);
        }
        // Paused first: a readiness check meanwhile takes the mounts going as a pause.
        self.idle.paused.store(true, Ordering::SeqCst);
        // The sandbox first: its mount namespace holds the mounts, which would otherwise be
        // detached lazily and served until it is gone.
        if let Some(executor) = &self.executor {
            executor.idle();
        }
        if let Err(e) = self.release() {
            self.idle.paused.store(false, Ordering::SeqCst);
            return Err(e);
        }
        Ok(true)
    }
}

impl Workspaces {
    /// Pauses every workspace unused for `idle`; how many paused. One that cannot be is
    /// logged and stays as it is.
    pub fn pause_idle(&self, idle: Duration) -> usize {
        let mut paused = 0;
        for ws in self.open_workspaces() {
            // Held by the map of open workspaces and by this list, and by nothing else.
            let held = Arc::strong_count(&ws) > 2;
            match ws.pause(idle, held) {
                Ok(true) => {
                    paused += 1;
                    tracing::info!(workspace = %ws.id, "paused, unused for {} s", idle.as_secs());
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(workspace = %ws.id, error = %e, "could not pause"),
            }
        }
        cloud_harness_control::metrics::set_paused_workspaces(
            self.open_workspaces()
                .iter()
                .filter(|w| w.idle.paused())
                .count(),
        );
        paused
    }

    /// `ws` is being used: marked so, and served again first if it was paused (its live
    /// tiers read afresh, so what changed in its folders meanwhile is served).
    pub(super) fn used(&self, ws: &Workspace) -> Result<()> {
        // Under the lock a pause takes: a pause either ends before this use (and is undone
        // below) or sees it and leaves the workspace be.
        let turning = ws.idle.turning.lock().expect("pause lock");
        ws.idle.touch();
        if !ws.idle.paused() {
            return Ok(());
        }
        drop(turning);
        // Mounting waits on the kernel and a helper process: on a worker of the server's
        // runtime, the others take over its tasks meanwhile.
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.resume(ws))
            }
            _ => self.resume(ws),
        }
    }

    fn resume(&self, ws: &Workspace) -> Result<()> {
        let _turning = ws.idle.turning.lock().expect("pause lock");
        if !ws.idle.paused() {
            return Ok(()); // another call resumed it meanwhile
        }
        let overrides = cloud_harness_curation::decisions::in_force(&self.db, &self.home)?
            .overrides_for(&ws.record.sets());
        let act = self.activator();
        let mut warnings = Vec::new();
        let (watch, cache, generation) =
            act.watch_stack(&ws.record, &ws.places, &overrides, &mut warnings)?;
        roots::pin(self.store(), &ws.id, &generation)?;
        ws.merged.set_generation(generation.clone());
        ws.owner_view.set_generation(generation);
        let now = ws.merged.generation().digest();
        ws.changes
            .send_if_modified(|seen| std::mem::replace(seen, now) != now);
        let served = Served {
            record: &ws.record,
            places: &ws.places,
            merged: &ws.merged,
            owner: &ws.owner_view,
            changes: &ws.changes,
        };
        let (mounted, live) = act.serve(&served, watch, cache, &mut warnings)?;
        for warning in warnings {
            tracing::warn!(workspace = %ws.id, "{warning}");
        }
        *ws.mounts.lock().expect("mount lock") = mounted;
        *ws.live.lock().expect("live lock") = Some(live);
        ws.idle.paused.store(false, Ordering::SeqCst);
        tracing::info!(workspace = %ws.id, "resumed");
        Ok(())
    }
}

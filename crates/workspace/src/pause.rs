//! Idle workspaces pause: after `CLOUD_HARNESS_IDLE_PAUSE` seconds unused (no call that names
//! it, no script running), a workspace lets go of what costs while it waits — its two FUSE
//! mounts and their threads, its live tiers' watcher and thread, its bubblewrap sandbox — and
//! takes them back at the next call that names it, before that call goes on. Its record, its
//! working tree, its key, its roots in the store and a Docker executor's container stay: a
//! paused workspace is open, listed, counted against its owner, and a restart serves it as
//! any other. So what a runner holds follows the work being done, not the workspaces open.

use super::activate::Served;
use super::{roots, Workspace, Workspaces};
use cloud_harness_error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How many workspaces pause at once, at most.
const PAUSERS: usize = 8;
/// The default idle time before a pause.
pub const IDLE: Duration = Duration::from_secs(600);

impl Workspace {
    /// Lets go of the mounts, the live tiers and a bubblewrap sandbox, if the workspace has
    /// been unused for `idle`. One that runs a script, or that a call holds (`held`: a run
    /// waiting for its turn, a long read), is in use now. Whether it paused.
    fn pause(&self, idle: Duration, held: bool) -> Result<bool> {
        if self.record.never_pause {
            return Ok(false);
        }
        let _turning = self
            .idle
            .turning
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.running.load(Ordering::SeqCst) > 0 {
            self.idle.touch();
            return Ok(false);
        }
        // Held by a call, or for a moment by a listing: not now, and its idle time goes on (a
        // listing that holds every workspace must not make them all wait another `idle`).
        if held {
            return Ok(false);
        }
        if self.idle.paused() || self.idle.closed.load(Ordering::SeqCst) {
            return Ok(false);
        }
        if self.idle.unused_for() < idle {
            return Ok(false);
        }
        // Paused first: a readiness check meanwhile takes the mounts going as a pause; and
        // paused it stays if releasing fails part way, so the next use serves it whole again.
        self.idle.paused.store(true, Ordering::SeqCst);
        // The sandbox goes first (see `release`).
        self.release()?;
        Ok(true)
    }

    /// A close begins: no pause or resume runs from now on. Held until the close ends.
    pub(super) fn closing(&self) -> std::sync::MutexGuard<'_, ()> {
        let turning = self
            .idle
            .turning
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.idle.closed.store(true, Ordering::SeqCst);
        turning
    }
}

impl Workspaces {
    /// Pauses every workspace unused for `idle`; how many paused. One that cannot be is
    /// logged and stays as it is.
    ///
    /// A pause waits for its sandbox to end and its mounts to be detached (about 0.4 s):
    /// several run at once, on at most [`PAUSERS`] threads, so a thousand idle workspaces
    /// pause in a minute, not seven.
    pub fn pause_idle(&self, idle: Duration) -> usize {
        // Those that may be due, looked at without their locks (`pause` looks again).
        let mut open = self.open_workspaces();
        open.retain(|ws| {
            !ws.record.never_pause && !ws.idle.paused() && ws.idle.unused_for() >= idle
        });
        let outcomes = crate::acquire::bounded_map(&open, PAUSERS, |ws| {
            // Held by the map of open workspaces and by this list, and by nothing else.
            let held = Arc::strong_count(ws) > 2;
            // A pause that panics is that workspace's failure, not the end of every pause.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ws.pause(idle, held)))
                .unwrap_or_else(|_| Err(Error::internal("the pause panicked")))
        });
        let mut paused = 0;
        for (ws, outcome) in open.iter().zip(outcomes) {
            match outcome {
                Ok(true) => {
                    paused += 1;
                    tracing::info!(workspace = %ws.id, "paused, unused for {} s", idle.as_secs());
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(workspace = %ws.id, error = %e, "could not pause"),
            }
        }
        drop(open);
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
        // The usual case, without waiting: not paused, and no pause or resume under way.
        if let Ok(_turning) = ws.idle.turning.try_lock() {
            ws.idle.touch();
            if !ws.idle.paused() {
                return Ok(());
            }
        }
        // Otherwise this waits for the lock and perhaps mounts, which wait on the kernel and a
        // helper process: on a worker of the server's runtime, the others take over its tasks
        // meanwhile.
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.resume(ws))
            }
            _ => self.resume(ws),
        }
    }

    /// Under the lock a pause takes: a pause either ends before this use (and is undone
    /// here) or sees it and leaves the workspace be.
    fn resume(&self, ws: &Workspace) -> Result<()> {
        let _turning = ws
            .idle
            .turning
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ws.idle.touch();
        if ws.idle.closed.load(Ordering::SeqCst) {
            return Err(super::record::not_found(&ws.id));
        }
        if !ws.idle.paused() {
            return Ok(()); // another call resumed it meanwhile
        }
        // What a pause that failed part way left mounted goes first: a new mount on top of
        // it would hide it, unguarded and never unmounted.
        super::mounts::release(&mut ws.mounts.lock().expect("mount lock"))?;
        let overrides = cloud_harness_curation::decisions::in_force(&self.db, &self.home)?
            .overrides_for(&ws.record.sets());
        let act = self.activator();
        let mut warnings = Vec::new();
        let (watch, cache, generation) =
            act.watch_stack(&ws.record, &ws.places, &overrides, &mut warnings)?;
        roots::pin(self.store(), &ws.id, &generation)?;
        let before = ws.merged.generation().digest();
        ws.merged.set_generation(generation.clone());
        ws.owner_view.set_generation(generation);
        let served = Served {
            record: &ws.record,
            places: &ws.places,
            merged: &ws.merged,
            owner: &ws.owner_view,
            changes: &ws.changes,
            origins: &ws.origins,
        };
        let (mut mounted, live) = act.serve(&served, watch, cache, &mut warnings)?;
        if self.mounting && mounted.is_empty() {
            // Served without its mounts, its runs would see no skills: it stays paused, and
            // the call says why (the next one tries again).
            drop(live);
            let _ = super::mounts::release(&mut mounted);
            return Err(cloud_harness_error::Error::new(
                cloud_harness_error::Code::Upstream,
                format!(
                    "workspace {} could not be served again after its pause: {}",
                    ws.id,
                    warnings.join("; ")
                ),
            )
            .with_details(serde_json::json!({ "workspace": ws.id, "retryable": true })));
        }
        for warning in warnings {
            tracing::warn!(workspace = %ws.id, "{warning}");
        }
        *ws.mounts.lock().expect("mount lock") = mounted;
        *ws.live.lock().expect("live lock") = Some(live);
        ws.idle.paused.store(false, Ordering::SeqCst);
        let now = ws.merged.generation().digest();
        ws.changes
            .send_if_modified(|seen| std::mem::replace(seen, now) != now);
        if now != before {
            // What changed in its folders while it was paused: its catalogue's watchers hear.
            self.catalogue_changed(ws.owner());
        }
        tracing::info!(workspace = %ws.id, "resumed");
        Ok(())
    }
}

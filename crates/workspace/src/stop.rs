//! A server's stop: every workspace unmounted, their records kept for the next start.

use super::{Workspace, Workspaces};
use std::sync::Arc;
use std::time::Duration;

impl Workspaces {
    /// Unmounts every workspace (server shutdown); their records, shared mount folders and
    /// containers stay, so a restart serves them again.
    pub fn shutdown(&self) {
        // No open begins after this; those in progress are cancelled and undo what they made.
        // Scripts stop now, not after the wait.
        for ws in self.open_workspaces() {
            ws.runs.cancel();
        }
        let deadline = std::time::Instant::now() + OPENS_WAIT;
        // Restores still running in the background (past the start's wait) mount too.
        let quiet = self.openings.stop(OPENS_WAIT) && self.restores_end(deadline);
        let all: Vec<Arc<Workspace>> = self
            .open
            .lock()
            .expect("workspaces lock")
            .drain()
            .map(|(_, w)| w)
            .collect();
        // Spares have no record: nothing of them stays.
        self.stop_spares();
        for ws in &all {
            ws.runs.cancel();
        }
        for ws in all {
            ws.wait_for_runs(Duration::from_secs(5));
            // No resume after this (its record stays: the next start serves it again).
            let _closing = ws.closing();
            // Its bubblewrap sandbox goes first (it would end with the server anyway); a
            // Docker container stays, for the next start (see `release`).
            if let Err(e) = ws.release() {
                tracing::error!(workspace = %ws.id, error = %e, "unmount failed");
            }
        }
        self.provisioner.release();
        if !quiet {
            // It may still mount or write a record: the home stays locked (the guard keeps
            // it so past this process's end until it has detached what is left).
            tracing::warn!("opens or restores still in progress at the stop; the home stays locked until this process ends");
            self.kept_home
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        // Everything is unmounted: the guard ends, and lets go of the home with the server.
        self.folder.release(self.guards.as_deref());
        if let Some(guards) = &self.guards {
            guards.stop();
        }
        drop(self.serving.lock().expect("serving lock").take());
    }

    /// Waits until the start-up's restore has ended (every workspace served, failed or
    /// undone), or `deadline`. Whether it has.
    fn restores_end(&self, deadline: std::time::Instant) -> bool {
        let restoring = self.restoring.lock().expect("restoring lock");
        restoring
            .as_ref()
            .is_none_or(|steps| steps.end_by(deadline))
    }
}

impl Drop for Workspaces {
    /// Dropped without [`Workspaces::shutdown`] (a library's caller): the guard ends (it
    /// detaches whatever is still mounted) and lets go of its copy of the home's lock, whoever
    /// else still holds the guards.
    fn drop(&mut self) {
        // Not after a stop that kept the home: what still runs may mount.
        if self.kept_home.load(std::sync::atomic::Ordering::SeqCst) {
            self.folder.leave();
            return;
        }
        if let Some(guards) = &self.guards {
            guards.stop();
        }
    }
}

/// How long a stopping server waits for the opens it cancelled to undo what they made.
const OPENS_WAIT: Duration = Duration::from_secs(10);

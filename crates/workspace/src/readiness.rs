//! Whether the open workspaces' mounts are served: the readiness check's part that is the
//! workspaces', run every few seconds.

use super::{Workspace, Workspaces};
use std::sync::Arc;

impl Workspaces {
    /// Whether every open workspace's mounts are served (`Workspace::check_mounts`), from
    /// one read of the mount table; what is wrong, naming each workspace. Blocking.
    ///
    /// It runs every few seconds: it holds one workspace at a time, for its own check (a
    /// workspace held counts as in use, and does not pause), and finds each mount in the
    /// table by its point, not by a scan of the table.
    pub fn check_mounts(&self) -> std::result::Result<(), String> {
        let table = cloud_harness_mount::mount_table::mounts()
            .map_err(|e| format!("the mount table cannot be read: {e}"))?;
        let ours: std::collections::HashSet<&std::path::Path> = table
            .iter()
            .filter(|m| m.is_ours())
            .map(|m| m.point.as_path())
            .collect();
        let all: Vec<std::sync::Weak<Workspace>> = self
            .open
            .lock()
            .expect("open lock")
            .values()
            .map(Arc::downgrade)
            .collect();
        let bad: Vec<String> = all
            .iter()
            .filter_map(|w| {
                let w = w.upgrade()?; // closed meanwhile
                w.check_mounts(&ours)
                    .err()
                    .map(|e| format!("workspace {} mounts: {e}", w.id))
            })
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("; "))
        }
    }
}

//! The mounts a bubblewrap sandbox starts from.
//!
//! bubblewrap reads the whole mount table once for each bind it makes (to find what to remount
//! read-only under it), so its start grows with every mount on the host: 13 ms with 30 mounts,
//! 135 ms with 3,000, the mounts of 1,000 workspaces. Started as root, it starts instead in a
//! mount namespace of its own from which every other workspace's mounts are detached: it then
//! reads the system's mounts and its own workspace's, however many workspaces there are.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cloud_harness_mount::mount_table;

/// The other workspaces' mounts, as they were when the sandbox's command was made.
pub struct Hidden {
    points: Vec<CString>,
}

impl Hidden {
    /// The mounts in `workspaces` (the folder of every workspace) that are not in or above
    /// `own` (this workspace's folder): one read of the table, in the parent. Only root
    /// can make a mount namespace without a user namespace; elsewhere, nothing.
    pub fn others(own: &Path) -> Option<Hidden> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let own = std::fs::canonicalize(own).ok()?;
        let workspaces = own.parent()?.to_path_buf();
        let table = mount_table::mounts().ok()?;
        Some(Hidden {
            points: outermost(
                table
                    .into_iter()
                    .map(|m| m.point)
                    .filter(|p| p.starts_with(&workspaces) && *p != workspaces)
                    .filter(|p| !p.starts_with(&own) && !own.starts_with(p)),
            ),
        })
    }

    /// Between fork and exec: this process moves to a mount namespace of its own, private
    /// (nothing made or detached there reaches the host, nor the other way: a later
    /// workspace's mounts are not copied into every sandbox's namespace), and detaches them
    /// there. The host's mounts stay as they are. Allocates nothing (another thread may have
    /// held the allocator's lock at the fork).
    ///
    /// Best effort: where the namespace cannot be made, bubblewrap starts as it would have
    /// (slower). No mount is detached unless the namespace is private: a detach in a
    /// namespace still sharing with the host would detach the host's mount too.
    pub fn detach(&self) {
        use nix::libc;
        if self.points.is_empty() {
            return;
        }
        // SAFETY: plain system calls on NUL-terminated strings made before the fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return;
            }
            let private = libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            );
            if private != 0 {
                return;
            }
            for point in &self.points {
                // Gone since the table was read, or detached with its parent: nothing to do.
                libc::umount2(point.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

/// The points not under another of them: detaching one detaches what is under it.
fn outermost(points: impl Iterator<Item = PathBuf>) -> Vec<CString> {
    let mut points: Vec<PathBuf> = points.collect();
    points.sort();
    let mut kept: Vec<PathBuf> = Vec::new();
    for p in points {
        if kept.last().is_some_and(|k| p.starts_with(k)) {
            continue;
        }
        kept.push(p);
    }
    kept.into_iter()
        .filter_map(|p| CString::new(p.as_os_str().as_bytes()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_under_another_is_detached_with_it() {
        let points = [
            "/h/workspaces/b/mounts/skills",
            "/h/workspaces/a/mounts",
            "/h/workspaces/b/mounts",
            "/h/workspaces/a/mounts/skills",
            "/h/workspaces/a/mounts/owner-skills",
            "/h/workspaces/ab/mounts",
        ];
        let kept = outermost(points.iter().map(PathBuf::from));
        let kept: Vec<&str> = kept.iter().map(|c| c.to_str().unwrap()).collect();
        assert_eq!(
            kept,
            [
                "/h/workspaces/a/mounts",
                "/h/workspaces/ab/mounts",
                "/h/workspaces/b/mounts"
            ]
        );
    }
}

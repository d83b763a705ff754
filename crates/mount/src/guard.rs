//! The unmount guard: a small process that outlives a killed daemon and detaches its mount.
//! fusermount's `auto_unmount` does not always: before unmounting it opens the mount point to
//! see whether the file system is gone, and once the kernel opens directories without asking
//! (zero-message opendir) that open succeeds on a dead mount, so the mount stays, answering
//! `ENOTCONN` to whatever its caches do not hold.
//!
//! The guard (`<program> mount-guard MOUNTPOINT ID`) reads a pipe that only the daemon holds
//! open; at end of file — the daemon exited, however it died — it detaches the mount, if the
//! mount at that point is still the one of that ID (not one mounted there since).

use crate::mount_table;
use std::io::{self, Read};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

/// A running guard; dropping it (after a clean unmount) lets it end.
pub struct Guard {
    pipe: Option<ChildStdin>,
    child: Child,
}

impl Guard {
    /// Starts a guard for the mount now at `mountpoint`.
    pub fn start(program: &Path, mountpoint: &Path) -> io::Result<Guard> {
        let point = std::fs::canonicalize(mountpoint)?;
        let id = mount_table::id_at(&point)
            .ok_or_else(|| io::Error::other(format!("{} is not a mount point", point.display())))?;
        let mut child = Command::new(program)
            .arg("mount-guard")
            .arg(&point)
            .arg(id.to_string())
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Guard {
            pipe: child.stdin.take(),
            child,
        })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        drop(self.pipe.take());
        let _ = self.child.wait();
    }
}

/// The guard's side: waits for end of file on stdin, then detaches the mount at `point`
/// (canonical) if it is still mount `id`. Whether it did.
pub fn watch(point: &Path, id: u64) -> io::Result<bool> {
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    if mount_table::id_at(point) != Some(id) {
        return Ok(false); // unmounted by the daemon, or someone else's mount now
    }
    crate::fuse::unmount(point)?;
    Ok(true)
}

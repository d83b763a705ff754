//! The lock a server holds on its home while it serves it. A second server on the same home
//! would sweep the first's live mounts at its start, restore its workspaces and remove its
//! half-made ones: it is refused instead.

use cloud_harness_error::{Code, Error, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a start (or a sweep) waits for a server that is stopping on the same home (a
/// restart that began before the last one had exited), or for a dead server's unmount guard,
/// which holds the lock until it has detached every mount it knew.
const WAIT: Duration = Duration::from_secs(15);

/// Held for the server's life; the kernel lets go of it however the process ends (and
/// every copy of it has closed: the unmount guard keeps one until it has detached). Dropped,
/// it closes its file without unlocking: a copy still open keeps the home locked.
pub struct Serving(File);

impl Serving {
    /// Another handle on the same lock: the home stays locked while any handle is open.
    pub fn copy(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        Ok(self.0.try_clone()?.into())
    }
}

/// Takes `<home>/serving.lock`, waiting for a server still stopping, or says which home is
/// served by someone else.
pub fn lock(home: &Path) -> Result<Serving> {
    lock_within(home, WAIT)
}

fn lock_within(home: &Path, wait: Duration) -> Result<Serving> {
    let path = home.join("serving.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    match take_within(&file, wait) {
        Ok(true) => Ok(Serving(file)),
        Ok(false) => Err(Error::new(
                    Code::Conflict,
                    format!(
                        "another server serves the home {}: stop it, or give this one a home of its own (CLOUD_HARNESS_HOME)",
                        home.display()
                    ),
                )
                .with_details(serde_json::json!({ "path": path.to_string_lossy() }))),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// Takes the lock on `file`, waiting up to `wait` for whoever holds it. Whether it did.
fn take_within(file: &File, wait: Duration) -> std::io::Result<bool> {
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) if started.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(TryLockError::WouldBlock) => return Ok(false),
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// Whether a server holds `home`, for a sweep of what a dead one left. The file is opened
/// read-only and never made: a sweep must work on a home it cannot write (a file system
/// remounted read-only after errors) and must not leave a file its server's user cannot open.
pub enum Sweep {
    /// A running server holds it.
    Served,
    /// None does; the lock, held while sweeping, where the file could be opened.
    Free(Option<Serving>),
}

/// Waits as a start does: a dead server's guard may still be detaching.
pub fn for_sweep(home: &Path) -> Sweep {
    for_sweep_within(home, WAIT)
}

fn for_sweep_within(home: &Path, wait: Duration) -> Sweep {
    let Ok(file) = File::open(home.join("serving.lock")) else {
        return Sweep::Free(None); // no server ever ran here, or it cannot be read: sweep
    };
    match take_within(&file, wait) {
        Ok(true) => Sweep::Free(Some(Serving(file))),
        Ok(false) => Sweep::Served,
        Err(_) => Sweep::Free(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_server_on_a_home_is_refused_until_the_first_lets_go() {
        let home = tempfile::tempdir().unwrap();
        let first = lock(home.path()).unwrap();
        let second = lock_within(home.path(), Duration::from_millis(200))
            .err()
            .unwrap();
        assert_eq!(second.code, Code::Conflict);
        assert!(second.message.contains("another server serves the home"));
        assert!(matches!(
            for_sweep_within(home.path(), Duration::ZERO),
            Sweep::Served
        ));
        drop(first);
        lock(home.path()).unwrap();
    }

    #[test]
    fn the_unmount_guard_keeps_the_home_locked_until_it_ends() {
        let home = tempfile::tempdir().unwrap();
        let serving = lock(home.path()).unwrap();
        let guards = crate::guards(crate::fake_guard::program(home.path()), Some(&serving));
        assert!(guards.ready());
        // The server is gone (its lock closed) but its guard still runs: still served.
        drop(serving);
        let refused = lock_within(home.path(), Duration::ZERO).err().unwrap();
        assert_eq!(refused.code, Code::Conflict);
        assert!(matches!(
            for_sweep_within(home.path(), Duration::ZERO),
            Sweep::Served
        ));
        // No other child of the server holds it.
        let status = std::process::Command::new("sh")
            .args(["-c", "ls -l /proc/self/fd | grep -c serving.lock"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&status.stdout).trim(), "0");
        // The guard has ended: the next server serves.
        guards.stop();
        lock_within(home.path(), Duration::ZERO).unwrap();
        // Stopped for good: no guard (holding nothing) is started after.
        assert!(!guards.ready());
    }
}

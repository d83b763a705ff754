//! A workspace's mounts on the host: `<workspace>/mounts` made a shared mount of its own (as
//! root), and inside it the two FUSE mounts (`skills`, the merged view; `owner-skills`, the
//! owner tier alone) that executors see at `/opt/cloud-harness`. Because the folder is shared
//! and executors bind it with slave propagation, mounts made after a restart show through.

use cloud_harness_error::{Error, Result};
use cloud_harness_mount::fuse::{self, Loads, MountConfig};
use cloud_harness_mount::guard::{Guards, Watched};
use cloud_harness_mount::live::Target;
pub use cloud_harness_mount::mount_table::is_mount_point;
use cloud_harness_mount::prewarm::Prewarm;
use cloud_harness_skills::namespace::Namespace;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The merged view and the owner tier: the names a sweep knows as a workspace's mounts.
pub const SKILLS: &str = cloud_harness_mount::guard::MOUNT_NAMES[0];
pub const OWNER_SKILLS: &str = cloud_harness_mount::guard::MOUNT_NAMES[1];

pub struct Mounted {
    pub path: PathBuf,
    /// The same, resolved: as the mount table names it.
    point: PathBuf,
    /// The background walk that fills the kernel's caches; stopped before the unmount (its
    /// open folders would keep the mount busy).
    prewarm: Option<Prewarm>,
    /// Its session, served by the process's pool of FUSE threads.
    served: fuse::Mounted,
    /// The guard that detaches the mount if this process dies, and the mount as it knows it.
    guard: Option<(Arc<Guards>, Watched)>,
}

impl Mounted {
    /// Whether the mount table has it among `ours` (the points of this project's FUSE
    /// mounts) and the kernel still sends it requests.
    pub fn check(&self, ours: &std::collections::HashSet<&Path>) -> Result<(), String> {
        if !ours.contains(self.point.as_path()) {
            return Err(format!("{} is not mounted", self.path.display()));
        }
        if !self.served.is_served() {
            return Err(format!("{} is no longer served", self.path.display()));
        }
        Ok(())
    }
}

impl Drop for Mounted {
    /// A mount its owner let go of without [`release`] (an open that failed after mounting):
    /// unmounted, and forgotten by the guard once it is, so neither the mount nor the guard's
    /// record of it outlives the workspace.
    fn drop(&mut self) {
        let Some((guards, watched)) = self.guard.take() else {
            return; // released, or never guarded (the half-made folder's cleanup unmounts it)
        };
        drop(self.prewarm.take());
        match fuse::unmount(&self.path) {
            Ok(()) => guards.forget(watched),
            Err(e) => {
                tracing::warn!(mountpoint = %self.path.display(), error = %e, "a mount let go of could not be unmounted; its guard still detaches it if this server dies")
            }
        }
    }
}

/// How long closing waits for a session to end: a busy mount detached lazily is served
/// until its last user lets go, and closing must not wait for that.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The most of the process's FUSE threads (`cloud_harness_mount::pool`) that serve one mount
/// at once: the merged view two (a second reader is not held up behind a slow first), the
/// owner tier, rarely read, one. No mount holds a thread of its own: a workspace costs no
/// thread for its mounts, busy or idle.
fn threads(sub: &str) -> usize {
    if sub == SKILLS {
        2
    } else {
        1
    }
}

fn as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Makes `dir` a shared mount of its own, in a peer group of its own, unless it is a mount
/// point already (a restart finds the one it made before). Only root can; elsewhere the
/// folder stays as it is (bubblewrap sandboxes, made per command, do not need it).
pub fn share(dir: &Path) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    if !as_root() || is_mount_point(dir) {
        return Ok(());
    }
    let none: Option<&str> = None;
    let fail = |what: &str, e: nix::Error| {
        Error::internal(format!("making {} {what}: {e}", dir.display()))
    };
    mount(Some(dir), dir, none, MsFlags::MS_BIND, none).map_err(|e| fail("a mount", e))?;
    mount(none, dir, none, MsFlags::MS_PRIVATE, none).map_err(|e| fail("private", e))?;
    mount(none, dir, none, MsFlags::MS_SHARED, none).map_err(|e| fail("shared", e))?;
    Ok(())
}

/// Undoes [`share`] (the folder's FUSE mounts are gone by then).
pub fn unshare(dir: &Path) {
    if as_root() && is_mount_point(dir) {
        let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Mounts the merged and owner namespaces in `dir`; the live-tier targets that invalidate
/// the kernel's caches. If either mount fails, neither stays and a warning says so. With a
/// `prewarm` program (this one's binary), each mount is walked once in the background; with
/// `guards`, each is detached if this process dies without unmounting it.
pub fn mount(
    dir: &Path,
    merged: Arc<Namespace>,
    owner: Arc<Namespace>,
    loads: [Option<Loads>; 2],
    prewarm: Option<&Path>,
    guards: Option<&Arc<Guards>>,
    warnings: &mut Vec<String>,
) -> Result<(Vec<Mounted>, Vec<Target>)> {
    let mut mounts = Vec::new();
    let mut targets: Vec<Target> = Vec::new();
    // The executor's user is not the one serving the mount. The guard, where one runs,
    // detaches the mounts of a dead server; fusermount's own auto-unmount (which leaves a
    // zombie helper per mount, and misses mounts whose folders were opened) only where none
    // can run.
    let guards = guards.filter(|g| g.ready());
    let config = |threads, loads| MountConfig {
        allow_other: as_root(),
        auto_unmount: guards.is_none(),
        threads,
        loads,
    };
    let views = [(merged.clone(), SKILLS), (owner.clone(), OWNER_SKILLS)];
    for ((ns, sub), loads) in views.into_iter().zip(loads) {
        // A mount whose loads are counted is walked without reading files: a page the walk
        // cached would be read by the agent without the daemon knowing.
        let content = loads.is_none();
        let path = dir.join(sub);
        if let Err(e) = fs::create_dir_all(&path) {
            let _ = release(&mut mounts);
            return Err(Error::io(&path, e));
        }
        // Told before the mount is made: a death between the mount and the guard's knowing
        // its ID must not leave it behind (no fusermount auto-unmount when a guard runs).
        let mut pending = match guards.map(|g| g.expect(&path)) {
            None => None,
            Some(Ok(p)) => Some(p),
            Some(Err(e)) => {
                let why = format!("no unmount guard: {e}");
                return not_mounted(&why, &mut mounts, warnings, merged, owner);
            }
        };
        let mounted = fuse::mount(ns.clone(), &path, &config(threads(sub), loads));
        if mounted.is_err() {
            if let (Some(g), Some(p)) = (guards, pending.take()) {
                g.abandon(p);
            }
        }
        match mounted {
            Ok(m) => {
                // The guard knows it by ID before anything can open a folder of the mount
                // (the prewarm does at once).
                let watched = guards.zip(pending).map(|(g, p)| {
                    g.mounted(p)
                        .map(|w| (g.clone(), w))
                        .map_err(|(p, e)| (g, p, e))
                });
                let guard = match watched {
                    None => None,
                    Some(Ok(watched)) => Some(watched),
                    Some(Err((g, p, e))) => {
                        // Not known by its ID: not served. The guard still expects it until
                        // it is gone.
                        drop(m);
                        if fuse::unmount(&path).is_ok() {
                            g.abandon(p);
                        }
                        let why = format!("no unmount guard: {e}");
                        return not_mounted(&why, &mut mounts, warnings, merged, owner);
                    }
                };
                let notifier = m.notifier();
                let prewarm = prewarm.and_then(|program| {
                    let started = Prewarm::start(program, &path, content, move |s| s.log(sub));
                    started
                        .map_err(|e| tracing::warn!(error = %e, "no prewarm: first reads go to the daemon"))
                        .ok()
                });
                cloud_harness_error::failpoint::point("mount.prewarming");
                let point = fs::canonicalize(dir).map_or_else(|_| path.clone(), |d| d.join(sub));
                mounts.push(Mounted {
                    path,
                    point,
                    prewarm,
                    served: m,
                    guard,
                });
                targets.push((
                    ns,
                    Box::new(move |items: &[_]| fuse::invalidate(&notifier, items)),
                ));
            }
            Err(e) => return not_mounted(&e.to_string(), &mut mounts, warnings, merged, owner),
        }
    }
    Ok((mounts, targets))
}

/// Gives up mounting for `why`: what was mounted is released, and the open goes on unmounted
/// with a warning (or fails, naming `why`, if a mount cannot be released).
fn not_mounted(
    why: &str,
    mounts: &mut Vec<Mounted>,
    warnings: &mut Vec<String>,
    merged: Arc<Namespace>,
    owner: Arc<Namespace>,
) -> Result<(Vec<Mounted>, Vec<Target>)> {
    release(mounts).map_err(|e| e.context(format_args!("skills are not mounted ({why})")))?;
    warnings.push(format!(
        "skills are not mounted ({why}); skills_read still works, and skills_run runs approved copies"
    ));
    Ok((Vec::new(), unmounted(merged, owner)))
}

/// Live-tier targets for namespaces that are not mounted.
pub fn unmounted(merged: Arc<Namespace>, owner: Arc<Namespace>) -> Vec<Target> {
    vec![
        (merged, Box::new(|_: &[_]| {})),
        (owner, Box::new(|_: &[_]| {})),
    ]
}

/// Unmounts and waits for the sessions to end. Every mount is tried: one that cannot be
/// unmounted is the error (and stays in `mounts`), and does not keep the others mounted.
pub fn release(mounts: &mut Vec<Mounted>) -> Result<()> {
    let mut first_error = None;
    let mut kept = Vec::new();
    for mut m in mounts.drain(..) {
        drop(m.prewarm.take()); // its open folders would keep the mount busy
        if let Err(e) = fuse::unmount(&m.path) {
            let e = Error::internal(format!("unmounting {}: {e}", m.path.display()));
            first_error.get_or_insert(e);
            kept.push(m);
            continue;
        }
        if let Some((guards, watched)) = m.guard.take() {
            guards.forget(watched);
        }
        // Still served past the wait: a lazily detached mount, ended once unused.
        if !m.served.wait_end(Some(STOP_WAIT)) {
            tracing::warn!(mountpoint = %m.path.display(), "a busy mount was detached; it is served until its last user lets go");
        }
    }
    *mounts = kept;
    first_error.map_or(Ok(()), Err)
}

/// Detaches the FUSE mounts a server that is gone left under `dir` (its unmount guard killed
/// with it, as a service manager's final SIGKILL to the whole unit can): at a server's start,
/// before it has made any.
pub fn sweep(dir: &Path) {
    match cloud_harness_mount::guard::sweep(dir) {
        Ok(0) => {}
        Ok(n) => {
            tracing::warn!(mounts = n, folder = %dir.display(), "detached the mounts a server that is gone left behind")
        }
        Err(e) => {
            tracing::warn!(error = %e, folder = %dir.display(), "could not look for mounts left behind")
        }
    }
}

/// Unmounts whatever FUSE mount is left in `dir` (a half-made workspace).
pub fn clear(dir: &Path) {
    for sub in [SKILLS, OWNER_SKILLS] {
        let _ = fuse::unmount(&dir.join(sub));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_harness_skills::discovery::SkillCache;
    use cloud_harness_skills::generation::View;
    use cloud_harness_skills::stack::StackSpec;
    use cloud_harness_store::cas::Store;

    #[test]
    fn a_mount_let_go_of_without_release_is_unmounted_and_forgotten() {
        let root = as_root() && Path::new("/dev/fuse").exists();
        if !root {
            assert!(std::env::var_os("CI").is_none(), "needs root and /dev/fuse");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path().join("store")).unwrap();
        let generation = Arc::new(
            StackSpec::default()
                .generation(&store, &SkillCache::default())
                .unwrap(),
        );
        let ns = Arc::new(Namespace::new(store, View::Merged, generation));
        let guards = Arc::new(Guards::new(crate::fake_guard::program(tmp.path())));
        let dir = tmp.path().join("mounts");
        let mut warnings = Vec::new();
        let (mounted, _) = mount(
            &dir,
            ns.clone(),
            ns,
            [None, None],
            None,
            Some(&guards),
            &mut warnings,
        )
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(mounted.len(), 2);
        assert!(is_mount_point(&dir.join(SKILLS)));
        assert_eq!(guards.watching(), 2);
        // An open that fails after its mounts drops them without `release`.
        drop(mounted);
        assert!(!is_mount_point(&dir.join(SKILLS)));
        assert!(!is_mount_point(&dir.join(OWNER_SKILLS)));
        assert_eq!(
            guards.watching(),
            0,
            "the guard still names mounts that are gone"
        );
    }
}

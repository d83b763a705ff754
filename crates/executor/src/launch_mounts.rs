//! The mounts a bubblewrap sandbox starts from.
//!
//! bubblewrap copies the whole mount namespace and reads the whole mount table again for each
//! bind it makes, so its start grows with every mount on the host: 35 ms with 10 workspaces,
//! 374 ms with 1,000 (`cargo bench --bench scale`). So, as root, a server makes the folder of
//! all its workspaces a private bind mount of itself while it runs ([`confine`], [`release`];
//! the bind itself is `cloud_harness_mount::self_bind`), and bubblewrap starts in a mount
//! namespace of its own where that one mount is detached and its own workspace's folder put
//! back ([`Narrowing::apply`]): it sees the system's mounts and its own workspace's only.
//! Once the sandbox is made, that namespace, where bubblewrap's own process stays, is emptied
//! ([`empty`]): a copy of the host's mounts of then, it would keep them alive as long.
//!
//! The namespace is a slave of the host's, so nothing made or detached in it reaches the host.
//! Nothing new under the workspaces folder reaches it (nor any other namespace of the host),
//! that folder being private; and its own workspace's mounts there are a copy.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cloud_harness_mount::{mount_table, self_bind};

/// The workspaces folders (canonical) bound onto themselves by [`confine`]: only these are
/// narrowed from.
static CONFINED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn confined() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    CONFINED.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`confine`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confined {
    /// Made a private bind of itself now.
    Made,
    /// Its bind left by an earlier server of the home with mounts still in it (a Docker
    /// executor's shared folders), taken as it is.
    Kept,
    /// Left as it is: not root, a kernel without `open_tree`, a mount of something else's
    /// there, or mounts in it already (a bind made now would hide them). Sandboxes start
    /// with every mount in view.
    No,
}

/// Makes `workspaces` (the folder of all of one server's workspaces, none mounted yet, its
/// earlier server's mounts swept) a private bind mount of itself, or keeps the one an earlier
/// server of the same home left with mounts in it.
pub fn confine(workspaces: &Path) -> Confined {
    if !nix::unistd::geteuid().is_root() || !can_open_trees() {
        return Confined::No;
    }
    let Ok(workspaces) = std::fs::canonicalize(workspaces) else {
        return Confined::No;
    };
    let table = match mount_table::mounts() {
        Ok(table) => table,
        Err(e) => {
            tracing::warn!(error = %e, "the mount table cannot be read; sandboxes start with every mount in view");
            return Confined::No;
        }
    };
    let done = if mount_table::topmost_mount(&table, &workspaces).is_some() {
        if !self_bind::is_ours(&table, &workspaces) {
            tracing::info!(folder = %workspaces.display(), "the workspaces folder is a mount of something else's; sandboxes start with every mount in view");
            return Confined::No;
        }
        Confined::Kept
    } else if mount_table::has_mounts_in(&table, &workspaces) {
        // Docker's shared folders of workspaces kept over a restart: a bind would hide them.
        tracing::info!(folder = %workspaces.display(), "mounts are in the workspaces folder already; sandboxes start with every mount in view");
        return Confined::No;
    } else if let Err(e) = self_bind::make(&workspaces) {
        tracing::warn!(folder = %workspaces.display(), error = %e, "the workspaces folder cannot be made a mount of its own; sandboxes start with every mount in view (slower)");
        return Confined::No;
    } else {
        Confined::Made
    };
    confined().insert(workspaces);
    done
}

/// Whether the kernel has `open_tree` (Linux 5.2): asked of a descriptor that is none.
fn can_open_trees() -> bool {
    use nix::libc;
    // SAFETY: a system call with no pointer to write through; it fails either way.
    let r = unsafe { libc::syscall(libc::SYS_open_tree, -1, c"".as_ptr(), 0) };
    !(r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

/// No sandbox starts narrowed from `workspaces` from now on, and its bind is undone if nothing
/// is mounted in it (a server's stop). Kept otherwise (Docker executors' shared folders stay
/// over a restart, and the next server of the home keeps it). Whether it was undone.
pub fn release(workspaces: &Path) -> bool {
    let Ok(workspaces) = std::fs::canonicalize(workspaces) else {
        return false;
    };
    if !confined().remove(&workspaces) {
        return false;
    }
    self_bind::undo(&workspaces).unwrap_or(false)
}

/// No sandbox starts narrowed from `workspaces` from now on; its bind stays as it is.
pub fn leave(workspaces: &Path) {
    if let Ok(workspaces) = std::fs::canonicalize(workspaces) {
        confined().remove(&workspaces);
    }
}

/// Detaches every mount but `/` from the mount namespace `ns` (bubblewrap's own process's,
/// started in a [`Narrowing`]), once the sandbox is made. How many were detached.
///
/// Refused where any mount there is shared: a detach would reach the host's (a start whose
/// narrowing did not go through).
pub fn empty(ns: std::fs::File) -> io::Result<usize> {
    use std::os::unix::fs::MetadataExt;
    let id = |m: std::fs::Metadata| (m.dev(), m.ino());
    let theirs = id(ns.metadata()?);
    if theirs == id(std::fs::metadata("/proc/self/ns/mnt")?) {
        return Ok(0); // this process's own: never
    }
    // A thread of its own enters the namespace (a namespace is per thread) and ends there.
    std::thread::scope(|s| {
        let entered = std::thread::Builder::new().spawn_scoped(s, || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)?;
            // Checked, not assumed: nothing is detached anywhere but there.
            if id(std::fs::metadata("/proc/thread-self/ns/mnt")?) != theirs {
                return Err(io::Error::other("not in the namespace entered"));
            }
            let table = mount_table::mounts_of_this_thread()?;
            if table.iter().any(|m| m.shared) {
                return Err(io::Error::other(
                    "a mount there is shared with another namespace",
                ));
            }
            let Some(root) = mount_table::topmost_mount(&table, Path::new("/")) else {
                return Ok(0);
            };
            // Only what is on the root: a detach takes what is in it along, and no path
            // inside a mount (a stuck one of the host's) is looked up.
            let mut detached = 0;
            for m in table
                .iter()
                .filter(|m| m.parent == root.id && m.id != root.id)
            {
                let flags =
                    nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW;
                if nix::mount::umount2(&m.point, flags).is_ok() {
                    detached += 1;
                }
            }
            Ok(detached)
        })?;
        entered
            .join()
            .map_err(|_| io::Error::other("its thread failed"))?
    })
}

/// What the launcher does to start bubblewrap in a narrower namespace.
pub struct Narrowing {
    workspaces: CString,
    own: CString,
    /// The namespace it is started from, gone back to should the narrower one fail.
    host: std::fs::File,
}

impl Narrowing {
    /// The workspace folder `own`, canonical, if its sandbox starts narrowed: its parent is
    /// a workspaces folder bound onto itself by [`confine`] (in this process).
    pub fn wanted(own: &Path) -> Option<PathBuf> {
        let own = std::fs::canonicalize(own).ok()?;
        own.parent()
            .is_some_and(|w| confined().contains(w))
            .then_some(own)
    }

    /// For the sandbox of the workspace folder `own` (the launcher's: told by the server).
    pub fn at(own: &Path) -> io::Result<Narrowing> {
        let own = std::fs::canonicalize(own)?;
        let workspaces = own
            .parent()
            .ok_or_else(|| io::Error::other("a workspace folder in no folder"))?;
        let text = |p: &Path| {
            CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("a NUL in a path"))
        };
        Ok(Narrowing {
            workspaces: text(workspaces)?,
            own: text(&own)?,
            host: std::fs::File::open("/proc/thread-self/ns/mnt")?,
        })
    }

    /// A mount namespace of its own, a slave of the host's; in it the workspaces folder's one
    /// mount detached, and a copy of this workspace's folder (with its mounts) put back where
    /// it was. Allocates nothing.
    ///
    /// Where the kernel cannot, or the folder is no longer a mount (the server stopping), the
    /// launcher goes back to the host's namespace and bubblewrap starts as it did before. Only
    /// once the folder is detached and its workspace cannot be put back is it an error: the
    /// sandbox would miss its workspace.
    ///
    /// # Safety
    ///
    /// Only in a process of one thread about to exec (the launcher): it changes the calling
    /// thread's mount namespace.
    pub unsafe fn apply(&self) -> io::Result<()> {
        use nix::libc;
        const OPEN_TREE_CLONE: libc::c_uint = 1;
        const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
        let back = || {
            // SAFETY: a descriptor of a mount namespace this process opened.
            unsafe { libc::setns(self.host.as_raw_fd(), libc::CLONE_NEWNS) };
            Ok(())
        };
        // SAFETY: plain system calls on NUL-terminated strings, and a descriptor this
        // process made and closes.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Ok(());
            }
            let slave = libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            );
            if slave != 0 {
                return back(); // still sharing with the host: nothing may be detached
            }
            // Its own folder, with the mounts in it, before the folder of all is detached.
            let tree = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                self.own.as_ptr(),
                OPEN_TREE_CLONE
                    | libc::O_CLOEXEC as libc::c_uint
                    | libc::AT_RECURSIVE as libc::c_uint,
            ) as libc::c_int;
            if tree < 0 {
                return back();
            }
            if libc::umount2(
                self.workspaces.as_ptr(),
                libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW,
            ) != 0
            {
                libc::close(tree);
                return back();
            }
            let moved = libc::syscall(
                libc::SYS_move_mount,
                tree,
                c"".as_ptr(),
                libc::AT_FDCWD,
                self.own.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            );
            let failed = (moved != 0).then(io::Error::last_os_error);
            libc::close(tree);
            match failed {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    }
}

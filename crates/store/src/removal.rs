//! Removing a tree that others wrote (a project's working tree when its workspace closes, a
//! staging tree), whatever its shape.
//!
//! `std::fs::remove_dir_all` recurses, holding a descriptor and a stack frame per level: a
//! chain of a few thousand folders runs it out of descriptors, a chain of 20,000 overflows the
//! stack of the thread (and a stack overflow aborts the whole server). Here the walk keeps a
//! stack of its own and holds at most [`HELD`] levels open: a folder found deeper than that is
//! first moved up to the top of the tree (a rename within one file system, which costs
//! nothing), and emptied from there later. Links are removed, never followed; a folder on
//! another file system or mount (a mount point, a bind mount) is not entered, and is
//! reported. Each folder is listed as it is emptied, never held in memory whole; an entry a
//! racing writer keeps turning from a file into a folder and back is given up on, and said.

use crate::walk::{open_folder, Listing, Place};
use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{renameat2, OFlag, RenameFlags};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

/// Levels held open at once; deeper folders are moved up to the top first.
const HELD: usize = 64;
/// Listings of one folder that still found something after it was emptied (a writer adding
/// entries meanwhile): past this many, the folder is left.
const PASSES: u32 = 4;
/// Times one entry is looked at again because it turned from a file into a folder or back
/// since it was listed (a writer racing the removal): past this many, it is left, and said.
const RETRIES: u8 = 4;

/// Removes `path` and everything below it; a link or file at `path` is removed itself.
/// Everything removable is removed even when a part fails; the first failure is returned.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    let root = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let emptied = empty(root);
    let removed = std::fs::remove_dir(path);
    emptied.and(removed)
}

struct Level {
    fd: OwnedFd,
    /// Its name in the level below (none for the root).
    name: Option<OsString>,
    /// What is left of its listing, read from the kernel as it goes (a folder of millions of
    /// entries is never held in memory whole).
    listing: Listing,
    /// Entries to look at again, with the times they were.
    again: Vec<(OsString, Type, u8)>,
    passes: u32,
}

impl Level {
    fn new(fd: OwnedFd, name: Option<OsString>) -> io::Result<Level> {
        let listing = Listing::of(&fd)?;
        Ok(Level {
            fd,
            name,
            listing,
            again: Vec::new(),
            passes: 1,
        })
    }

    /// The next entry to remove: one to look at again, else the next of the listing.
    fn next(&mut self) -> Option<nix::Result<(OsString, Type, u8)>> {
        if let Some(entry) = self.again.pop() {
            return Some(Ok(entry));
        }
        let entry = self.listing.next_in(&self.fd)?;
        Some(entry.map(|(name, kind)| (name, kind, 0)))
    }

    /// `name` turned from a file into a folder or back: looked at again as `kind`, unless
    /// it did so too often.
    fn again(&mut self, name: OsString, kind: Type, tries: u8) -> io::Result<()> {
        if tries >= RETRIES {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{} turned from a file into a folder or back {RETRIES} times while it was being removed (something is writing there); it is left",
                    name.to_string_lossy()
                ),
            ));
        }
        self.again.push((name, kind, tries + 1));
        Ok(())
    }
}

/// Removes everything inside the folder open at `root`.
fn empty(root: OwnedFd) -> io::Result<()> {
    let home = Place::of(&root)?;
    let mut failed: Option<io::Error> = None;
    let mut fail = |e: io::Error| {
        failed.get_or_insert(e);
    };
    let mut moved = 0u64;
    let mut stack = vec![Level::new(root, None)?];
    loop {
        let depth = stack.len();
        let Some(level) = stack.last_mut() else {
            break;
        };
        let next = match level.next() {
            Some(Ok(entry)) => Some(entry),
            Some(Err(e)) => {
                // Unreadable from here on: the folder is left with what it still holds.
                fail(e.into());
                level.passes = PASSES;
                None
            }
            None => None,
        };
        let Some((name, kind, tries)) = next else {
            // Emptied: once more in case something was added meanwhile, then removed.
            if level.passes < PASSES {
                level.passes += 1;
                match Listing::of(&level.fd) {
                    Ok(mut listing) => match listing.next_in(&level.fd) {
                        Some(Ok((name, kind))) => {
                            level.again.push((name, kind, 0));
                            level.listing = listing;
                            continue;
                        }
                        Some(Err(e)) => fail(e.into()),
                        None => {}
                    },
                    Err(e) => fail(e.into()),
                }
            }
            let done = stack.pop().expect("a level");
            if let (Some(name), Some(parent)) = (done.name, stack.last()) {
                match unlinkat(&parent.fd, name.as_os_str(), UnlinkatFlags::RemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    Err(e) => fail(e.into()),
                }
            }
            continue;
        };
        if kind != Type::Directory {
            match unlinkat(&level.fd, name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                // Replaced by a folder since it was listed: looked at again as one.
                Err(Errno::EISDIR) => {
                    if let Err(e) = level.again(name, Type::Directory, tries) {
                        fail(e);
                    }
                }
                Err(e) => fail(e.into()),
            }
            continue;
        }
        if depth > HELD {
            let (top, rest) = stack.split_at_mut(1);
            let parent = &rest[rest.len() - 1].fd;
            match move_to_top(&top[0].fd, parent, &name, &mut moved) {
                Ok(moved_to) => top[0].again.push((moved_to, Type::Directory, 0)),
                Err(e) => fail(e.into()),
            }
            continue;
        }
        let fd = match open_folder(&level.fd, &name) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => continue,
            // Replaced by a link or a file since it was listed: removed as one.
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                if let Err(e) = level.again(name, Type::File, tries) {
                    fail(e);
                }
                continue;
            }
            Err(e) => {
                fail(e.into());
                continue;
            }
        };
        match Place::of(&fd) {
            Ok(place) if place.same_mount(&home) => {}
            Ok(_) => {
                fail(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{} is another file system or mount inside; not removed",
                        name.to_string_lossy()
                    ),
                ));
                continue;
            }
            Err(e) => {
                fail(e.into());
                continue;
            }
        }
        match Level::new(fd, Some(name)) {
            Ok(level) => stack.push(level),
            Err(e) => fail(e),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Moves the folder `name` of `parent` to the top of the tree being removed, under a name of
/// its own there; that name.
fn move_to_top(
    top: &OwnedFd,
    parent: &OwnedFd,
    name: &OsString,
    moved: &mut u64,
) -> nix::Result<OsString> {
    loop {
        let to = OsString::from(format!(".cloud-harness-removing-{moved}"));
        *moved += 1;
        match renameat2(
            parent,
            name.as_os_str(),
            top,
            to.as_os_str(),
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => return Ok(to),
            Err(Errno::EEXIST) => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_chain_of_10000_folders_is_removed_on_a_small_stack() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("tree");
        std::fs::create_dir(&root).unwrap();
        crate::walk::make_chain(&root, "d", 10_000).unwrap();
        std::fs::write(root.join("top.txt"), "x").unwrap();
        let at = root.clone();
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || remove_tree(&at))
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn links_are_removed_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("keep")).unwrap();
        std::fs::write(outside.join("keep/file"), "mine").unwrap();
        let root = tmp.path().join("tree");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        symlink(&outside, root.join("a/out")).unwrap();
        symlink(outside.join("keep/file"), root.join("a/b/file")).unwrap();
        nix::unistd::mkfifo(&root.join("a/pipe"), Mode::S_IRWXU).unwrap();
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("keep/file")).unwrap(),
            "mine"
        );
    }

    #[test]
    fn a_link_or_file_at_the_top_is_removed_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("f"), "x").unwrap();
        symlink(&target, tmp.path().join("link")).unwrap();
        remove_tree(&tmp.path().join("link")).unwrap();
        assert!(target.join("f").exists());
        let missing = remove_tree(&tmp.path().join("link")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_wide_and_deep_tree_is_removed_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("tree");
        for i in 0..20 {
            let d = root.join(format!("d{i}"));
            std::fs::create_dir_all(&d).unwrap();
            for j in 0..20 {
                std::fs::write(d.join(format!("f{j}")), "x").unwrap();
            }
            crate::walk::make_chain(&d, "c", 150).unwrap();
        }
        remove_tree(&root).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn a_bind_mount_inside_is_not_emptied() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("keep"), "mine").unwrap();
        let root = tmp.path().join("tree");
        std::fs::create_dir_all(root.join("bound")).unwrap();
        std::fs::write(root.join("other"), "x").unwrap();
        let Some(bound) = crate::walk::BindMount::new(&elsewhere, &root.join("bound")) else {
            return;
        };
        let err = remove_tree(&root).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
        assert!(
            err.to_string()
                .contains("bound is another file system or mount"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(elsewhere.join("keep")).unwrap(),
            "mine"
        );
        assert!(!root.join("other").exists());
        drop(bound);
        remove_tree(&root).unwrap();
    }

    #[test]
    fn an_entry_that_keeps_changing_kind_is_given_up_on_typed() {
        let tmp = tempfile::tempdir().unwrap();
        let fd = crate::cas::open_dir(tmp.path()).unwrap();
        let mut level = Level::new(fd, None).unwrap();
        for tries in 0..RETRIES {
            level.again("x".into(), Type::Directory, tries).unwrap();
        }
        let err = level.again("x".into(), Type::File, RETRIES).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy);
        let typed = cloud_harness_error::Error::io(Path::new("tree"), err);
        assert_eq!(typed.code, cloud_harness_error::Code::Conflict, "{typed}");
        assert!(
            typed
                .message
                .contains("tree: x turned from a file into a folder or back 4 times"),
            "{typed}"
        );
    }

    #[test]
    fn a_writer_swapping_an_entry_never_keeps_a_removal_going() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("tree");
        let parked = tmp.path().join("parked");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        // `tree/x` turns from a file into a folder and back, as fast as the kernel goes.
        let swapper = {
            let (stop, x, parked) = (stop.clone(), root.join("x"), parked.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = renameat2(
                        nix::fcntl::AT_FDCWD,
                        &x,
                        nix::fcntl::AT_FDCWD,
                        &parked,
                        RenameFlags::RENAME_EXCHANGE,
                    );
                }
            })
        };
        for _ in 0..300 {
            std::fs::create_dir_all(&root).unwrap();
            let _ = std::fs::write(root.join("x"), "file");
            let _ = std::fs::create_dir(&parked);
            // Every removal ends, whatever the race; one that loses it says why.
            if let Err(e) = remove_tree(&root) {
                let known = [nix::libc::ENOTEMPTY, nix::libc::ENOTDIR, nix::libc::ENOENT];
                assert!(
                    e.kind() == io::ErrorKind::ResourceBusy
                        || e.raw_os_error().is_some_and(|n| known.contains(&n)),
                    "{e}"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
    }
}

//! Removing a tree that others wrote (a project's working tree when its workspace closes, a
//! staging tree), whatever its shape.
//!
//! `std::fs::remove_dir_all` recurses, holding a descriptor and a stack frame per level: a
//! chain of a few thousand folders runs it out of descriptors, a chain of 20,000 overflows the
//! stack of the thread (and a stack overflow aborts the whole server). Here the walk keeps a
//! stack of its own and holds at most [`HELD`] levels open: a folder found deeper than that is
//! first moved up to the top of the tree (a rename within one file system, which costs
//! nothing), and emptied from there later. Links are removed, never followed; a folder on
//! another file system (a mount point) is not entered, and is reported.

use crate::walk::{list, open_folder};
use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{renameat2, OFlag, RenameFlags};
use nix::sys::stat::{fstat, Mode};
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
    pending: Vec<(OsString, Type)>,
    passes: u32,
}

/// Removes everything inside the folder open at `root`.
fn empty(root: OwnedFd) -> io::Result<()> {
    let device = fstat(&root)?.st_dev;
    let mut failed: Option<io::Error> = None;
    let mut fail = |e: io::Error| {
        failed.get_or_insert(e);
    };
    let mut moved = 0u64;
    let pending = list(&root)?;
    let mut stack = vec![Level {
        fd: root,
        name: None,
        pending,
        passes: 1,
    }];
    loop {
        let depth = stack.len();
        let Some(level) = stack.last_mut() else {
            break;
        };
        let Some((name, kind)) = level.pending.pop() else {
            // Emptied: once more in case something was added meanwhile, then removed.
            if level.passes < PASSES {
                level.passes += 1;
                match list(&level.fd) {
                    Ok(more) if !more.is_empty() => {
                        level.pending = more;
                        continue;
                    }
                    Ok(_) => {}
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
                Err(Errno::EISDIR) => level.pending.push((name, Type::Directory)),
                Err(e) => fail(e.into()),
            }
            continue;
        }
        if depth > HELD {
            let (top, rest) = stack.split_at_mut(1);
            let parent = &rest[rest.len() - 1].fd;
            match move_to_top(&top[0].fd, parent, &name, &mut moved) {
                Ok(moved_to) => top[0].pending.push((moved_to, Type::Directory)),
                Err(e) => fail(e.into()),
            }
            continue;
        }
        let fd = match open_folder(&level.fd, &name) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => continue,
            // Replaced by a link or a file since it was listed: removed as one.
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                level.pending.push((name, Type::File));
                continue;
            }
            Err(e) => {
                fail(e.into());
                continue;
            }
        };
        match fstat(&fd) {
            Ok(st) if st.st_dev == device => {}
            Ok(_) => {
                fail(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{} is another file system mounted inside; not removed",
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
        match list(&fd) {
            Ok(pending) => stack.push(Level {
                fd,
                name: Some(name),
                pending,
                passes: 1,
            }),
            Err(e) => fail(e.into()),
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
}

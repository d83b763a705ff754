//! Walking a hostile folder tree (a project's working tree, a staging tree) by descriptor.
//!
//! Each step is `openat` with `O_NOFOLLOW` from its parent: a link is never a folder to go
//! into, and a tree that changes meanwhile cannot lead the walk anywhere else. A folder on
//! another file system (a mount point) is not entered either. The walk keeps a stack of its
//! own instead of recursing (a chain of 10,000 folders costs no call stack), holds one
//! descriptor per level, and stops at a depth bound and at an entry budget; each part left
//! out is said as a [`Cut`].

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// How far a walk may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Folders below this many levels under the root are not entered.
    pub depth: usize,
    /// Entries listed, in all (files, links and folders alike).
    pub entries: u64,
}

/// A part of the tree the walk left out, by its path from the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// A folder deeper than [`Bounds::depth`]: it and everything below it.
    TooDeep(PathBuf),
    /// The entry budget ran out while listing this folder: the walk ended there.
    TooMany(PathBuf),
    /// Another file system is mounted on this folder.
    Mount(PathBuf),
    /// This folder could not be opened or listed.
    Unreadable(PathBuf, Errno),
}

impl Cut {
    /// What was left out and why, naming the bound; `root` names the walk's root.
    pub fn describe(&self, root: &str, bounds: &Bounds) -> String {
        let at = |p: &Path| {
            if p.as_os_str().is_empty() {
                root.to_owned()
            } else {
                format!("{root}/{}", p.display())
            }
        };
        match self {
            Cut::TooDeep(p) => format!(
                "{} is nested deeper than {} folders; it is left out",
                at(p),
                bounds.depth
            ),
            Cut::TooMany(p) => format!(
                "{} holds more than {} entries in all; the rest from {} on is left out",
                root,
                bounds.entries,
                at(p)
            ),
            Cut::Mount(p) => format!(
                "{} is another file system mounted inside; it is left out",
                at(p)
            ),
            Cut::Unreadable(p, e) => format!("{} cannot be read ({e}); it is left out", at(p)),
        }
    }
}

/// A folder the walk reached.
pub struct Folder<'a> {
    /// The folder, open for reading.
    pub fd: &'a OwnedFd,
    /// Its path from the root (empty for the root).
    pub path: &'a Path,
    pub depth: usize,
}

/// What to do after seeing a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// List it and walk its folders.
    Enter,
    /// Leave what it holds alone.
    Skip,
    /// End the walk.
    Stop,
}

struct Level {
    fd: OwnedFd,
    path: PathBuf,
    depth: usize,
    /// Its folders not walked yet, last first.
    folders: Vec<OsString>,
}

/// Walks the folders of the tree open at `root`, each before what it holds (the root first);
/// `visit` says for each whether to go in. Returns the parts left out.
pub fn folders(root: OwnedFd, bounds: Bounds, mut visit: impl FnMut(&Folder) -> Step) -> Vec<Cut> {
    let mut cuts = Vec::new();
    let device = match fstat(&root) {
        Ok(st) => st.st_dev,
        Err(e) => return vec![Cut::Unreadable(PathBuf::new(), e)],
    };
    let mut listed = 0u64;
    let mut stack: Vec<Level> = Vec::new();
    let mut next = Some((root, PathBuf::new(), 0usize));
    loop {
        if let Some((fd, path, depth)) = next.take() {
            let step = visit(&Folder {
                fd: &fd,
                path: &path,
                depth,
            });
            match step {
                Step::Stop => return cuts,
                Step::Skip => {}
                Step::Enter => match list(&fd) {
                    Ok(entries) => {
                        listed += entries.len() as u64;
                        if listed > bounds.entries {
                            cuts.push(Cut::TooMany(path));
                            return cuts;
                        }
                        let mut folders: Vec<OsString> = entries
                            .into_iter()
                            .filter(|(_, kind)| *kind == Type::Directory)
                            .map(|(name, _)| name)
                            .collect();
                        // Taken from the end: in name order.
                        folders.sort_unstable_by(|a, b| b.cmp(a));
                        stack.push(Level {
                            fd,
                            path,
                            depth,
                            folders,
                        });
                    }
                    Err(e) => cuts.push(Cut::Unreadable(path, e)),
                },
            }
        }
        let Some(level) = stack.last_mut() else {
            return cuts;
        };
        let Some(name) = level.folders.pop() else {
            stack.pop();
            continue;
        };
        let path = level.path.join(&name);
        let depth = level.depth + 1;
        if depth > bounds.depth {
            cuts.push(Cut::TooDeep(path));
            continue;
        }
        match open_folder(&level.fd, &name) {
            Ok(fd) => match fstat(&fd) {
                Ok(st) if st.st_dev != device => cuts.push(Cut::Mount(path)),
                Ok(_) => next = Some((fd, path, depth)),
                Err(e) => cuts.push(Cut::Unreadable(path, e)),
            },
            // Replaced by a link or a file since it was listed: not a folder to go into.
            Err(Errno::ELOOP | Errno::ENOTDIR | Errno::ENOENT) => {}
            Err(e) => cuts.push(Cut::Unreadable(path, e)),
        }
    }
}

/// Opens the folder `name` of `parent`, never through a link.
pub fn open_folder(parent: &impl AsFd, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(
        parent.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// The entries of the open folder `fd` (without `.` and `..`) and their types, as the
/// listing says or, where it does not, as `fstatat` without following links says.
pub fn list(fd: &OwnedFd) -> nix::Result<Vec<(OsString, Type)>> {
    let mut dir = Dir::from_fd(fd.try_clone().map_err(|_| Errno::EMFILE)?)?;
    let mut out = Vec::new();
    for item in dir.iter() {
        let item = item?;
        let name = item.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = OsStr::from_bytes(name).to_owned();
        let kind = match item.file_type() {
            Some(kind) => kind,
            None => match type_at(fd, &name) {
                Ok(kind) => kind,
                // Gone since it was listed.
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e),
            },
        };
        out.push((name, kind));
    }
    Ok(out)
}

/// The type of `name` in `dir`, the link itself for a link.
pub fn type_at(dir: &OwnedFd, name: &OsStr) -> nix::Result<Type> {
    let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    Ok(
        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => Type::Directory,
            SFlag::S_IFLNK => Type::Symlink,
            SFlag::S_IFREG => Type::File,
            SFlag::S_IFIFO => Type::Fifo,
            SFlag::S_IFSOCK => Type::Socket,
            SFlag::S_IFBLK => Type::BlockDevice,
            _ => Type::CharacterDevice,
        },
    )
}

/// A chain of `levels` folders named `name` below `dir`, made by descriptor (its path is far
/// longer than a path may be). For tests of deep trees.
#[doc(hidden)]
pub fn make_chain(dir: &Path, name: &str, levels: usize) -> nix::Result<()> {
    let mut fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    for _ in 0..levels {
        nix::sys::stat::mkdirat(&fd, name, Mode::from_bits_truncate(0o755))?;
        fd = open_folder(&fd, OsStr::new(name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn open(path: &Path) -> OwnedFd {
        crate::cas::open_dir(path).unwrap()
    }

    fn walked(root: &Path, bounds: Bounds) -> (Vec<PathBuf>, Vec<Cut>) {
        let mut seen = Vec::new();
        let cuts = folders(open(root), bounds, |f| {
            seen.push(f.path.to_path_buf());
            Step::Enter
        });
        (seen, cuts)
    }

    const WIDE: Bounds = Bounds {
        depth: 64,
        entries: 100_000,
    };

    #[test]
    fn links_are_never_folders_to_go_into() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        symlink("/usr", root.join("usr")).unwrap();
        symlink("/proc", root.join("a/proc")).unwrap();
        symlink("..", root.join("a/b/up")).unwrap();
        nix::unistd::mkfifo(&root.join("a/pipe"), Mode::S_IRWXU).unwrap();
        let (seen, cuts) = walked(&root, WIDE);
        assert_eq!(
            seen,
            [PathBuf::new(), PathBuf::from("a"), PathBuf::from("a/b")]
        );
        assert!(cuts.is_empty(), "{cuts:?}");
    }

    #[test]
    fn a_deep_chain_is_cut_at_the_depth_bound_without_recursion() {
        let tmp = tempfile::tempdir().unwrap();
        make_chain(tmp.path(), "d", 3_000).unwrap();
        // A thread with a small stack: a recursive walk of 10,000 levels would overflow it.
        let root = tmp.path().to_path_buf();
        let (seen, cuts) = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || walked(&root, WIDE))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(seen.len(), 65);
        assert_eq!(cuts.len(), 1);
        let Cut::TooDeep(at) = &cuts[0] else {
            panic!("{cuts:?}")
        };
        assert_eq!(at.components().count(), 65);
        let said = cuts[0].describe(".agents/skills", &WIDE);
        assert!(said.contains("deeper than 64 folders"), "{said}");
        crate::removal::remove_tree(tmp.path()).unwrap();
    }

    #[test]
    fn the_entry_budget_ends_the_walk_and_says_where() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::create_dir_all(tmp.path().join(format!("d{i}/x"))).unwrap();
        }
        let bounds = Bounds {
            depth: 8,
            entries: 15,
        };
        let (seen, cuts) = walked(tmp.path(), bounds);
        assert!(seen.len() < 21, "{seen:?}");
        assert!(matches!(cuts.as_slice(), [Cut::TooMany(_)]), "{cuts:?}");
        assert!(cuts[0]
            .describe("skills", &bounds)
            .contains("more than 15 entries"));
    }

    #[test]
    fn a_skipped_folder_is_not_listed_and_stop_ends_the_walk() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a/inner")).unwrap();
        std::fs::create_dir_all(tmp.path().join("b/inner")).unwrap();
        let mut seen = Vec::new();
        folders(open(tmp.path()), WIDE, |f| {
            seen.push(f.path.to_path_buf());
            match f.path.to_str() {
                Some("a") => Step::Skip,
                Some("b") => Step::Stop,
                _ => Step::Enter,
            }
        });
        assert_eq!(seen, [PathBuf::new(), "a".into(), "b".into()]);
    }
}

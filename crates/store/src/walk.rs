//! Walking a hostile folder tree (a project's working tree, a staging tree) by descriptor.
//!
//! Each step is `openat` with `O_NOFOLLOW` from its parent: a link is never a folder to go
//! into, and a tree that changes meanwhile cannot lead the walk anywhere else. A folder on
//! another file system (a mount point) is not entered either. The walk keeps a stack of its
//! own instead of recursing (a chain of 10,000 folders costs no call stack), holds one
//! descriptor per level, and stops at a depth bound and at an entry budget, counted as
//! the kernel lists each folder (a folder of ten million entries is never read whole); each
//! part left out is said as a [`Cut`]. A bind mount counts as a mount where the kernel names
//! mounts (`statx`'s mount id).

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
    /// This many more parts, past the first [`MAX_CUTS`].
    More(u64),
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
            Cut::More(n) => {
                format!("{n} more parts of {root} are left out (the first {MAX_CUTS} are named)")
            }
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
/// `visit` says for each whether to go in. Returns the parts left out: at most [`MAX_CUTS`]
/// of them by name, then how many more.
pub fn folders(root: OwnedFd, bounds: Bounds, mut visit: impl FnMut(&Folder) -> Step) -> Vec<Cut> {
    let mut cuts = Cuts::default();
    let home = match Place::of(&root) {
        Ok(place) => place,
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
                Step::Stop => return cuts.done(),
                Step::Skip => {}
                Step::Enter => match folders_in(&fd, &mut listed, bounds.entries) {
                    Ok(Some(mut folders)) => {
                        // Taken from the end: in name order.
                        folders.sort_unstable_by(|a, b| b.cmp(a));
                        stack.push(Level {
                            fd,
                            path,
                            depth,
                            folders,
                        });
                    }
                    Ok(None) => {
                        cuts.push(Cut::TooMany(path));
                        return cuts.done();
                    }
                    Err(e) => cuts.push(Cut::Unreadable(path, e)),
                },
            }
        }
        let Some(level) = stack.last_mut() else {
            return cuts.done();
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
            Ok(fd) => match Place::of(&fd) {
                Ok(place) if !place.same_mount(&home) => cuts.push(Cut::Mount(path)),
                Ok(_) => next = Some((fd, path, depth)),
                Err(e) => cuts.push(Cut::Unreadable(path, e)),
            },
            // Replaced by a link or a file since it was listed: not a folder to go into.
            Err(Errno::ELOOP | Errno::ENOTDIR | Errno::ENOENT) => {}
            Err(e) => cuts.push(Cut::Unreadable(path, e)),
        }
    }
}

/// The folders in the folder `fd`, each of its entries counted in `listed`; none when
/// `listed` passes `budget` (the listing stops there).
fn folders_in(fd: &OwnedFd, listed: &mut u64, budget: u64) -> nix::Result<Option<Vec<OsString>>> {
    let mut listing = Listing::of(fd)?;
    let mut folders = Vec::new();
    while let Some(entry) = listing.next_in(fd) {
        let (name, kind) = entry?;
        *listed += 1;
        if *listed > budget {
            return Ok(None);
        }
        if kind == Type::Directory {
            folders.push(name);
        }
    }
    Ok(Some(folders))
}

/// Parts left out said by name, at most this many (a tree of many small cuts would make as
/// many warnings); the rest are counted.
pub const MAX_CUTS: usize = 100;

#[derive(Default)]
struct Cuts {
    named: Vec<Cut>,
    more: u64,
}

impl Cuts {
    fn push(&mut self, cut: Cut) {
        match self.named.len() < MAX_CUTS {
            true => self.named.push(cut),
            false => self.more += 1,
        }
    }

    fn done(mut self) -> Vec<Cut> {
        if self.more > 0 {
            self.named.push(Cut::More(self.more));
        }
        self.named
    }
}

/// Where a folder is: its file system and its mount. Two folders at one place are on one
/// mount; a bind mount of the same file system is another place (its mount id differs where
/// the kernel says it, Linux 5.8 and later; before, only the file system is compared).
#[derive(Debug, Clone, Copy)]
pub struct Place {
    dev: u64,
    mount: Option<u64>,
}

impl Place {
    /// Whether `self` and `other` are on one mount: one file system, and one mount where the
    /// kernel named both.
    pub fn same_mount(&self, other: &Place) -> bool {
        self.dev == other.dev
            && match (self.mount, other.mount) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    pub fn of(fd: &impl AsFd) -> nix::Result<Place> {
        let dev = fstat(fd.as_fd())?.st_dev;
        Ok(Place {
            dev,
            mount: mount_id(fd),
        })
    }
}

/// The mount id of what `fd` is open at (`statx`, `STATX_MNT_ID`), when the kernel says it.
fn mount_id(fd: &impl AsFd) -> Option<u64> {
    use nix::libc;
    use std::os::fd::AsRawFd;
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: an empty path with AT_EMPTY_PATH names the open descriptor itself; `buf` is
    // a `statx` the kernel fills (zeroed first, so it is initialized whatever it fills).
    let done = unsafe {
        libc::statx(
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID,
            buf.as_mut_ptr(),
        )
    };
    if done != 0 {
        return None;
    }
    // SAFETY: zeroed above, then filled by the kernel.
    let buf = unsafe { buf.assume_init() };
    (buf.stx_mask & libc::STATX_MNT_ID != 0).then_some(buf.stx_mnt_id)
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

/// The entries of an open folder (without `.` and `..`), read from the kernel as they are
/// asked for: a folder of ten million entries costs what is taken of it, never a list of them
/// all. Each has its type as the listing says or, where it does not, as `fstatat` without
/// following links says.
pub struct Listing {
    entries: nix::dir::OwningIter,
}

impl Listing {
    /// The entries of the folder open at `fd`, from its first.
    pub fn of(fd: &OwnedFd) -> nix::Result<Listing> {
        let dup = fd.try_clone().map_err(|_| Errno::EMFILE)?;
        // A duplicate shares its position with `fd` (and with earlier listings of it).
        nix::unistd::lseek(&dup, 0, nix::unistd::Whence::SeekSet)?;
        Ok(Listing {
            entries: Dir::from_fd(dup)?.into_iter(),
        })
    }

    /// The next entry of the folder `fd` (the one this listing is of), none at its end.
    pub fn next_in(&mut self, fd: &OwnedFd) -> Option<nix::Result<(OsString, Type)>> {
        loop {
            let item = match self.entries.next()? {
                Ok(item) => item,
                Err(e) => return Some(Err(e)),
            };
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
                    Err(e) => return Some(Err(e)),
                },
            };
            return Some(Ok((name, kind)));
        }
    }
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

/// A bind mount for tests, undone when dropped.
#[cfg(test)]
pub(crate) struct BindMount(PathBuf);

#[cfg(test)]
impl BindMount {
    /// `source` mounted at `target` (a folder). None where mounting is not allowed (not
    /// root, no CAP_SYS_ADMIN): the test is skipped then on a developer's machine, and fails
    /// under CI.
    pub(crate) fn new(source: &Path, target: &Path) -> Option<BindMount> {
        use nix::mount::{mount, MsFlags};
        match mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ) {
            Ok(()) => Some(BindMount(target.to_path_buf())),
            Err(e) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: no bind mount here ({e})");
                None
            }
            Err(e) => panic!("a bind mount is needed for this test: {e}"),
        }
    }
}

#[cfg(test)]
impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
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

    #[test]
    fn a_bind_mount_of_the_same_file_system_is_not_entered() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("inner")).unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("bound")).unwrap();
        std::fs::create_dir_all(root.join("plain")).unwrap();
        let Some(_bound) = BindMount::new(&elsewhere, &root.join("bound")) else {
            return;
        };
        let (seen, cuts) = walked(&root, WIDE);
        assert_eq!(seen, [PathBuf::new(), PathBuf::from("plain")]);
        assert_eq!(cuts, [Cut::Mount("bound".into())]);
    }

    #[test]
    fn past_a_hundred_cuts_the_rest_are_counted() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..150 {
            std::fs::create_dir_all(tmp.path().join(format!("d{i:03}/deeper"))).unwrap();
        }
        let bounds = Bounds {
            depth: 1,
            entries: 10_000,
        };
        let (seen, cuts) = walked(tmp.path(), bounds);
        assert_eq!(seen.len(), 151);
        assert_eq!(cuts.len(), MAX_CUTS + 1);
        assert_eq!(cuts[MAX_CUTS], Cut::More(50));
        let said = cuts[MAX_CUTS].describe("skills", &bounds);
        assert_eq!(
            said,
            "50 more parts of skills are left out (the first 100 are named)"
        );
    }
}

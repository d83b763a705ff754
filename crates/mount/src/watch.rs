//! Watching the folders of a stack for changes (inotify), within budgets.
//!
//! Each folder is reached by descriptor — a project's from the project's root, beneath it —
//! and watched through that very descriptor (`/proc/self/fd/N`), so a link swapped in cannot
//! make the watch land anywhere else. Below a watched folder, the walk of [`cloud_harness_store::walk`]
//! goes into no link and no other file system, to a depth bound and an entry budget.
//! Watches are a kernel resource (`fs.inotify.max_user_watches`, for every process of the
//! user): a stack may hold at most [`Budget::watches`] of them, and all the stacks of one
//! server at most what their shared [`Pool`] allows. Past a bound, the folders beyond it are
//! not watched — a change there is seen with the next change elsewhere — and a warning says
//! which bound and its value.

use cloud_harness_skills::stack::LivePath;
use cloud_harness_store::walk::{self, Bounds, Folder, Step};
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What makes a folder changed: its entries and their contents, never a read.
const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MODIFY)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR);

/// The watches all the stacks of one server may hold together.
#[derive(Debug, Clone)]
pub struct Pool {
    limit: usize,
    used: Arc<AtomicUsize>,
}

impl Pool {
    pub fn new(limit: usize) -> Pool {
        Pool {
            limit,
            used: Arc::default(),
        }
    }

    /// Half of the user's `fs.inotify.max_user_watches` (other programs of the user need
    /// some), at most 65,536; 4,096 where the setting cannot be read.
    pub fn system_default() -> usize {
        std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .map_or(4096, |n| (n / 2).min(65_536))
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Watches held now, by every stack of the pool.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }

    fn put_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// What one stack may watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Watches, one per folder.
    pub watches: usize,
    /// How far below each watched folder the walk goes.
    pub walk: Bounds,
}

impl Default for Budget {
    /// A project's skills are a few folders each: 1,024 covers hundreds of skills. The walk
    /// goes as deep and as wide as an import of a project's folder does.
    fn default() -> Self {
        let project = cloud_harness_store::cas::Limits::PROJECT;
        Budget {
            watches: 1024,
            walk: Bounds {
                depth: project.max_depth,
                entries: project.max_files,
            },
        }
    }
}

/// The folders of one stack, watched.
pub struct Watcher {
    inotify: Inotify,
    watched: HashSet<WatchDescriptor>,
    pool: Pool,
    budget: Budget,
    /// What the last [`Watcher::watch`] left unwatched, and why.
    warnings: Vec<String>,
}

impl Watcher {
    pub fn new(pool: Pool, budget: Budget) -> io::Result<Watcher> {
        Ok(Watcher {
            inotify: Inotify::init()?,
            watched: HashSet::new(),
            pool,
            budget,
            warnings: Vec::new(),
        })
    }

    /// Watches `places` as they are now: folders that appeared are watched, those gone are
    /// not any more. Whether a folder was watched that was not before (what was written into
    /// it before then sent no event).
    pub fn watch(&mut self, places: &[LivePath]) -> bool {
        // Each folder watched in this pass, and whether it was walked whole.
        let mut now = HashMap::new();
        let mut warnings = Vec::new();
        let mut full = false;
        let bounds = self.budget.walk;
        for place in places {
            if full {
                break;
            }
            // Missing (a `.claude/skills` not made yet) or leading outside the project (the
            // generation says so): nothing to watch.
            let Ok(fd) = place.open() else {
                continue;
            };
            let shown = place.shown();
            let inside = match place.whole {
                true => Step::Enter,
                false => Step::Skip,
            };
            let mut visit = |folder: &Folder| match self.add(folder.fd, &mut now, place.whole) {
                Added::New | Added::Held => inside,
                // Reached before through another place (a link inside the project): walked
                // whole once at most.
                Added::Again { walked } if place.whole && !walked => Step::Enter,
                Added::Again { .. } => Step::Skip,
                Added::Refused(why) => {
                    warnings.push(format!(
                        "live updates: {why}; changes in {shown}{} and what follows it are seen only with a change elsewhere",
                        match folder.path.as_os_str().is_empty() {
                            true => String::new(),
                            false => format!("/{}", folder.path.display()),
                        }
                    ));
                    full = true;
                    Step::Stop
                }
            };
            let cuts = walk::folders(fd, bounds, &mut visit);
            for cut in cuts {
                warnings.push(format!("live updates: {}", cut.describe(&shown, &bounds)));
            }
        }
        let now: HashSet<WatchDescriptor> = now.into_keys().collect();
        let gone: Vec<WatchDescriptor> = self.watched.difference(&now).cloned().collect();
        for wd in gone {
            // Already gone with its folder, or removed now.
            let _ = self.inotify.watches().remove(wd);
            self.pool.put_back(1);
        }
        let grew = now.difference(&self.watched).next().is_some();
        self.watched = now;
        if warnings != self.warnings {
            for w in &warnings {
                tracing::warn!("{w}");
            }
        }
        self.warnings = warnings;
        grew
    }

    /// Watches the folder open at `fd` (to be walked `whole`), unless a budget is spent.
    fn add(
        &mut self,
        fd: &impl AsRawFd,
        now: &mut HashMap<WatchDescriptor, bool>,
        whole: bool,
    ) -> Added {
        let at = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let wd = match self.inotify.watches().add(&at, MASK) {
            Ok(wd) => wd,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => {
                return Added::Refused(
                    "the system's inotify watches (fs.inotify.max_user_watches) are all in use"
                        .into(),
                )
            }
            // Gone meanwhile, or not a folder any more.
            Err(_) => return Added::Again { walked: true },
        };
        if let Some(walked) = now.get_mut(&wd) {
            let before = *walked;
            *walked |= whole;
            return Added::Again { walked: before };
        }
        // Watched before this walk: already counted in the pool.
        let held = self.watched.contains(&wd);
        let refused = if now.len() >= self.budget.watches {
            Some(format!(
                "more than {} folders to watch, the limit per workspace",
                self.budget.watches
            ))
        } else if !held && !self.pool.take() {
            Some(format!(
                "the {} watches of the whole server are all in use",
                self.pool.limit()
            ))
        } else {
            None
        };
        match refused {
            // One held before is let go with those gone, after the walk.
            Some(why) => {
                if !held {
                    let _ = self.inotify.watches().remove(wd);
                }
                Added::Refused(why)
            }
            None => {
                now.insert(wd, whole);
                match held {
                    true => Added::Held,
                    false => Added::New,
                }
            }
        }
    }

    /// What the last [`Watcher::watch`] left out, and why.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Folders watched now.
    pub fn len(&self) -> usize {
        self.watched.len()
    }

    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// Reads what the kernel queued, without waiting: whether anything changed.
    pub fn changed(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        let mut changed = false;
        loop {
            match self.inotify.read_events(&mut buf) {
                Ok(events) => {
                    for e in events {
                        // A watch removed (by us, or with its folder: its parent says so).
                        if e.mask != EventMask::IGNORED {
                            changed = true;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return changed,
            }
        }
    }
}

impl AsFd for Watcher {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // Closing the instance removes its watches.
        self.pool.put_back(self.watched.len());
    }
}

enum Added {
    New,
    /// Watched before this walk.
    Held,
    /// Seen already in this pass (and walked whole or not).
    Again {
        walked: bool,
    },
    Refused(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;
    use std::time::{Duration, Instant};

    fn project(root: &Path) -> Vec<LivePath> {
        vec![
            LivePath {
                path: root.to_path_buf(),
                whole: false,
                beneath: Some(root.to_path_buf()),
            },
            LivePath {
                path: root.join(".agents/skills"),
                whole: true,
                beneath: Some(root.to_path_buf()),
            },
        ]
    }

    fn wait_changed(w: &mut Watcher) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if w.changed() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn links_out_of_the_project_are_not_watched() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        let skills = root.join(".agents/skills");
        std::fs::create_dir_all(skills.join("a/refs")).unwrap();
        for target in ["/usr", "/proc", "/dev", "/"] {
            let name = format!("to{}", target.replace('/', "-"));
            symlink(target, skills.join(name)).unwrap();
        }
        nix::unistd::mkfifo(&skills.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let pool = Pool::new(10_000);
        let mut w = Watcher::new(pool.clone(), Budget::default()).unwrap();
        w.watch(&project(&root));
        // The root, the skills folder, `a` and `a/refs`.
        assert_eq!(w.len(), 4);
        assert_eq!(pool.in_use(), 4);
        assert!(w.warnings().is_empty(), "{:?}", w.warnings());
        std::fs::write(skills.join("a/refs/new.md"), "x").unwrap();
        assert!(wait_changed(&mut w));
        drop(w);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn a_folder_reached_twice_is_watched_once_and_walked_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        std::fs::create_dir_all(root.join(".agents/real/a")).unwrap();
        // `.agents/skills` is `.agents` itself, watched alone before as a parent.
        symlink(".", root.join(".agents/skills")).unwrap();
        let mut places = project(&root);
        places.insert(
            1,
            LivePath {
                path: root.join(".agents"),
                whole: false,
                beneath: Some(root.clone()),
            },
        );
        let mut w = Watcher::new(Pool::new(100), Budget::default()).unwrap();
        w.watch(&places);
        // The root, `.agents`, `real` and `real/a`.
        assert_eq!(w.len(), 4);
    }

    #[test]
    fn a_skills_folder_that_is_a_link_out_is_not_watched() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        std::fs::create_dir_all(root.join(".agents")).unwrap();
        symlink("/usr", root.join(".agents/skills")).unwrap();
        let mut w = Watcher::new(Pool::new(10_000), Budget::default()).unwrap();
        w.watch(&project(&root));
        assert_eq!(w.len(), 1, "the project's root only");
    }

    #[test]
    fn budgets_bound_the_watches_and_say_so() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        let skills = root.join(".agents/skills");
        for i in 0..50 {
            std::fs::create_dir_all(skills.join(format!("s{i:02}/refs"))).unwrap();
        }
        cloud_harness_store::walk::make_chain(&skills, "deep", 200).unwrap();
        let budget = Budget {
            watches: 30,
            ..Budget::default()
        };
        let pool = Pool::new(10_000);
        let mut w = Watcher::new(pool.clone(), budget).unwrap();
        w.watch(&project(&root));
        assert_eq!(w.len(), 30);
        assert_eq!(pool.in_use(), 30);
        let said = w.warnings().join("\n");
        assert!(said.contains("more than 30 folders"), "{said}");
        assert!(!said.contains(tmp.path().to_str().unwrap()), "{said}");
        // Folders that appear ahead of those watched take their place, never add to them.
        for i in 0..10 {
            std::fs::create_dir_all(skills.join(format!("a{i}"))).unwrap();
        }
        w.watch(&project(&root));
        assert_eq!((w.len(), pool.in_use()), (30, 30));

        // A second stack finds the server's pool spent.
        let small = Pool::new(40);
        let mut a = Watcher::new(small.clone(), budget).unwrap();
        a.watch(&project(&root));
        let mut b = Watcher::new(small.clone(), budget).unwrap();
        b.watch(&project(&root));
        assert_eq!((a.len(), b.len()), (30, 10));
        assert!(b.warnings()[0].contains("the 40 watches of the whole server"));
        drop(a);
        assert_eq!(small.in_use(), 10);
        // Watched again as it is now: room again.
        b.watch(&project(&root));
        assert_eq!(b.len(), 30);
    }

    #[test]
    fn a_deep_chain_is_watched_to_the_depth_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        let skills = root.join(".agents/skills");
        std::fs::create_dir_all(&skills).unwrap();
        cloud_harness_store::walk::make_chain(&skills, "d", 1_000).unwrap();
        let mut w = Watcher::new(Pool::new(10_000), Budget::default()).unwrap();
        w.watch(&project(&root));
        // The root, the skills folder and 32 levels of the chain.
        assert_eq!(w.len(), 2 + 32);
        let said = w.warnings().join("\n");
        assert!(said.contains("deeper than 32 folders"), "{said}");
        assert!(said.contains("the project's .agents/skills/d/d/"), "{said}");
        cloud_harness_store::removal::remove_tree(tmp.path()).unwrap();
    }

    #[test]
    fn folders_that_appear_or_go_are_watched_or_let_go() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        std::fs::create_dir_all(&root).unwrap();
        let pool = Pool::new(100);
        let mut w = Watcher::new(pool.clone(), Budget::default()).unwrap();
        assert!(w.watch(&project(&root)));
        assert_eq!(w.len(), 1);
        std::fs::create_dir_all(root.join(".agents/skills/x")).unwrap();
        assert!(wait_changed(&mut w));
        assert!(w.watch(&project(&root)));
        assert_eq!(w.len(), 3);
        assert!(!w.watch(&project(&root)), "nothing new");
        std::fs::remove_dir_all(root.join(".agents/skills/x")).unwrap();
        w.watch(&project(&root));
        assert_eq!((w.len(), pool.in_use()), (2, 2));
    }
}

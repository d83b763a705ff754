//! The limits of a whole bubblewrap sandbox, as Docker sets them on a container: its memory
//! and its processes, through a cgroup the harness makes for each sandbox. Rlimits bound each
//! process of a run; only a cgroup bounds what a run's processes (and a `/tmp` they fill)
//! hold together.
//!
//! Where the groups go (`CLOUD_HARNESS_EXECUTOR_CGROUP`):
//! - `auto` (the default): cgroup v2 where this process's own cgroup may have children with
//!   the memory and pids controllers and holds this process alone (a systemd unit with
//!   `Delegate=yes`; the harness moves itself into a leaf `harness` first, as v2 requires),
//!   else the memory and pids hierarchies of cgroup v1 where this process may write (root,
//!   on a hybrid host);
//! - a path: a delegated cgroup v2 folder, used as it is (it must hold no process);
//! - `off`: none.
//!
//! Without one, bubblewrap runs are refused, unless `CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP`
//! is `allow` (each run then keeps only its rlimits). Either way it is said once in the log
//! and in `/readyz`.

use cloud_harness_error::{Code, Error, Result};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Where sandbox groups are made.
#[derive(Debug)]
enum Tree {
    /// A cgroup v2 folder whose children have the memory and pids controllers.
    V2(PathBuf),
    /// A folder in each of cgroup v1's memory and pids hierarchies.
    V1 { memory: PathBuf, pids: PathBuf },
}

/// What the operator asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Auto,
    Off,
    At(PathBuf),
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `CLOUD_HARNESS_EXECUTOR_CGROUP` and `…_WITHOUT_CGROUP`, checked.
pub fn choice_from_env() -> Result<(Choice, bool)> {
    let choice = match env("CLOUD_HARNESS_EXECUTOR_CGROUP").as_deref().map(str::trim) {
        None | Some("auto") => Choice::Auto,
        Some("off") => Choice::Off,
        Some(path) if path.starts_with('/') => Choice::At(PathBuf::from(path)),
        Some(other) => {
            return Err(Error::invalid(format!(
                "CLOUD_HARNESS_EXECUTOR_CGROUP={other:?}: use auto, off or the absolute path of a delegated cgroup v2 folder"
            )))
        }
    };
    let allowed = match env("CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP")
        .as_deref()
        .map(str::trim)
    {
        None | Some("refuse") => false,
        Some("allow") => true,
        Some(other) => {
            return Err(Error::invalid(format!(
                "CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP={other:?}: use refuse or allow"
            )))
        }
    };
    Ok((choice, allowed))
}

/// Whether sandboxes get a cgroup: where, or why not.
#[derive(Debug)]
pub struct Availability {
    tree: std::result::Result<Tree, String>,
    allowed_without: bool,
}

/// This process's availability, found at first use (and said in the log then).
pub fn availability() -> &'static Availability {
    static FOUND: OnceLock<Availability> = OnceLock::new();
    FOUND.get_or_init(|| {
        let (choice, allowed_without) = choice_from_env().unwrap_or((Choice::Auto, false));
        let tree = find(&choice);
        match &tree {
            Ok(tree) => tracing::info!(?tree, "bubblewrap executors get a cgroup each"),
            Err(why) if allowed_without => tracing::warn!(
                why = %why,
                "bubblewrap executors have no cgroup: runs keep their rlimits only (CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP=allow)"
            ),
            Err(why) => tracing::warn!(
                why = %why,
                "bubblewrap executors have no cgroup: their runs are refused (CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP=allow runs them with rlimits only)"
            ),
        }
        if let Ok(tree) = &tree {
            sweep(tree);
        }
        Availability {
            tree,
            allowed_without,
        }
    })
}

impl Availability {
    /// For `/readyz`: nothing to say (a cgroup per sandbox), or what an operator should
    /// know (no cgroup: runs refused, or allowed with their rlimits only). Not a failure: the
    /// server still serves skills, and an operator chooses which it should be.
    pub fn status(&self) -> Option<String> {
        match (&self.tree, self.allowed_without) {
            (Ok(_), _) => None,
            (Err(_), true) => Some(
                "bubblewrap executors have no cgroup: runs keep their rlimits only".into(),
            ),
            (Err(_), false) => Some(
                "bubblewrap executors have no cgroup for their memory and process limits: their runs are refused".into(),
            ),
        }
    }

    /// A group for a new sandbox with `limits`: none when there is no cgroup and that is
    /// allowed, the refusal when it is not.
    pub fn group(&self, limits: Limits) -> Result<Option<Group>> {
        match (&self.tree, self.allowed_without) {
            (Ok(tree), _) => Group::make(tree, limits).map(Some),
            (Err(_), true) => Ok(None),
            (Err(why), false) => Err(Error::new(
                Code::Forbidden,
                format!(
                    "bubblewrap executors need a cgroup for their memory and process limits, and none can be had ({why}): run the harness as root, or give it a delegated cgroup v2 subtree (systemd: Delegate=yes), or set CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP=allow to run with per-run rlimits only"
                ),
            )),
        }
    }
}

/// What a whole sandbox may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub memory: u64,
    pub processes: u64,
}

/// The folder of groups under a tree's base.
const OURS: &str = "cloud-harness";

fn find(choice: &Choice) -> std::result::Result<Tree, String> {
    let tree = match choice {
        Choice::Off => return Err("CLOUD_HARNESS_EXECUTOR_CGROUP=off".into()),
        Choice::At(path) => {
            if !path.join("cgroup.controllers").is_file() {
                return Err(format!("{} is not a cgroup v2 folder", path.display()));
            }
            Tree::V2(path.clone())
        }
        Choice::Auto => match own_v2() {
            Ok(tree) => tree,
            Err(v2) => own_v1().map_err(|v1| format!("cgroup v2: {v2}; cgroup v1: {v1}"))?,
        },
    };
    let explicit = matches!(choice, Choice::At(_));
    // A move of processes may race with a fork, and the controllers' write then fails for a
    // moment (EBUSY): a few tries before giving up for this process's life.
    let mut tries = 0;
    loop {
        match prepare(&tree, explicit) {
            Ok(()) => break,
            Err(e) if tries < 3 && e.kind() != std::io::ErrorKind::PermissionDenied => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(format!("{tree:?}: {e}")),
        }
    }
    Ok(tree)
}

/// The cgroup mounts: (root in the hierarchy, mount point, fs type, super options).
fn mounts() -> Vec<(String, PathBuf, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let (root, point) = (left.get(3)?, left.get(4)?);
            let (fstype, options) = (right.first()?, right.get(2).unwrap_or(&""));
            fstype.starts_with("cgroup").then(|| {
                (
                    root.to_string(),
                    PathBuf::from(point),
                    fstype.to_string(),
                    options.to_string(),
                )
            })
        })
        .collect()
}

/// The folder of `pid`'s cgroup in the hierarchy of `controller` (`None`: the v2 one).
fn folder_of(pid: &str, controller: Option<&str>) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match controller {
            None => controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        wanted.then(|| path.to_owned())
    })?;
    mounts()
        .into_iter()
        .find_map(|(root, point, fstype, options)| {
            let fits = match controller {
                None => fstype == "cgroup2",
                Some(c) => fstype == "cgroup" && options.split(',').any(|o| o == c),
            };
            let inside = path.strip_prefix(root.trim_end_matches('/'))?;
            fits.then(|| point.join(inside.trim_start_matches('/')))
        })
}

fn own_v2() -> std::result::Result<Tree, String> {
    let own = folder_of("self", None).ok_or("no cgroup v2 hierarchy holds this process")?;
    let controllers = std::fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
    for needed in ["memory", "pids"] {
        if !controllers.split_whitespace().any(|c| c == needed) {
            return Err(format!("{} has no {needed} controller", own.display()));
        }
    }
    Ok(Tree::V2(own))
}

fn own_v1() -> std::result::Result<Tree, String> {
    let memory = folder_of("self", Some("memory")).ok_or("no memory hierarchy")?;
    let pids = folder_of("self", Some("pids")).ok_or("no pids hierarchy")?;
    Ok(Tree::V1 { memory, pids })
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Makes the folder of groups (and for v2, the controllers its children need); a v2 base
/// holding processes (this one) moves them into a leaf first.
fn prepare(tree: &Tree, explicit: bool) -> std::io::Result<()> {
    match tree {
        Tree::V1 { memory, pids } => {
            for base in [memory, pids] {
                mkdir(&base.join(OURS))?;
            }
        }
        Tree::V2(base) => {
            let procs = std::fs::read_to_string(base.join("cgroup.procs"))?;
            let is_root = !base.join("cgroup.type").exists();
            if !procs.trim().is_empty() && !is_root {
                // Only this process is moved, and only out of its own cgroup (a unit with
                // Delegate=yes holds the server alone): a cgroup holding others (a login
                // session's scope, say) is not this process's to rearrange.
                let me = std::process::id().to_string();
                if explicit || procs.split_whitespace().any(|p| p != me) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "{} holds processes other than this one (not a cgroup delegated to it)",
                            base.display()
                        ),
                    ));
                }
                let leaf = base.join("harness");
                mkdir(&leaf)?;
                write(&leaf.join("cgroup.procs"), &me)?;
            }
            write(&base.join("cgroup.subtree_control"), "+memory +pids")?;
            let ours = base.join(OURS);
            mkdir(&ours)?;
            write(&ours.join("cgroup.subtree_control"), "+memory +pids")?;
        }
    }
    Ok(())
}

fn mkdir(path: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(std::io::Error::new(
            e.kind(),
            format!("{}: {e}", path.display()),
        )),
        _ => Ok(()),
    }
}

/// Removes the groups a killed harness left (named for its pid, now gone): their sandboxes
/// died with it, and an empty group is all that is left.
fn sweep(tree: &Tree) {
    let bases = match tree {
        Tree::V1 { memory, pids } => vec![memory.join(OURS), pids.join(OURS)],
        Tree::V2(base) => vec![base.join(OURS)],
    };
    for base in bases {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH);
            if gone {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

/// A sandbox's group: made with its limits, joined by the sandbox's first process before it
/// execs, removed once empty after the group is dropped.
#[derive(Debug)]
pub struct Group {
    dirs: Vec<PathBuf>,
    /// Each folder's `cgroup.procs`, open for writing: a child writes `0` to join.
    joins: Vec<File>,
    memory: std::sync::Arc<Memory>,
}

impl Group {
    fn make(tree: &Tree, limits: Limits) -> Result<Group> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // Its folders (memory's first, pids' last: one folder in v2), the file its memory's
        // kills are counted in, and its memory limit's files (the swap one, if accounted).
        let bytes = limits.memory.to_string();
        let (dirs, events, memory_files) = match tree {
            Tree::V2(base) => {
                let dir = base.join(OURS).join(&name);
                let events = dir.join("memory.events");
                (
                    vec![dir],
                    events,
                    [("memory.max", bytes.as_str()), ("memory.swap.max", "0")],
                )
            }
            Tree::V1 { memory, pids } => {
                let m = memory.join(OURS).join(&name);
                let events = m.join("memory.oom_control");
                let files = [
                    ("memory.limit_in_bytes", bytes.as_str()),
                    ("memory.memsw.limit_in_bytes", bytes.as_str()),
                ];
                (vec![m, pids.join(OURS).join(&name)], events, files)
            }
        };
        let failed = |e: std::io::Error| Error::internal(format!("the sandbox's cgroup: {e}"));
        let mut group = Group {
            dirs: Vec::new(),
            joins: Vec::new(),
            memory: std::sync::Arc::new(Memory { events }),
        };
        for dir in dirs {
            mkdir(&dir).map_err(failed)?;
            // Kept as soon as made: a failure below removes it with the group.
            group.dirs.push(dir);
        }
        let (memory_dir, pids_dir) = (&group.dirs[0], &group.dirs[group.dirs.len() - 1]);
        for (i, (file, value)) in memory_files.iter().enumerate() {
            // The swap file exists only where the kernel accounts swap (no swap to escape to
            // that the host has not chosen).
            if i == 0 || memory_dir.join(file).exists() {
                write(&memory_dir.join(file), value).map_err(failed)?;
            }
        }
        write(&pids_dir.join("pids.max"), &limits.processes.to_string()).map_err(failed)?;
        for dir in &group.dirs {
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
                .map_err(failed)?;
            group.joins.push(procs);
        }
        Ok(group)
    }

    /// The descriptors bubblewrap's launcher writes `0` to, to join the group.
    pub fn join_fds(&self) -> Vec<RawFd> {
        self.joins.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// Its memory's events, for runs to read.
    pub fn memory(&self) -> std::sync::Arc<Memory> {
        self.memory.clone()
    }
}

/// Joins the groups of `fds` (bubblewrap's launcher, before its exec: only `write`).
pub fn join(fds: &[RawFd]) -> std::io::Result<()> {
    for &fd in fds {
        // SAFETY: a write of two bytes from a static buffer to a descriptor we own.
        if unsafe { nix::libc::write(fd, b"0\n".as_ptr().cast(), 2) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Group {
    /// Removes the group once its processes are gone (a sandbox dies a moment after its
    /// link): awaited on a runtime, not in a drop.
    pub fn removed(mut self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let dirs = std::mem::take(&mut self.dirs);
        async move {
            for _ in 0..100 {
                if remove(&dirs) {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            tracing::warn!(?dirs, "a sandbox's cgroup is still not empty");
        }
    }
}

/// Removes `dirs`; whether none is left.
fn remove(dirs: &[PathBuf]) -> bool {
    dirs.iter()
        .filter(|d| std::fs::remove_dir(d).is_err() && d.exists())
        .count()
        == 0
}

impl Drop for Group {
    /// A group dropped without [`Group::removed`] (its sandbox never started) is empty.
    fn drop(&mut self) {
        remove(&self.dirs);
    }
}

/// Where the kernel counts a sandbox's kills for memory.
#[derive(Debug)]
pub struct Memory {
    events: PathBuf,
}

impl Memory {
    /// The memory of the container whose first process is host pid `pid` (Docker's own).
    pub fn of_process(pid: u32) -> Option<Memory> {
        let pid = pid.to_string();
        if let Some(dir) = folder_of(&pid, Some("memory")) {
            return Some(Memory {
                events: dir.join("memory.oom_control"),
            });
        }
        folder_of(&pid, None).map(|dir| Memory {
            events: dir.join("memory.events"),
        })
    }

    /// Processes the kernel killed so far for passing the memory limit.
    pub fn oom_kills(&self) -> Option<u64> {
        let text = std::fs::read_to_string(&self.events).ok()?;
        text.lines().find_map(|l| {
            l.strip_prefix("oom_kill ")
                .and_then(|n| n.trim().parse().ok())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_is_not_a_cgroup_is_refused_with_the_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let why = find(&Choice::At(tmp.path().to_path_buf())).unwrap_err();
        assert!(why.contains("not a cgroup v2 folder"), "{why}");
        let why = find(&Choice::Off).unwrap_err();
        assert!(why.contains("off"), "{why}");
    }
}

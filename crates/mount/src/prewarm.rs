//! Prewarming a mount: right after mounting, a walker process goes through the mount as an
//! agent would — every folder listed, every small file read — so that the first walk, stats
//! and small reads of the agent find the kernel's caches full (no round trip to the daemon at
//! all) instead of paying two to four round trips per folder or file. An agent reaches a new
//! workspace's skills after its model has read the answer of the open: seconds in which the
//! mount would otherwise sit idle.
//!
//! The walker is a process of its own (`<program> prewarm MOUNTPOINT`, which runs [`walk`]),
//! never a thread of the daemon: a process that reads its own FUSE mount cannot exit when it
//! is killed mid-request (the kernel waits, uninterruptibly, for an answer that only its dead
//! threads could give), so a SIGKILL would leave it and its mount hung. The walk goes by file
//! descriptor, each step `openat` with `O_NOFOLLOW`: it follows no link and reads only regular
//! files. It runs at a low priority, within a budget of entries and bytes, at most [`AT_ONCE`]
//! walkers at a time per process, and is killed before an unmount.

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Walkers running at the same time for one process; others wait their turn.
pub const AT_ONCE: usize = 2;
/// Folders deeper than this are not entered (a skill tree is a few levels deep).
const MAX_DEPTH: usize = 64;
const PAGE: u64 = 4096;

/// What one prewarm may do.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Entries listed, in all.
    pub entries: u64,
    /// Bytes of files read, counted in whole pages: what stays in the page cache.
    pub bytes: u64,
    /// Files larger than this are listed, not read.
    pub file_bytes: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            entries: 100_000,
            bytes: 128 << 20,
            file_bytes: 128 << 10,
        }
    }
}

impl Budget {
    /// Folders listed and files looked up, none read.
    pub fn metadata() -> Budget {
        Budget {
            bytes: 0,
            file_bytes: 0,
            ..Budget::default()
        }
    }
}

/// What a prewarm did; the walker prints it as one JSON line.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub entries: u64,
    pub files: u64,
    /// File bytes read (not rounded to pages).
    pub bytes: u64,
    /// Steps that failed (a corrupt object answers EIO; the daemon logs which).
    pub errors: u64,
    /// Ended early: told to stop, the mount gone, or the budget spent.
    pub cut_short: bool,
    pub took_ms: u64,
}

impl Summary {
    /// The `prewarmed` log line of the mount named `mount`.
    pub fn log(&self, mount: &str) {
        tracing::info!(
            mount,
            entries = self.entries,
            files = self.files,
            bytes = self.bytes,
            errors = self.errors,
            cut_short = self.cut_short,
            ms = self.took_ms,
            "prewarmed"
        );
    }
}

/// A prewarm under way; dropping it kills the walker and waits.
pub struct Prewarm {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How often the watching thread looks whether the walker ended or must be killed.
const POLL: Duration = Duration::from_millis(10);

impl Prewarm {
    /// Starts `program prewarm mountpoint` from a thread that watches it; `done` gets its
    /// summary. The thread lives as long as the walker, which dies with it
    /// (`PR_SET_PDEATHSIG` is the walker's own, and names the thread that started it).
    pub fn start(
        program: &Path,
        mountpoint: &Path,
        content: bool,
        done: impl FnOnce(&Summary) + Send + 'static,
    ) -> std::io::Result<Prewarm> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let mut walker = Command::new(program);
        walker.arg("prewarm");
        if !content {
            walker.arg("--no-content");
        }
        walker
            .arg(mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let thread = std::thread::Builder::new()
            .name("prewarm".into())
            .spawn(move || {
                let Some(_turn) = Turn::take(&flag) else {
                    return;
                };
                if let Some(summary) = watch(walker, &flag) {
                    done(&summary);
                }
            })?;
        Ok(Prewarm {
            stop,
            thread: Some(thread),
        })
    }
}

/// Kills the walker (its request in flight is answered first: the daemon still serves) and
/// waits for it.
impl Drop for Prewarm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs the walker to its end, or kills it when `stop` is set; its summary if it ended.
fn watch(mut walker: Command, stop: &AtomicBool) -> Option<Summary> {
    let mut child = walker
        .spawn()
        .map_err(|e| tracing::warn!(error = %e, "no prewarm: the walker did not start"))
        .ok()?;
    loop {
        if stop.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => {
                tracing::warn!(%status, "the prewarm walker failed");
                return None;
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(_) => return None,
        }
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    serde_json::from_str(out.trim())
        .map_err(|e| tracing::warn!(error = %e, "the prewarm walker's summary is unreadable"))
        .ok()
}

/// Nice 10 for the calling process (the walker): an agent's own reads come first. The
/// daemon's threads serve both at their own priority.
pub fn lower_priority() {
    // SAFETY: a plain system call on this process.
    unsafe {
        nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, 10);
    }
}

/// A place among the [`AT_ONCE`] prewarms that may run.
struct Turn;

static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

impl Turn {
    /// Waits for a place; `None` if told to stop meanwhile.
    fn take(stop: &AtomicBool) -> Option<Turn> {
        let (count, freed) = &RUNNING;
        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= AT_ONCE {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            n = freed
                .wait_timeout(n, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *n += 1;
        Some(Turn)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING;
        *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        freed.notify_one();
    }
}

/// Walks the mount at `mountpoint`: first every skill's `SKILL.md` (what skill discovery
/// reads), then the whole tree but the per-tier views of `.tiers/`.
pub fn walk(mountpoint: &Path, budget: Budget, stop: &AtomicBool) -> Summary {
    let start = Instant::now();
    let mut w = Walker {
        budget,
        stop,
        pages: 0,
        summary: Summary::default(),
        buf: vec![0; budget.file_bytes as usize + 1],
    };
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    match nix::fcntl::open(mountpoint, dir_flags, Mode::empty()) {
        Ok(root) => {
            let _ = w.skill_files(&root).and_then(|()| w.dir(&root, 0));
        }
        Err(_) => {
            w.summary.errors += 1;
            w.summary.cut_short = true;
        }
    }
    w.summary.took_ms = start.elapsed().as_millis() as u64;
    w.summary
}

/// Why a walk ends before its tree does.
struct Ended;

struct Walker<'a> {
    budget: Budget,
    stop: &'a AtomicBool,
    /// Bytes read, in whole pages.
    pages: u64,
    summary: Summary,
    buf: Vec<u8>,
}

impl Walker<'_> {
    /// `SKILL.md` of every folder at the root.
    fn skill_files(&mut self, root: &OwnedFd) -> Result<(), Ended> {
        for (name, kind) in self.list(root)? {
            if kind == Some(Type::Directory) && !name.as_bytes().starts_with(b".") {
                if let Some(skill) = self.open_dir(root, &name)? {
                    self.file(&skill, OsStr::new("SKILL.md"))?;
                }
            }
        }
        Ok(())
    }

    fn dir(&mut self, fd: &OwnedFd, depth: usize) -> Result<(), Ended> {
        for (name, kind) in self.list(fd)? {
            self.summary.entries += 1;
            if self.summary.entries > self.budget.entries {
                return Err(self.cut_short());
            }
            let skill_file = depth == 1 && name == "SKILL.md";
            match kind {
                Some(Type::Directory)
                    if depth == 0 && name == cloud_harness_skills::namespace::TIERS_DIR => {}
                Some(Type::Directory) if depth < MAX_DEPTH => {
                    if let Some(sub) = self.open_dir(fd, &name)? {
                        self.dir(&sub, depth + 1)?;
                    }
                }
                Some(Type::File) if !skill_file => self.file(fd, &name)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// The names and types of a folder, as `getdents` gives them (through readdirplus, which
    /// brings every entry's attributes into the kernel as well).
    fn list(&mut self, fd: &OwnedFd) -> Result<Vec<(OsString, Option<Type>)>, Ended> {
        self.check()?;
        let mut names = Vec::new();
        let dup = match fd.try_clone() {
            Ok(dup) => dup,
            Err(_) => {
                self.failed(Errno::EMFILE);
                return Ok(names);
            }
        };
        let mut dir = match Dir::from_fd(dup) {
            Ok(dir) => dir,
            Err(e) => {
                self.failed(e);
                return Ok(names);
            }
        };
        for item in dir.iter() {
            match item {
                Ok(e) => {
                    let name = e.file_name().to_bytes();
                    if name != b"." && name != b".." {
                        names.push((OsStr::from_bytes(name).to_owned(), e.file_type()));
                    }
                }
                Err(e) => {
                    self.failed(e);
                    break;
                }
            }
        }
        Ok(names)
    }

    fn open_dir(&mut self, parent: &OwnedFd, name: &OsStr) -> Result<Option<OwnedFd>, Ended> {
        self.check()?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match openat(parent, name, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) => {
                self.failed(e);
                Ok(None)
            }
        }
    }

    /// Reads a regular file whole if it is small and the budget allows; a missing one (a
    /// skill without `SKILL.md`) is no error.
    fn file(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<(), Ended> {
        self.check()?;
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let mut file = match openat(dir, name, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => {
                self.failed(e);
                return Ok(());
            }
        };
        let size = match file.metadata() {
            Ok(m) if m.is_file() => m.len(),
            _ => return Ok(()),
        };
        // A budget of no bytes reads no file, not even an empty one.
        if size > self.budget.file_bytes || self.budget.bytes == 0 {
            return Ok(());
        }
        let pages = size.div_ceil(PAGE).max(1) * PAGE;
        if self.pages + pages > self.budget.bytes {
            return Err(self.cut_short());
        }
        self.pages += pages;
        let mut read = 0;
        loop {
            match file.read(&mut self.buf[read..]) {
                Ok(0) => break,
                Ok(n) => {
                    read += n;
                    if read == self.buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.failed(Errno::from_raw(e.raw_os_error().unwrap_or(0)));
                    return Ok(());
                }
            }
        }
        self.summary.files += 1;
        self.summary.bytes += read as u64;
        Ok(())
    }

    fn check(&mut self) -> Result<(), Ended> {
        match self.stop.load(Ordering::Relaxed) {
            true => Err(self.cut_short()),
            false => Ok(()),
        }
    }

    fn cut_short(&mut self) -> Ended {
        self.summary.cut_short = true;
        Ended
    }

    /// Counts a failed step, which is skipped; the mount gone (`ENOTCONN`) ends the walk at
    /// its next step.
    fn failed(&mut self, e: Errno) {
        self.summary.errors += 1;
        if e == Errno::ENOTCONN {
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

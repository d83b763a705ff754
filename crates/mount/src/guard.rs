//! The unmount guard: a small process that outlives a killed daemon and detaches its mounts.
//! fusermount's `auto_unmount` does not always: before unmounting it opens the mount point to
//! see whether the file system is gone, and once the kernel opens directories without asking
//! (zero-message opendir) that open succeeds on a dead mount, so the mount stays, answering
//! `ENOTCONN` to whatever its caches do not hold.
//!
//! One guard serves all the mounts of a process (`cloud-harness mount` has one, `serve` one
//! for every workspace's): `<program> mount-guard` reads records from a pipe that only the
//! daemon holds open — `?0 PATH` just before a mount is made there, `+ID PATH` once it is,
//! `-ID PATH` when it is unmounted, each ended by a NUL — and at end of file (the daemon
//! exited, however it died) detaches every mount still named, if the mount at that path is
//! still the one of that ID (not one made there since); for a mount only expected (the daemon
//! died between its mount and its `+`), if the mount there is one of ours. Records name the path as well as the ID because the kernel reuses an ID as
//! soon as its mount is gone: `-5` sent late for one path must not drop the `+5` of another.
//!
//! A guard can itself be killed (a service manager's final SIGKILL to the whole unit races it),
//! so [`sweep`] also detaches, at a server's start and after its stop, whatever FUSE mount of
//! ours is left under its folders.

use crate::mount_table::{self, Mount};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

/// A record longer than this (a path past `PATH_MAX` and its ID) is not one of ours.
const MAX_RECORD: u64 = 4096 + 32;
/// Mounts one guard keeps at most: far beyond what a server holds (two per workspace).
const MAX_MOUNTS: usize = 1 << 20;

/// The daemon's side: the guard process, started at the first mount it is told of and again,
/// told of every mount still watched, if it dies.
pub struct Guards {
    program: PathBuf,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    /// What a new guard must be told: every mount watched and not forgotten, by path (its ID,
    /// or none for one expected and not yet made).
    watched: BTreeMap<PathBuf, Option<u64>>,
    /// A file every guard keeps open until it has detached what it must (see
    /// [`Guards::holding`]); let go of at [`Guards::stop`].
    hold: Option<OwnedFd>,
    /// Stopped for good: no guard is started again (a mount made after uses fusermount's own
    /// `auto_unmount`), so none can run that holds nothing or names mounts long gone.
    stopped: bool,
}

struct Running {
    pipe: ChildStdin,
    child: Child,
}

/// A mount about to be made, as [`Guards::expect`] named it.
#[derive(Debug)]
pub struct Pending {
    point: PathBuf,
}

/// A mount the guard knows, as [`Guards::mounted`] named it.
#[derive(Debug)]
pub struct Watched {
    id: u64,
    point: PathBuf,
}

impl Guards {
    /// Guards run as `program mount-guard` (this program's own binary).
    pub fn new(program: PathBuf) -> Guards {
        Guards {
            program,
            state: Mutex::default(),
        }
    }

    /// Every guard started from now on keeps `file` open (its own copy) until it has
    /// detached its mounts and ended: a server passes the lock it holds on its home, so the
    /// next server on that home waits for a dead one's guard instead of mounting where it
    /// still detaches by path.
    pub fn holding(self, file: OwnedFd) -> Guards {
        self.state.lock().expect("guard lock").hold = Some(file);
        self
    }

    /// Ends the running guard for good once this process has unmounted everything (a server
    /// that stops): it finds nothing left to detach (it detaches what it still names), and
    /// lets go of what it held, as this does. None is started after.
    pub fn stop(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let running = state.running.take();
        state.hold = None;
        state.stopped = true;
        state.watched.clear();
        drop(state);
        if let Some(Running { pipe, mut child }) = running {
            drop(pipe);
            let _ = child.wait();
        }
    }

    /// Whether a guard runs (started now if none did, or if the last one has exited): mount
    /// with fusermount's own `auto_unmount` where none does.
    pub fn ready(&self) -> bool {
        let mut state = self.state.lock().expect("guard lock");
        if state.stopped {
            return false;
        }
        if let Some(r) = state.running.as_mut() {
            if matches!(r.child.try_wait(), Ok(None)) {
                return true;
            }
            state.running = None; // reaped by try_wait
        }
        match self.tell(&mut state, None) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, program = %self.program.display(), "no unmount guard");
                false
            }
        }
    }

    /// Has the mount now at `mountpoint` detached if this process dies before [`Self::forget`].
    pub fn watch(&self, mountpoint: &Path) -> io::Result<Watched> {
        self.mounted(self.expect(mountpoint)?).map_err(|(_, e)| e)
    }

    /// A mount is about to be made at `mountpoint`: if this process dies before
    /// [`Self::mounted`], the guard detaches whatever mount of ours is there.
    pub fn expect(&self, mountpoint: &Path) -> io::Result<Pending> {
        // The folder it is in, resolved: the mount itself is not asked (it may not serve yet).
        let parent = mountpoint.parent().unwrap_or(Path::new("/"));
        let name = mountpoint
            .file_name()
            .ok_or_else(|| io::Error::other(format!("{} names no folder", mountpoint.display())))?;
        let point = std::fs::canonicalize(parent)?.join(name);
        let mut state = self.state.lock().expect("guard lock");
        state.watched.insert(point.clone(), None);
        if let Err(e) = self.tell(&mut state, Some(&record(b'?', 0, &point))) {
            state.watched.remove(&point);
            return Err(e);
        }
        Ok(Pending { point })
    }

    /// The mount expected is made: the guard knows it by its ID from now on. If it cannot,
    /// the mount stays expected (detached if this process dies): the caller unmounts it, then
    /// [`Self::abandon`]s it.
    pub fn mounted(&self, pending: Pending) -> Result<Watched, (Pending, io::Error)> {
        let Pending { point } = pending;
        // Read before the lock: the whole mount table, which every open's mount waits on.
        let id = mount_table::id_at(&point)
            .ok_or_else(|| io::Error::other(format!("{} is not a mount point", point.display())));
        let mut state = self.state.lock().expect("guard lock");
        let told = id.and_then(|id| {
            state.watched.insert(point.clone(), Some(id));
            self.tell(&mut state, Some(&record(b'+', id, &point)))
                .map(|()| id)
        });
        match told {
            Ok(id) => Ok(Watched { id, point }),
            Err(e) => {
                state.watched.insert(point.clone(), None);
                Err((Pending { point }, e))
            }
        }
    }

    /// The mount expected was not made (or is unmounted again).
    pub fn abandon(&self, pending: Pending) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.watched.remove(&pending.point);
        self.tell_running(&mut state, &record(b'-', 0, &pending.point));
    }

    /// The mount was unmounted: the guard leaves its path alone from now on.
    pub fn forget(&self, watched: Watched) {
        // Also reached from a mount's drop: a lock poisoned elsewhere is no reason to panic.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.watched.get(&watched.point) == Some(&Some(watched.id)) {
            state.watched.remove(&watched.point);
        }
        self.tell_running(&mut state, &record(b'-', watched.id, &watched.point));
    }

    /// A removal, for a guard that runs: none is started just to be told it (one started
    /// later is told only what is still watched). A guard gone meanwhile is replaced.
    fn tell_running(&self, state: &mut State, record: &[u8]) {
        if state.running.is_none() {
            return;
        }
        if let Err(e) = self.tell(state, Some(record)) {
            tracing::warn!(error = %e, "the unmount guard was not told of an unmount");
        }
    }

    /// How many mounts a guard must detach if this process dies now (made or expected).
    pub fn watching(&self) -> usize {
        self.state.lock().expect("guard lock").watched.len()
    }

    /// Sends `record` to the running guard. One that is gone (killed by someone) is replaced
    /// by a new one, told every mount still watched instead.
    fn tell(&self, state: &mut State, record: Option<&[u8]>) -> io::Result<()> {
        if state.stopped {
            return Err(io::Error::other("the unmount guard was stopped"));
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let written = match state.running.as_mut() {
                Some(r) => record.map_or(Ok(()), |rec| r.pipe.write_all(rec)),
                None => {
                    let hold = state.hold.as_ref().map(AsRawFd::as_raw_fd);
                    let (pipe, child) = self.start(hold)?;
                    let r = state.running.insert(Running { pipe, child });
                    let all: Vec<u8> = state
                        .watched
                        .iter()
                        .flat_map(|(point, &id)| match id {
                            Some(id) => self::record(b'+', id, point),
                            None => self::record(b'?', 0, point),
                        })
                        .collect();
                    r.pipe.write_all(&all)
                }
            };
            match written {
                Ok(()) => return Ok(()),
                Err(e) => {
                    if let Some(mut r) = state.running.take() {
                        let _ = r.child.kill();
                        let _ = r.child.wait();
                    }
                    if tries == 2 {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "the unmount guard is gone; starting another");
                }
            }
        }
    }

    /// Starts a guard and waits for its ready byte: one that exits at its start (it cannot
    /// run, say) is an error here, not a guard taken for running.
    fn start(&self, hold: Option<RawFd>) -> io::Result<(ChildStdin, Child)> {
        let mut command = Command::new(&self.program);
        command
            .arg("mount-guard")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(fd) = hold {
            // The guard, and no other child, holds the home's lock.
            crate::inherit::to_child(&mut command, fd);
        }
        let mut child = command.spawn()?;
        let pipe = child.stdin.take().expect("a piped stdin");
        let out = child.stdout.take().expect("a piped stdout");
        match ready_byte(out) {
            Ok(()) => Ok((pipe, child)),
            Err(e) => {
                let _ = child.kill();
                let status = child.wait()?;
                Err(io::Error::other(format!(
                    "{} mount-guard did not start ({e}; it {status})",
                    self.program.display()
                )))
            }
        }
    }
}

/// What a guard writes once it ignores the signals meant for its daemon, and is ready.
pub const READY: u8 = b'R';

/// How long a guard may take to say it is ready.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn ready_byte(mut out: std::process::ChildStdout) -> io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let deadline = std::time::Instant::now() + READY_WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::TimedOut, "not ready in time")),
            Ok(_) => break,
            // A signal for another thread (a child's SIGCHLD) is no failure of the guard.
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let mut byte = [0u8];
    match out.read(&mut byte)? {
        1 if byte[0] == READY => Ok(()),
        0 => Err(io::Error::other("it exited")),
        _ => Err(io::Error::other("it answered something else")),
    }
}

fn record(sign: u8, id: u64, point: &Path) -> Vec<u8> {
    let mut record = format!("{}{id} ", sign as char).into_bytes();
    record.extend_from_slice(point.as_os_str().as_bytes());
    record.push(0);
    record
}

impl Drop for Guards {
    /// After the daemon's own unmounts: the guard finds nothing left to detach, and ends.
    fn drop(&mut self) {
        self.stop();
    }
}

/// The guard's side: reads records from `input` until end of file, then detaches every mount
/// still named. How many it detached.
/// A read error is no end of file: the daemon may still serve, so nothing is detached (the
/// next server's start sweeps what is left).
pub fn watch(input: impl Read) -> io::Result<usize> {
    let named = named(input)?;
    // One read of the mount table for them all: a server's guard may name thousands.
    let table = match mount_table::mounts() {
        Ok(table) => Some(table),
        Err(e) => {
            eprintln!(
                "cloud-harness: the mount table is unreadable ({e}); detaching every mount named"
            );
            None
        }
    };
    let mut detached = 0;
    for (point, id) in named {
        if let Some(table) = &table {
            let now = mount_table::topmost_mount(table, &point);
            let still = match id {
                Some(id) => now.is_some_and(|m| m.id == id),
                None => now.is_some_and(Mount::is_ours),
            };
            if !still {
                continue; // unmounted already (or never made), or someone else's mount now
            }
        }
        match crate::fuse::unmount(&point) {
            Ok(()) => detached += 1,
            Err(e) => eprintln!("cloud-harness: detaching {}: {e}", point.display()),
        }
    }
    Ok(detached)
}

/// The mounts the records name at the end of `input`, newest first (a mount made inside
/// another goes before it).
fn named(input: impl Read) -> io::Result<Vec<(PathBuf, Option<u64>)>> {
    // By path: when it was named, and its ID (none while only expected).
    let mut mounts: BTreeMap<PathBuf, (u64, Option<u64>)> = BTreeMap::new();
    let mut input = io::BufReader::new(input);
    let mut record = Vec::new();
    for seq in 0.. {
        record.clear();
        match (&mut input).take(MAX_RECORD).read_until(0, &mut record) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if record.pop() != Some(0) {
            // Too long, or cut by the end of the input: skip to the next record.
            if input.skip_until(0)? == 0 {
                break;
            }
            continue;
        }
        match parse(&record) {
            Some((sign @ (b'+' | b'?'), id, path))
                if mounts.len() < MAX_MOUNTS || mounts.contains_key(&path) =>
            {
                mounts.insert(path, (seq, (sign == b'+').then_some(id)));
            }
            Some((b'-', id, path))
                if mounts
                    .get(&path)
                    .is_some_and(|&(_, known)| known.unwrap_or(0) == id) =>
            {
                mounts.remove(&path);
            }
            _ => {}
        }
    }
    let mut newest_first: Vec<(u64, PathBuf, Option<u64>)> = mounts
        .into_iter()
        .map(|(path, (seq, id))| (seq, path, id))
        .collect();
    newest_first.sort_by_key(|&(seq, _, _)| std::cmp::Reverse(seq));
    Ok(newest_first.into_iter().map(|(_, p, id)| (p, id)).collect())
}

/// `+ID PATH`, `?0 PATH` or `-ID PATH`, the path absolute.
fn parse(record: &[u8]) -> Option<(u8, u64, PathBuf)> {
    let (&sign, rest) = record.split_first()?;
    if !matches!(sign, b'+' | b'-' | b'?') {
        return None;
    }
    let space = rest.iter().position(|&b| b == b' ')?;
    let id = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
    let path = PathBuf::from(OsString::from_vec(rest[space + 1..].to_vec()));
    path.is_absolute().then_some((sign, id, path))
}

/// Detaches every FUSE mount of ours at or under `root` (whose daemon must be gone: a server
/// at its start, or its service after it stopped), the newest first. How many.
pub fn sweep(root: &Path) -> io::Result<usize> {
    let root = std::fs::canonicalize(root)?;
    let left: Vec<Mount> = mount_table::mounts()?
        .into_iter()
        .filter(|m| m.is_ours() && m.point.starts_with(&root) && is_mount_folder(&m.point))
        .collect();
    let mut detached = 0;
    for m in left.iter().rev() {
        match crate::fuse::unmount(&m.point) {
            Ok(()) => detached += 1,
            Err(e) => {
                tracing::warn!(mountpoint = %m.point.display(), error = %e, "a mount left by a server that is gone could not be detached")
            }
        }
    }
    Ok(detached)
}

/// The names a workspace's FUSE mounts have (`<workspace>/mounts/{skills,owner-skills}`):
/// a sweep leaves any other mount alone, whatever made it.
pub const MOUNT_NAMES: [&str; 2] = ["skills", "owner-skills"];

fn is_mount_folder(point: &Path) -> bool {
    let name = point.file_name().and_then(|n| n.to_str());
    let parent = point.parent().and_then(|p| p.file_name());
    name.is_some_and(|n| MOUNT_NAMES.contains(&n)) && parent == Some("mounts".as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_name_mounts_until_removed_and_bad_ones_are_skipped() {
        let mut input = Vec::new();
        input.extend_from_slice(b"+7 /nowhere/a\0");
        input.extend_from_slice(b"+8 relative\0"); // not absolute: not ours
        input.extend_from_slice(&[b'+'; 5000]); // too long
        input.extend_from_slice(b"\0-7 /nowhere/a\0+9 /nowhere/b\0+11 /nowhere/d\0");
        input.extend_from_slice(b"garbage\0+10 /nowhere/c"); // cut by the end
        assert_eq!(
            named(&input[..]).unwrap(),
            vec![
                (PathBuf::from("/nowhere/d"), Some(11)),
                (PathBuf::from("/nowhere/b"), Some(9))
            ]
        );
        // Nothing named is mounted: the guard detaches nothing and ends.
        assert_eq!(watch(&input[..]).unwrap(), 0);
    }

    #[test]
    fn a_guard_that_exits_at_its_start_is_no_guard() {
        let guards = Guards::new(PathBuf::from("/bin/false"));
        assert!(!guards.ready());
        // A mount point it would have to be told of: refused, not watched by nobody.
        assert!(guards.watch(Path::new("/proc")).is_err());
    }

    #[test]
    fn a_sweep_names_only_a_workspaces_mount_folders() {
        assert!(is_mount_folder(Path::new("/h/workspaces/w1/mounts/skills")));
        assert!(is_mount_folder(Path::new(
            "/h/workspaces/w1/mounts/owner-skills"
        )));
        assert!(!is_mount_folder(Path::new("/h/workspaces/w1/repo")));
        assert!(!is_mount_folder(Path::new(
            "/h/workspaces/w1/tree/mounts/x"
        )));
        assert!(!is_mount_folder(Path::new("/h/workspaces/w1/skills")));
    }

    #[test]
    fn a_read_error_is_no_end_of_file_and_detaches_nothing() {
        struct Failing(bool);
        impl Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if std::mem::replace(&mut self.0, true) {
                    return Err(io::Error::other("broken"));
                }
                let rec = b"+1 /nowhere/guard-test\0";
                buf[..rec.len()].copy_from_slice(rec);
                Ok(rec.len())
            }
        }
        assert!(watch(Failing(false)).is_err());
    }

    #[test]
    fn a_late_removal_of_a_reused_id_keeps_the_other_mount() {
        // A is unmounted, B mounted at once with A's freed ID, and only then is A's removal
        // sent; and a path mounted again keeps its new ID past the old one's removal.
        let input = b"+5 /w/a\0+5 /w/b\0-5 /w/a\0+6 /w/c\0+7 /w/c\0-6 /w/c\0";
        assert_eq!(
            named(&input[..]).unwrap(),
            vec![
                (PathBuf::from("/w/c"), Some(7)),
                (PathBuf::from("/w/b"), Some(5))
            ]
        );
    }

    #[test]
    fn an_expected_mount_is_named_until_made_or_given_up() {
        // Expected and made; expected and given up; expected only (the daemon died between
        // its mount and its `+`).
        let input = b"?0 /w/a\0+4 /w/a\0?0 /w/b\0-0 /w/b\0?0 /w/c\0";
        assert_eq!(
            named(&input[..]).unwrap(),
            vec![
                (PathBuf::from("/w/c"), None),
                (PathBuf::from("/w/a"), Some(4))
            ]
        );
    }
}

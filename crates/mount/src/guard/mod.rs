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
//! `=ID PATH` names a bind of a folder onto itself that holds the daemon's mounts (a server's
//! workspaces folder): detached after them, and only if nothing else is mounted in it then.
//!
//! A guard can itself be killed (a service manager's final SIGKILL to the whole unit races it),
//! so [`sweep`] also detaches, at a server's start and after its stop, whatever FUSE mount of
//! ours is left under its folders.

use crate::mount_table;
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

mod detach;
pub use detach::{sweep, watch, Ended, MOUNT_NAMES};

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
    /// Binds of a folder onto itself (see [`Guards::folder`]), by path: their IDs.
    folders: BTreeMap<PathBuf, u64>,
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
        state.folders.clear();
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

    /// `point` (canonical) is a bind of a folder onto itself that holds this process's
    /// mounts: if this process dies, the guard detaches it after them, unless something
    /// else is mounted in it by then.
    pub fn folder(&self, point: &Path) -> io::Result<Watched> {
        let id = mount_table::id_at(point)
            .ok_or_else(|| io::Error::other(format!("{} is not a mount point", point.display())))?;
        let mut state = self.state.lock().expect("guard lock");
        state.folders.insert(point.to_owned(), id);
        if let Err(e) = self.tell(&mut state, Some(&record(b'=', id, point))) {
            state.folders.remove(point);
            return Err(e);
        }
        Ok(Watched {
            id,
            point: point.to_owned(),
        })
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
        } else if state.folders.get(&watched.point) == Some(&watched.id) {
            state.folders.remove(&watched.point);
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
                    let folders = state
                        .folders
                        .iter()
                        .flat_map(|(point, &id)| self::record(b'=', id, point));
                    let mounts = state.watched.iter().flat_map(|(point, &id)| match id {
                        Some(id) => self::record(b'+', id, point),
                        None => self::record(b'?', 0, point),
                    });
                    let all: Vec<u8> = folders.chain(mounts).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_that_exits_at_its_start_is_no_guard() {
        let guards = Guards::new(PathBuf::from("/bin/false"));
        assert!(!guards.ready());
        // A mount point it would have to be told of: refused, not watched by nobody.
        assert!(guards.watch(Path::new("/proc")).is_err());
    }
}

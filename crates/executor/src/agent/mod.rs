//! The run agent: the one long-lived process inside an executor (`cloud-harness
//! executor-agent`), the sandbox's pid 1. The harness hands it each run as a socket of its
//! own over the agent's control socket ([`crate::wire`]); it starts the run as the executor's
//! unprivileged user, in a session and process group of its own, with the run's rlimits,
//! relays its output and exit on the run's socket ([`relay`]), and kills its group when the
//! run's first process exits or the harness ends its end.
//!
//! What a run cannot do to the agent, and so to later runs:
//! - reach its sockets: bubblewrap hands it an inherited socket with no name; Docker's is in a
//!   folder only root may enter, and runs are never root; a run's own process gets only its
//!   standard streams (every descriptor of the agent's is close-on-exec);
//! - signal it: it is its pid namespace's init, which the kernel shields from signals sent
//!   inside the namespace, and (as root) another user;
//! - read or write its memory or descriptors: it is not dumpable (`PR_SET_DUMPABLE` 0), so
//!   `ptrace` and `/proc/1/{mem,fd}` are closed to runs even of the same uid;
//! - outlive the runs: once no run is going, every process of the runs' user left in the
//!   sandbox (a daemon that left its group with `setsid`, say) is killed, so a run that
//!   starts when none is going finds no process of an earlier one.

mod entry;
mod relay;
mod spawn;
mod sweep;

use crate::wire::{self, Exited, Frame, Kind, Refused, Start, Started};
use nix::libc;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use std::collections::HashMap;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use sweep::sweep;

/// The binary's command that runs the agent.
pub const COMMAND: &str = "executor-agent";
/// The agent's environment (runs get theirs from their plan, never this one). mimalloc
/// otherwise commits its arena eagerly, as huge pages: 2 MiB resident for each of the agent's
/// threads, 6 of its 9 MiB, in every executor of every workspace (`cargo bench --bench
/// scale`). The agent allocates little; small pages are plenty.
pub const ENV: [(&str, &str); 1] = [("MIMALLOC_ARENA_EAGER_COMMIT", "0")];
/// Runs going at once, over all connections.
const MAX_RUNS: usize = 64;
/// Connections at once (Docker: the server and `cloud-harness exec` processes).
const MAX_CONNECTIONS: usize = 16;

/// The agent's entry: `executor-agent --fd N` (an inherited socket: the agent ends with it)
/// or `executor-agent --listen PATH` (a socket file, for containers).
pub fn main(args: &[String]) -> i32 {
    // SAFETY: prctl with integer arguments touches no memory.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    standard_streams_open();
    empty_bounding_set();
    let agent = Arc::new(Agent::default());
    {
        let (reaper, watcher) = (agent.clone(), agent.clone());
        if thread("reaper", move || reaper.reap()).is_none()
            || thread("starts", move || watcher.watch_starts()).is_none()
        {
            eprintln!("executor-agent: cannot start its reaper threads");
            return 1;
        }
    }
    match args {
        [flag, fd] if flag == "--fd" => {
            let Ok(fd) = fd.parse::<RawFd>() else {
                eprintln!("executor-agent: --fd takes a number");
                return 2;
            };
            // SAFETY: the harness passed this descriptor for the agent to own.
            let stream = unsafe { UnixStream::from_raw_fd(fd) };
            set_cloexec(fd);
            agent.serve_control(stream);
            0
        }
        [flag, path] if flag == "--listen" => {
            let _ = std::fs::remove_file(path);
            let listener = match UnixListener::bind(path) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("executor-agent: cannot listen on {path}: {e}");
                    return 1;
                }
            };
            let _ =
                std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600));
            let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for stream in listener.incoming().flatten() {
                if open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    continue;
                }
                open.fetch_add(1, Ordering::SeqCst);
                let (agent, counted) = (agent.clone(), open.clone());
                // Without a thread the connection is dropped (closed) and not counted.
                if thread("connection", move || {
                    agent.serve_control(stream);
                    counted.fetch_sub(1, Ordering::SeqCst);
                })
                .is_none()
                {
                    open.fetch_sub(1, Ordering::SeqCst);
                }
            }
            0
        }
        _ => {
            eprintln!("usage: cloud-harness executor-agent (--fd N | --listen PATH)");
            2
        }
    }
}

/// A thread of the agent's; `None` when none can be made (the sandbox's processes are at
/// their limit, say), which each caller handles instead of panicking.
fn thread(name: &str, work: impl FnOnce() + Send + 'static) -> Option<()> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(work)
        .ok()
        .map(|_| ())
}

/// Opens `/dev/null` on whichever of 0, 1 and 2 is closed, so no pipe of a run's is ever
/// made on one of them (the run's streams are moved onto those numbers).
fn standard_streams_open() {
    for fd in 0..3 {
        // SAFETY: fcntl and open with a static path; an opened /dev/null takes the lowest
        // free number, which is `fd` (the lower ones are open by now).
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) < 0 {
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
}

/// Drops every capability from the bounding set, once for all runs (each inherits it): no
/// run can gain one by executing a file that carries it. The agent keeps what it holds (it
/// needs none from the bounding set, which only limits what an exec may grant).
fn empty_bounding_set() {
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments; past the last capability it fails, harmlessly.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// A run whose first process the reaper has not collected yet: how it ended, once it has,
/// and the eventfd its relay waits on for that.
struct Running {
    exited: Mutex<Option<Exited>>,
    wake: OwnedFd,
}

impl Running {
    fn new() -> std::io::Result<Arc<Running>> {
        // SAFETY: eventfd makes a new descriptor, owned here.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(Running {
            exited: Mutex::new(None),
            // SAFETY: just made, owned by no one else.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        }))
    }

    fn exit(&self, exited: Exited) {
        *lock(&self.exited) = Some(exited);
        let one: u64 = 1;
        // SAFETY: an 8-byte write to this run's eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// A start in flight: its first process's pid (written by the kernel at the clone, before
/// the process runs; 0 until then) and since when it has been starting.
struct Spawning {
    pid: AtomicI32,
    since: Instant,
    /// Killed for taking too long: the run did not start.
    killed: AtomicBool,
}

/// How long a start may take before its first process is killed: one stopped (SIGSTOP from
/// another run of its user) or stuck before its exec would hold its thread for good.
const START_LIMIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Table {
    /// Runs whose first process has not been reaped, by that process.
    by_pid: HashMap<i32, Arc<Running>>,
    /// Runs being started: the first process of each (its pid once cloned) exists, and is
    /// not in `by_pid` yet.
    spawning: Vec<Arc<Spawning>>,
    /// Bumped at every start, so the reaper knows there are children to wait for.
    started: u64,
    /// The user runs are, for the idle sweep.
    run_uid: Option<u32>,
}

#[derive(Default)]
struct Agent {
    table: Mutex<Table>,
    children: Condvar,
    /// Runs' threads alive (a run's relay outlives its first process while output drains).
    relays: AtomicUsize,
}

impl Agent {
    /// Takes runs' sockets off a control connection until it ends: each gets a thread that
    /// starts the run and relays it. The harness says nothing else on it.
    fn serve_control(self: &Arc<Self>, control: UnixStream) {
        loop {
            let mut byte = [0u8; 1];
            let mut iov = [IoSliceMut::new(&mut byte)];
            let mut space = nix::cmsg_space!([RawFd; 4]);
            let received = recvmsg::<()>(
                control.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            );
            let message = match received {
                Ok(m) if m.bytes > 0 => m,
                Err(nix::errno::Errno::EINTR) => continue,
                _ => return,
            };
            let mut fds = Vec::new();
            if let Ok(cmsgs) = message.cmsgs() {
                for cmsg in cmsgs {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        // SAFETY: descriptors the kernel just made in this process.
                        fds.extend(
                            received
                                .into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
            }
            // One socket per byte; anything more is closed.
            let Some(socket) = fds.into_iter().next() else {
                continue;
            };
            let mut socket = UnixStream::from(socket);
            if self.relays.load(Ordering::SeqCst) >= 2 * MAX_RUNS {
                refuse(
                    &mut socket,
                    0,
                    "the executor is relaying too many runs".into(),
                );
                continue;
            }
            let (agent, refusal) = (self.clone(), socket.try_clone());
            self.relays.fetch_add(1, Ordering::SeqCst);
            let started = thread("run", move || {
                agent.run(socket);
                agent.relays.fetch_sub(1, Ordering::SeqCst);
            });
            if started.is_none() {
                self.relays.fetch_sub(1, Ordering::SeqCst);
                if let Ok(mut socket) = refusal {
                    refuse(
                        &mut socket,
                        0,
                        "the executor cannot take another run now".into(),
                    );
                }
            }
        }
    }

    /// One run, on its socket: the start read, the first process started, then relayed.
    fn run(self: &Arc<Self>, mut socket: UnixStream) {
        // The harness sends the start right after the socket: one that does not is dropped.
        let _ = socket.set_read_timeout(Some(Duration::from_secs(30)));
        let frame = match wire::read(&mut socket) {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            // Too long, malformed, or not sent in time: said, if the harness still listens.
            Err(e) => return refuse(&mut socket, 0, format!("the run's start: {e}")),
        };
        let run = frame.run;
        if frame.kind != Kind::Start {
            return refuse(
                &mut socket,
                run,
                "a run's socket starts with its start".into(),
            );
        }
        let start = match frame.parse::<Start>() {
            Ok(start) => start,
            Err(e) => return refuse(&mut socket, run, e.to_string()),
        };
        if start.argv.is_empty() {
            return refuse(&mut socket, run, "an empty command".into());
        }
        let root = nix::unistd::getuid().is_root();
        if root && (start.uid == 0 || start.gid == 0) {
            return refuse(&mut socket, run, "runs never run as root".into());
        }
        let running = match Running::new() {
            Ok(r) => r,
            Err(e) => return refuse(&mut socket, run, format!("no eventfd: {e}")),
        };
        let plan = spawn::Plan {
            argv: &start.argv,
            env: &start.env,
            cwd: &start.cwd,
            user: root.then_some((start.uid, start.gid)),
            limits: start.limits,
            stdin: start.stdin,
        };
        // Started outside the table's lock (an exec under load can take milliseconds, and
        // the reaper must not wait on it); the reaper keeps a child it does not know yet
        // unreaped while a start is going, so the pid is the run's when it is entered.
        let spawning = {
            let mut table = lock(&self.table);
            if table.by_pid.len() + table.spawning.len() >= MAX_RUNS {
                drop(table);
                return refuse(
                    &mut socket,
                    run,
                    format!("{MAX_RUNS} runs are going in this executor already"),
                );
            }
            let spawning = Arc::new(Spawning {
                pid: AtomicI32::new(0),
                since: Instant::now(),
                killed: AtomicBool::new(false),
            });
            table.spawning.push(spawning.clone());
            spawning
        };
        self.children.notify_all();
        let spawned = spawn::spawn(&plan, &spawning.pid);
        let mut table = lock(&self.table);
        table.spawning.retain(|s| !Arc::ptr_eq(s, &spawning));
        // A child that did not exec is a zombie by now: the reaper looks either way.
        table.started += 1;
        let child = match spawned {
            // Killed before its exec: a zombie the reaper takes as no run's.
            Ok(_) if spawning.killed.load(Ordering::SeqCst) => {
                drop(table);
                self.children.notify_all();
                return refuse(
                    &mut socket,
                    run,
                    format!(
                        "the run did not start within {} s (stopped or stuck before its exec)",
                        START_LIMIT.as_secs()
                    ),
                );
            }
            Ok(child) => child,
            Err(e) => {
                drop(table);
                self.children.notify_all();
                return cannot_start(&mut socket, run, &start.argv[0], e);
            }
        };
        table.by_pid.insert(child.pid, running.clone());
        table.run_uid = Some(if root {
            start.uid
        } else {
            nix::unistd::getuid().as_raw()
        });
        drop(table);
        self.children.notify_all();
        let _ = wire::write(
            &mut socket,
            &Frame::json(Kind::Started, run, &Started { pid: child.pid }),
        );
        relay::relay(self, run, socket, child, &running);
    }

    /// Kills the group of a run's first process unless the reaper has collected it (it frees
    /// the pid, and so the group's number, only under the table's lock): the pid must still
    /// be this run's, not a later run's that got the same number.
    fn kill(&self, pid: i32, running: &Arc<Running>) {
        let table = lock(&self.table);
        if table
            .by_pid
            .get(&pid)
            .is_some_and(|r| Arc::ptr_eq(r, running))
        {
            // SAFETY: a signal to a process group this agent started.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }

    /// Kills the first process of a start that takes longer than [`START_LIMIT`] (its pid
    /// cannot be another's: the reaper keeps it until the start ends).
    fn watch_starts(self: Arc<Self>) {
        let mut table = lock(&self.table);
        loop {
            table = self
                .children
                .wait_while(table, |t| t.spawning.is_empty())
                .unwrap_or_else(|p| p.into_inner());
            for start in &table.spawning {
                let pid = start.pid.load(Ordering::SeqCst);
                if pid > 0 && start.since.elapsed() > START_LIMIT {
                    start.killed.store(true, Ordering::SeqCst);
                    // SAFETY: a signal to a child of this process's, not yet reaped.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            table = self
                .children
                .wait_timeout(table, Duration::from_secs(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits for children: a run's first process (its exit is the run's; whatever it left in
    /// its group is killed) or an orphan the kernel gave to this init.
    fn reap(self: Arc<Self>) {
        let mut seen = 0;
        loop {
            // SAFETY: waitid writes only into `info`.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // WNOWAIT: the child stays a zombie, so its pid is not reused until the table
            // says whose it was.
            let r =
                unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if r < 0 {
                let errno = std::io::Error::last_os_error().raw_os_error();
                let table = lock(&self.table);
                if errno == Some(libc::ECHILD) {
                    let table = self
                        .children
                        .wait_while(table, |t| t.started == seen)
                        .unwrap_or_else(|p| p.into_inner());
                    seen = table.started;
                }
                continue;
            }
            // SAFETY: filled in by a successful waitid for an exited child.
            let pid = unsafe { info.si_pid() };
            // A child that is a start's in flight is that run's once entered: kept till then.
            let mut table = self
                .children
                .wait_while(lock(&self.table), |t| {
                    t.spawning
                        .iter()
                        .any(|s| s.pid.load(Ordering::SeqCst) == pid)
                })
                .unwrap_or_else(|p| p.into_inner());
            seen = table.started;
            let owner = table.by_pid.remove(&pid);
            if owner.is_some() {
                // SAFETY: the group of a run's first process, still a zombie.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let mut status = 0;
            // SAFETY: reaps the one child waitid named.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            let Some(running) = owner else { continue };
            if table.by_pid.is_empty() && table.spawning.is_empty() {
                if let Some(uid) = table.run_uid {
                    sweep(uid);
                }
            }
            drop(table);
            running.exit(if libc::WIFSIGNALED(status) {
                Exited {
                    code: None,
                    signal: Some(libc::WTERMSIG(status)),
                }
            } else {
                Exited {
                    code: Some(libc::WEXITSTATUS(status)),
                    signal: None,
                }
            });
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn refuse(socket: &mut UnixStream, run: u32, message: String) {
    let _ = wire::write(
        socket,
        &Frame::json(Kind::Refused, run, &Refused { message }),
    );
}

/// A command that could not start ends as a shell says so: 127 when it is not there, 126
/// when it cannot run.
fn cannot_start(socket: &mut UnixStream, run: u32, program: &str, e: std::io::Error) {
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    for frame in [
        Frame::json(Kind::Started, run, &Started { pid: 0 }),
        Frame {
            kind: Kind::Stderr,
            run,
            payload: format!("cloud-harness: cannot run {program}: {e}\n").into_bytes(),
        },
        Frame {
            kind: Kind::End,
            run,
            payload: Vec::new(),
        },
        Frame::json(
            Kind::Exit,
            run,
            &Exited {
                code: Some(code),
                signal: None,
            },
        ),
    ] {
        if wire::write(socket, &frame).is_err() {
            return;
        }
    }
}

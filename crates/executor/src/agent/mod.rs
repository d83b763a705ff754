//! The run agent: the one long-lived process inside an executor (`cloud-harness
//! executor-agent`), the sandbox's pid 1. The harness hands it runs over a Unix socket
//! ([`crate::wire`]); it starts each as the executor's unprivileged user, in a session and
//! process group of its own, with the run's rlimits, streams its output back, and kills its
//! group when the run's first process exits or the harness asks.
//!
//! What a run cannot do to the agent, and so to later runs:
//! - reach its socket: bubblewrap hands it an inherited socket with no name; Docker's is in a
//!   folder only root may enter, and runs are never root;
//! - signal it: it is its pid namespace's init, which the kernel shields from signals sent
//!   inside the namespace, and (as root) another user;
//! - read or write its memory or descriptors: it is not dumpable (`PR_SET_DUMPABLE` 0), so
//!   `ptrace` and `/proc/1/{mem,fd}` are closed to runs even of the same uid;
//! - outlive the runs: once no run is going, every process of the runs' user left in the
//!   sandbox (a daemon that left its group with `setsid`, say) is killed, so a run that
//!   starts when none is going finds no process of an earlier one.

mod entry;
mod spawn;
mod sweep;

use crate::wire::{self, Exited, Frame, Kind, Refused, Start, Started};
use nix::libc;
use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use sweep::sweep;

/// The binary's command that runs the agent.
pub const COMMAND: &str = "executor-agent";
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
    let agent = Arc::new(Agent::default());
    {
        let agent = agent.clone();
        if thread("reaper", move || agent.reap()).is_none() {
            eprintln!("executor-agent: cannot start its reaper thread");
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
            agent.serve(stream);
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
                    agent.serve_one(stream);
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

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// One connection: frames out under a lock, and the runs it started.
struct Conn {
    out: Mutex<UnixStream>,
    runs: Mutex<HashMap<u32, Run>>,
}

struct Run {
    pid: i32,
    exited: bool,
    stdin: Option<mpsc::SyncSender<Vec<u8>>>,
}

impl Conn {
    fn send(&self, frame: &Frame) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = wire::write(&mut *out, frame);
    }
}

#[derive(Default)]
struct Table {
    /// Runs whose first process has not been reaped, by that process.
    by_pid: HashMap<i32, (Arc<Conn>, u32)>,
    /// Bumped at every start, so the reaper knows there are children to wait for.
    started: u64,
    /// The user runs are, for the idle sweep.
    run_uid: Option<u32>,
}

#[derive(Default)]
struct Agent {
    table: Mutex<Table>,
    children: Condvar,
}

impl Agent {
    /// Serves the one connection an inherited socket is; the sandbox ends with it.
    fn serve(self: &Arc<Self>, stream: UnixStream) {
        self.serve_one(stream);
    }

    fn serve_one(self: &Arc<Self>, stream: UnixStream) {
        let Ok(out) = stream.try_clone() else { return };
        let conn = Arc::new(Conn {
            out: Mutex::new(out),
            runs: Mutex::new(HashMap::new()),
        });
        let mut input = stream;
        // However this ends, the runs it started are killed and the harness sees the end
        // (output threads hold clones of the socket: shut it, not just dropped).
        let _ending = Ending {
            agent: self.clone(),
            conn: conn.clone(),
            socket: input.try_clone().ok(),
        };
        while let Ok(Some(frame)) = wire::read(&mut input) {
            match frame.kind {
                Kind::Start => match frame.parse::<Start>() {
                    Ok(start) => self.start(&conn, frame.run, start),
                    Err(e) => refuse(&conn, frame.run, e.to_string()),
                },
                Kind::Stdin => {
                    let tx = lock(&conn.runs)
                        .get(&frame.run)
                        .and_then(|r| r.stdin.clone());
                    if let Some(tx) = tx {
                        let close = frame.payload.is_empty();
                        // Blocks this connection only, while the run does not read.
                        let _ = tx.send(frame.payload);
                        if close {
                            if let Some(r) = lock(&conn.runs).get_mut(&frame.run) {
                                r.stdin = None;
                            }
                        }
                    }
                }
                Kind::Kill => self.kill(&conn, frame.run),
                _ => break,
            }
        }
    }

    fn kill(&self, conn: &Conn, run: u32) {
        // Under the table's lock: the reaper frees a first process's pid (and so its group's
        // number) only under it, after marking the run exited.
        let _table = lock(&self.table);
        if let Some(r) = lock(&conn.runs).get(&run) {
            if !r.exited && r.pid > 0 {
                // SAFETY: a signal to a process group this agent started.
                unsafe { libc::kill(-r.pid, libc::SIGKILL) };
            }
        }
    }

    fn start(self: &Arc<Self>, conn: &Arc<Conn>, run: u32, start: Start) {
        if start.argv.is_empty() {
            return refuse(conn, run, "an empty command".into());
        }
        let root = nix::unistd::getuid().is_root();
        if root && (start.uid == 0 || start.gid == 0) {
            return refuse(conn, run, "runs never run as root".into());
        }
        let mut table = lock(&self.table);
        if table.by_pid.len() >= MAX_RUNS {
            drop(table);
            return refuse(
                conn,
                run,
                format!("{MAX_RUNS} runs are going in this executor already"),
            );
        }
        if lock(&conn.runs).contains_key(&run) {
            drop(table);
            return refuse(conn, run, format!("run {run} exists"));
        }
        let plan = spawn::Plan {
            argv: &start.argv,
            env: &start.env,
            cwd: &start.cwd,
            user: root.then_some((start.uid, start.gid)),
            limits: start.limits,
            stdin: start.stdin,
        };
        let child = match spawn::spawn(&plan) {
            Ok(child) => child,
            Err(e) => {
                drop(table);
                return cannot_start(conn, run, &start.argv[0], e);
            }
        };
        let pid = child.pid;
        let stdin = child.stdin.and_then(|mut pipe| {
            let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(16);
            thread("stdin", move || {
                use std::io::Write;
                while let Ok(bytes) = rx.recv() {
                    if bytes.is_empty() || pipe.write_all(&bytes).is_err() {
                        return;
                    }
                }
            })
            .map(|()| tx)
        });
        lock(&conn.runs).insert(
            run,
            Run {
                pid,
                exited: false,
                stdin,
            },
        );
        table.by_pid.insert(pid, (conn.clone(), run));
        table.started += 1;
        table.run_uid = Some(if root {
            start.uid
        } else {
            nix::unistd::getuid().as_raw()
        });
        // Before the reaper can say it exited: it needs the table first.
        conn.send(&Frame::json(Kind::Started, run, &Started { pid }));
        drop(table);
        self.children.notify_all();
        let streams = Arc::new(AtomicU8::new(2));
        let forwarded = forward(
            conn.clone(),
            run,
            Kind::Stdout,
            child.stdout,
            streams.clone(),
        ) && forward(conn.clone(), run, Kind::Stderr, child.stderr, streams);
        if !forwarded {
            // No thread for its output: the run ends now (its exit is still reported).
            self.kill(conn, run);
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
            let mut table = lock(&self.table);
            seen = table.started;
            let owner = table.by_pid.remove(&pid);
            if owner.is_some() {
                // SAFETY: the group of a run's first process, still a zombie.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let mut status = 0;
            // SAFETY: reaps the one child waitid named.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            let Some((conn, run)) = owner else { continue };
            if let Some(r) = lock(&conn.runs).get_mut(&run) {
                r.exited = true;
                r.stdin = None;
            }
            if table.by_pid.is_empty() {
                if let Some(uid) = table.run_uid {
                    sweep(uid);
                }
            }
            drop(table);
            let exited = if libc::WIFSIGNALED(status) {
                Exited {
                    code: None,
                    signal: Some(libc::WTERMSIG(status)),
                }
            } else {
                Exited {
                    code: Some(libc::WEXITSTATUS(status)),
                    signal: None,
                }
            };
            conn.send(&Frame::json(Kind::Exit, run, &exited));
            finish(&conn, run);
        }
    }
}

/// What ends a connection: its runs killed, its socket shut.
struct Ending {
    agent: Arc<Agent>,
    conn: Arc<Conn>,
    socket: Option<UnixStream>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        let ids: Vec<u32> = lock(&self.conn.runs).keys().copied().collect();
        for id in ids {
            self.agent.kill(&self.conn, id);
        }
        if let Some(socket) = &self.socket {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Forgets a run once its first process exited (its output may still be draining).
fn finish(conn: &Conn, run: u32) {
    lock(&conn.runs).remove(&run);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn refuse(conn: &Conn, run: u32, message: String) {
    conn.send(&Frame::json(Kind::Refused, run, &Refused { message }));
}

/// A command that could not start ends as a shell says so: 127 when it is not there, 126
/// when it cannot run.
fn cannot_start(conn: &Conn, run: u32, program: &str, e: std::io::Error) {
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    conn.send(&Frame::json(Kind::Started, run, &Started { pid: 0 }));
    conn.send(&Frame {
        kind: Kind::Stderr,
        run,
        payload: format!("cloud-harness: cannot run {program}: {e}\n").into_bytes(),
    });
    conn.send(&Frame {
        kind: Kind::End,
        run,
        payload: Vec::new(),
    });
    conn.send(&Frame::json(
        Kind::Exit,
        run,
        &Exited {
            code: Some(code),
            signal: None,
        },
    ));
}

/// Sends a stream's output as frames; the last stream to close says the run's output ended.
fn forward(
    conn: Arc<Conn>,
    run: u32,
    kind: Kind,
    mut stream: impl Read + Send + 'static,
    open: Arc<AtomicU8>,
) -> bool {
    thread("output", move || {
        let mut buf = vec![0u8; wire::CHUNK];
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => conn.send(&Frame {
                    kind,
                    run,
                    payload: buf[..n].to_vec(),
                }),
            }
        }
        if open.fetch_sub(1, Ordering::SeqCst) == 1 {
            conn.send(&Frame {
                kind: Kind::End,
                run,
                payload: Vec::new(),
            });
        }
    })
    .is_some()
}

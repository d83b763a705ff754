//! The harness's end of a run agent's control socket: each run is handed to the agent as a
//! socket of its own ([`crate::wire`]), read by whoever waits on the run. A link whose agent
//! is gone (its end of the control socket closed) says so ([`Link::alive`]); the executor
//! starts a new agent.

use crate::cgroup;
use crate::process::Process;
use crate::run_stream::{self, Ender, RunInput, RunStream};
use crate::wire::{Frame, Kind, Start};
use cloud_harness_error::{Code, Error, Result};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// How long a start may wait for the agent's answer (a frozen sandbox, say).
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Link {
    /// The control socket: runs' sockets go to the agent over it.
    control: OwnedFd,
    next: AtomicU32,
    /// What keeps the agent (the bubblewrap process: killed with the link).
    _keep: Option<tokio::process::Child>,
    /// The sandbox's cgroup (bubblewrap), removed once the sandbox is gone.
    group: Option<cgroup::Group>,
    /// Where the kernel counts the executor's kills for memory, if it can be read.
    memory: Option<Arc<cgroup::Memory>>,
    /// Its memory and processes are bounded as a whole (a container, a cgroup).
    bounded: bool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// bubblewrap's own process, started in a narrower mount namespace, which is emptied
    /// once the sandbox answers (see `launch_mounts::empty`); 0 for none, or done. Its pid
    /// is no other process's while `_keep` holds it: never waited for, it is not reaped.
    narrowed: AtomicU32,
}

impl Drop for Link {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(group) = self.group.take() {
            runtime().spawn(group.removed());
        }
    }
}

/// The error of a run whose agent went away before it started.
pub fn lost(why: &str) -> Error {
    Error::new(
        Code::Upstream,
        format!("the executor's run agent is gone ({why})"),
    )
}

/// The runtime every link's tasks run on (one thread), so a link outlives the runtime of
/// whoever made it (a test's, a CLI's).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("executor-links")
            .enable_all()
            .build()
            .inspect(|made| cloud_harness_memory::idle::answered_by(made.handle()))
            .expect("a runtime for the executors' links")
    })
}

impl Link {
    /// A link over a connected control socket; `keep` lives (and dies) with it.
    pub fn new(
        stream: std::os::unix::net::UnixStream,
        keep: Option<tokio::process::Child>,
    ) -> Result<Link> {
        Ok(Link {
            control: OwnedFd::from(stream),
            next: AtomicU32::new(1),
            _keep: keep,
            group: None,
            memory: None,
            bounded: false,
            tasks: Vec::new(),
            narrowed: AtomicU32::new(0),
        })
    }

    /// The link of a sandbox whose bubblewrap (`pid`) started in a narrower namespace.
    pub fn narrowed(self, pid: u32) -> Link {
        self.narrowed.store(pid, Ordering::SeqCst);
        self
    }

    /// The link, keeping the sandbox's `group` (whose memory its runs report on).
    pub fn with_group(mut self, group: Option<cgroup::Group>) -> Link {
        self.memory = group.as_ref().map(cgroup::Group::memory);
        self.bounded = group.is_some();
        self.group = group;
        self
    }

    /// The link of a container's agent: bounded as a whole by the container's limits, its
    /// runs reporting on the container's `memory` (when it could be found).
    pub fn of_container(mut self, memory: Option<cgroup::Memory>) -> Link {
        self.bounded = true;
        self.memory = memory.map(Arc::new);
        self
    }

    /// Whether the executor's memory and processes are bounded as a whole.
    pub fn bounded(&self) -> bool {
        self.bounded
    }

    /// The link, with a task of its sandbox's (its egress proxy) that ends with it.
    pub fn with_task(mut self, task: tokio::task::JoinHandle<()>) -> Link {
        self.tasks.push(task);
        self
    }

    /// Whether the agent still holds its end of the control socket (it never writes on it:
    /// a hang-up is all there is to see).
    pub fn alive(&self) -> bool {
        let mut fd = nix::libc::pollfd {
            fd: self.control.as_raw_fd(),
            events: nix::libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: poll of one descriptor this link owns, without waiting.
        let ready = unsafe { nix::libc::poll(&mut fd, 1, 0) };
        ready == 0
            || fd.revents & (nix::libc::POLLRDHUP | nix::libc::POLLHUP | nix::libc::POLLERR) == 0
    }

    /// Hands the agent its end of a new run's socket: one byte carrying the descriptor.
    /// The agent reads its control socket all the time; should it not (a frozen sandbox),
    /// the hand-over is tried again until the start's time is up.
    async fn hand(&self, theirs: &OwnedFd) -> Result<()> {
        let fds = [theirs.as_raw_fd()];
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            let sent = sendmsg::<()>(
                self.control.as_raw_fd(),
                &[IoSlice::new(&[0])],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                None,
            );
            match sent {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR)
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(nix::errno::Errno::EAGAIN) => return Err(not_started()),
                Err(
                    e @ (nix::errno::Errno::EPIPE
                    | nix::errno::Errno::ECONNRESET
                    | nix::errno::Errno::ENOTCONN),
                ) => return Err(lost(&format!("its connection closed: {e}"))),
                // Too many descriptors in flight, no memory: this run, not the agent.
                Err(e) => {
                    return Err(Error::new(
                        Code::ResourceExhausted,
                        format!("the run could not be handed to the executor: {e}"),
                    ))
                }
            }
        }
    }

    /// The sandbox answers, so bubblewrap has made it: the namespace bubblewrap's own
    /// process stays in is emptied, once, in the background.
    fn settled(&self) {
        let pid = self.narrowed.swap(0, Ordering::SeqCst);
        if pid == 0 || self._keep.is_none() {
            return;
        }
        // Opened here, while this link keeps the process unreaped.
        let ns = match std::fs::File::open(format!("/proc/{pid}/ns/mnt")) {
            Ok(ns) => ns,
            Err(e) => {
                tracing::warn!(pid, error = %e, "the namespace bubblewrap started in cannot be opened");
                return;
            }
        };
        // On the links' runtime: a caller's own may end before it runs.
        runtime().spawn_blocking(move || {
            if let Err(e) = crate::launch_mounts::empty(ns) {
                tracing::warn!(error = %e, "the namespace bubblewrap started in was not emptied; it keeps the host's mounts of then alive until the sandbox ends");
            }
        });
    }

    /// Starts a run: its socket made and handed over, the start sent, the agent's answer
    /// read. The run is read by the caller's task from then on.
    pub async fn spawn(&self, start: Start) -> Result<(Process, u32)> {
        let run = self.next.fetch_add(1, Ordering::SeqCst);
        let socket = |e: std::io::Error| Error::internal(format!("a run's socket: {e}"));
        let (mine, theirs) = std::os::unix::net::UnixStream::pair().map_err(socket)?;
        self.hand(&OwnedFd::from(theirs)).await?;
        let ender = Ender(Arc::new(mine.try_clone().map_err(socket)?));
        mine.set_nonblocking(true).map_err(socket)?;
        let (read, mut write) = tokio::net::UnixStream::from_std(mine)
            .map_err(socket)?
            .into_split();
        let stdin = start.stdin;
        let mut stream = RunStream::new(read);
        let answer = tokio::time::timeout(START_TIMEOUT, async {
            let frame = Frame::json(Kind::Start, run, &start).encode();
            // A write that fails still reads the agent's answer: a refusal sent before it
            // closed its end says why.
            let _ = write.write_all(&frame).await;
            stream.started().await
        });
        match answer.await {
            Ok(run_stream::Start::Started) => self.settled(),
            Ok(run_stream::Start::Refused(message)) => {
                self.settled();
                return Err(Error::new(
                    Code::ResourceExhausted,
                    format!("the executor refused the run: {message}"),
                ));
            }
            // A gone agent, or a run it dropped: `alive` tells them apart.
            Ok(run_stream::Start::Ended) => return Err(lost("its connection closed")),
            // Should the agent start it after all, it ends at once (the socket is closed).
            Err(_) => return Err(not_started()),
        }
        // Without input the write half is let go as it is: dropped, it would shut the socket.
        let input = if stdin {
            Some(RunInput::new(write, run))
        } else {
            write.forget();
            None
        };
        Ok((
            Process::of_run(stream, input, ender, self.memory.clone()),
            run,
        ))
    }
}

fn not_started() -> Error {
    Error::new(
        Code::Timeout,
        format!(
            "the executor did not start the run within {} s",
            START_TIMEOUT.as_secs()
        ),
    )
}

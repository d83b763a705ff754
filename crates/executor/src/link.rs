//! The harness's end of a run agent's socket: runs started over it, their output and exits
//! routed back to each run's [`Process`]. A link whose agent is gone says so
//! ([`Link::alive`]); its runs end as lost, and the executor starts a new agent.

use crate::cgroup;
use crate::process::{Exit, Process, Stream};
use crate::wire::{self, Exited, Frame, Kind, Refused, Start, Started};
use cloud_harness_error::{Code, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

/// How long a start may wait for the agent's answer (a frozen sandbox, say).
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Slot {
    started: Option<oneshot::Sender<std::result::Result<i32, String>>>,
    output: Option<mpsc::Sender<(Stream, Vec<u8>)>>,
    exit: Option<oneshot::Sender<Exit>>,
}

type Slots = Arc<Mutex<HashMap<u32, Slot>>>;

pub struct Link {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    slots: Slots,
    next: AtomicU32,
    alive: Arc<AtomicBool>,
    /// What keeps the agent (the bubblewrap process: killed with the link).
    _keep: Option<tokio::process::Child>,
    /// The sandbox's cgroup (bubblewrap), removed once the sandbox is gone.
    group: Option<cgroup::Group>,
    /// Where the kernel counts the executor's kills for memory, if it can be read.
    memory: Option<Arc<cgroup::Memory>>,
    /// Its memory and processes are bounded as a whole (a container, a cgroup).
    bounded: bool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
            .expect("a runtime for the executors' links")
    })
}

impl Link {
    /// A link over a connected socket; `keep` lives (and dies) with it.
    pub fn new(
        stream: std::os::unix::net::UnixStream,
        keep: Option<tokio::process::Child>,
    ) -> Result<Link> {
        let _inside = runtime().enter();
        let socket =
            |e: std::io::Error| Error::internal(format!("the executor's agent socket: {e}"));
        stream.set_nonblocking(true).map_err(socket)?;
        let stream = UnixStream::from_std(stream).map_err(socket)?;
        let (mut read, mut write) = stream.into_split();
        let (frames, mut queued) = mpsc::unbounded_channel::<Vec<u8>>();
        let slots: Slots = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let writer = {
            let alive = alive.clone();
            tokio::spawn(async move {
                while let Some(bytes) = queued.recv().await {
                    if write.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                alive.store(false, Ordering::SeqCst);
            })
        };
        let reader = {
            let (slots, alive) = (slots.clone(), alive.clone());
            tokio::spawn(async move {
                while let Ok(Some(frame)) = wire::read_async(&mut read).await {
                    route(&slots, frame).await;
                }
                alive.store(false, Ordering::SeqCst);
                // Every run still going ends as lost; its output closes.
                for (_, slot) in lock(&slots).drain() {
                    if let Some(tx) = slot.started {
                        let _ = tx.send(Err("its connection closed".into()));
                    }
                    if let Some(tx) = slot.exit {
                        let _ = tx.send(Exit {
                            lost: true,
                            ..Exit::default()
                        });
                    }
                }
            })
        };
        Ok(Link {
            frames,
            slots,
            next: AtomicU32::new(1),
            alive,
            _keep: keep,
            group: None,
            memory: None,
            bounded: false,
            tasks: vec![writer, reader],
        })
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

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Starts a run; its output, exit and kill.
    pub async fn spawn(&self, start: Start) -> Result<(Process, u32)> {
        let run = self.next.fetch_add(1, Ordering::SeqCst);
        let (started_tx, started_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        let (output_tx, output_rx) = mpsc::channel(16);
        lock(&self.slots).insert(
            run,
            Slot {
                started: Some(started_tx),
                output: Some(output_tx),
                exit: Some(exit_tx),
            },
        );
        if !self.alive() || self.send(Frame::json(Kind::Start, run, &start)).is_err() {
            lock(&self.slots).remove(&run);
            return Err(lost("its connection closed"));
        }
        match tokio::time::timeout(START_TIMEOUT, started_rx).await {
            Ok(Ok(Ok(_pid))) => {}
            Ok(Ok(Err(message))) => {
                lock(&self.slots).remove(&run);
                return Err(if self.alive() {
                    Error::new(
                        Code::ResourceExhausted,
                        format!("the executor refused the run: {message}"),
                    )
                } else {
                    lost(&message)
                });
            }
            Ok(Err(_)) => return Err(lost("its connection closed")),
            Err(_) => {
                lock(&self.slots).remove(&run);
                // Should the agent start it after all, it ends at once.
                let _ = self.send(Frame {
                    kind: Kind::Kill,
                    run,
                    payload: Vec::new(),
                });
                return Err(Error::new(
                    Code::Timeout,
                    format!(
                        "the executor did not start the run within {} s",
                        START_TIMEOUT.as_secs()
                    ),
                ));
            }
        }
        let frames = self.frames.clone();
        // Dropped with the process (a caller that gave up on the run): the run is killed.
        let guard = KillOnDrop {
            frames: self.frames.clone(),
            run,
        };
        let process = Process {
            memory: self.memory.clone(),
            output: output_rx,
            exit: Box::pin(async move {
                let _guard = guard;
                exit_rx.await.unwrap_or(Exit {
                    lost: true,
                    ..Exit::default()
                })
            }),
            kill: Box::new(move || {
                let _ = frames.send(
                    Frame {
                        kind: Kind::Kill,
                        run,
                        payload: Vec::new(),
                    }
                    .encode(),
                );
            }),
        };
        Ok((process, run))
    }

    /// Bytes for a run's standard input (started with `stdin`); empty closes it.
    pub fn input(&self, run: u32, bytes: Vec<u8>) -> Result<()> {
        self.send(Frame {
            kind: Kind::Stdin,
            run,
            payload: bytes,
        })
    }

    fn send(&self, frame: Frame) -> Result<()> {
        self.frames
            .send(frame.encode())
            .map_err(|_| lost("its connection closed"))
    }
}

/// Kills a run when what waits for its exit is dropped (after the exit, the agent ignores it).
struct KillOnDrop {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    run: u32,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.frames.send(
            Frame {
                kind: Kind::Kill,
                run: self.run,
                payload: Vec::new(),
            }
            .encode(),
        );
    }
}

/// Hands one frame from the agent to its run.
async fn route(slots: &Slots, frame: Frame) {
    let run = frame.run;
    match frame.kind {
        Kind::Started => {
            let pid = frame.parse::<Started>().map(|s| s.pid).unwrap_or(0);
            if let Some(tx) = lock(slots).get_mut(&run).and_then(|s| s.started.take()) {
                let _ = tx.send(Ok(pid));
            }
        }
        Kind::Refused => {
            let message = frame
                .parse::<Refused>()
                .map(|r| r.message)
                .unwrap_or_else(|e| e.to_string());
            if let Some(slot) = lock(slots).remove(&run) {
                if let Some(tx) = slot.started {
                    let _ = tx.send(Err(message));
                }
            }
        }
        Kind::Stdout | Kind::Stderr => {
            let stream = if frame.kind == Kind::Stdout {
                Stream::Stdout
            } else {
                Stream::Stderr
            };
            let tx = lock(slots).get(&run).and_then(|s| s.output.clone());
            if let Some(tx) = tx {
                // Waits while the run's reader is behind: output stays bounded.
                let _ = tx.send((stream, frame.payload)).await;
            }
        }
        Kind::End => {
            let mut slots = lock(slots);
            if let Some(slot) = slots.get_mut(&run) {
                slot.output = None;
                if slot.exit.is_none() {
                    slots.remove(&run);
                }
            }
        }
        Kind::Exit => {
            let exited = frame.parse::<Exited>().unwrap_or_default();
            let mut slots = lock(slots);
            if let Some(slot) = slots.get_mut(&run) {
                if let Some(tx) = slot.exit.take() {
                    let _ = tx.send(Exit {
                        code: exited.code,
                        signal: exited.signal,
                        lost: false,
                    });
                }
                if slot.output.is_none() {
                    slots.remove(&run);
                }
            }
        }
        Kind::Start | Kind::Stdin | Kind::Kill => {}
    }
}

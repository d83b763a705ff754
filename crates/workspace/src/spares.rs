//! Spare Docker executors: a few workspace shells made ahead of the opens that will take
//! them, each a folder of its own (`<home>/workspaces/ws_…` with its empty working tree, its
//! shared mounts folder, its identity files and agent socket folder) and a container created
//! and started on exactly those folders. An open takes one (its id becomes the workspace's)
//! instead of creating a container, and a refill makes the next one in the background.
//!
//! Nothing is shared between workspaces: a spare is made for one workspace id and is that
//! workspace's alone once taken; no container, folder or agent is ever handed on. A shell has
//! no record, so a server killed with spares leaves folders its next start removes as opens
//! that never finished (with their containers, by label); a server that stops removes them.
//! Until an open takes it, a shell's folder holds a file named [`MARKER`].

use super::activate::Activator;
use super::{mounts, Cleanup};
use cloud_harness_error::Result;
use cloud_harness_executor::{Executor, Places};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The file that marks a workspace folder as a spare's shell (until an open takes it), for
/// an operator or a test looking at `<home>/workspaces`.
pub const MARKER: &str = "spare";
/// How long a new spare's agent may take to listen.
const AGENT_START: Duration = Duration::from_secs(15);

pub(crate) struct Spare {
    pub id: String,
    pub executor: Executor,
}

struct Inner {
    ready: VecDeque<Spare>,
    /// A refill is going (one at a time).
    filling: bool,
    stopped: bool,
}

/// The spares of one server, and how many it keeps.
pub(crate) struct Spares {
    want: usize,
    inner: Arc<Mutex<Inner>>,
    /// The refill thread, if one was started: a stop waits for it.
    filler: Mutex<Option<std::thread::JoinHandle<()>>>,
    act: Activator,
    home: PathBuf,
}

impl Spares {
    pub fn new(want: usize, act: Activator, home: PathBuf) -> Spares {
        Spares {
            want,
            inner: Arc::new(Mutex::new(Inner {
                ready: VecDeque::new(),
                filling: false,
                stopped: false,
            })),
            filler: Mutex::new(None),
            act,
            home,
        }
    }

    /// A spare for an open, if one is ready and its agent answers (one whose container went
    /// away, a Docker engine restarted say, is removed); a refill starts either way.
    pub fn take(&self) -> Option<Spare> {
        let mut taken = None;
        loop {
            let next = self.lock().ready.pop_front();
            let Some(spare) = next else { break };
            if spare.executor.answers(Duration::ZERO) {
                let marker = dir_of(&self.home, &spare.id).join(MARKER);
                let _ = std::fs::remove_file(marker);
                taken = Some(spare);
                break;
            }
            tracing::warn!(workspace = %spare.id, "a spare executor no longer answers: removed");
            discard(&self.act, &self.home, spare);
        }
        self.refill();
        taken
    }

    /// Gives back a spare an open did not use.
    pub fn give_back(&self, spare: Spare) {
        let mut inner = self.lock();
        if inner.stopped {
            drop(inner);
            discard(&self.act, &self.home, spare);
        } else {
            inner.ready.push_front(spare);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes spares, on a thread of its own, until there are as many as wanted.
    pub fn refill(&self) {
        if self.want == 0 {
            return;
        }
        // Held until the new thread's handle is kept: a stop waits for it, so it never misses
        // a filler started as it stops.
        let mut filler = self.filler.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut inner = self.lock();
            if inner.filling || inner.stopped || inner.ready.len() >= self.want {
                return;
            }
            inner.filling = true;
        }
        let (inner, act, home, want) = (
            self.inner.clone(),
            self.act.clone(),
            self.home.clone(),
            self.want,
        );
        let spawned = std::thread::Builder::new()
            .name("executor-spares".into())
            .spawn(move || loop {
                let made = make(&act, &home);
                let mut guard = inner.lock().unwrap_or_else(|p| p.into_inner());
                match made {
                    Ok(spare) if !guard.stopped => guard.ready.push_back(spare),
                    Ok(spare) => {
                        drop(guard);
                        discard(&act, &home, spare);
                        return;
                    }
                    Err(e) => {
                        // Opens make their own containers meanwhile; the next open tries again.
                        tracing::warn!(error = %e, "cannot make a spare executor");
                        guard.filling = false;
                        return;
                    }
                }
                if guard.stopped || guard.ready.len() >= want {
                    guard.filling = false;
                    return;
                }
            });
        match spawned {
            Ok(handle) => {
                // The one before has ended: `filling` was false.
                *filler = Some(handle);
            }
            Err(_) => self.lock().filling = false,
        }
    }

    /// Removes every spare (at a server's stop), after the one being made; none is made
    /// after.
    pub fn stop(&self) {
        self.lock().stopped = true;
        let filler = self.filler.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(filler) = filler {
            let _ = filler.join();
        }
        let spares: Vec<Spare> = self.lock().ready.drain(..).collect();
        for spare in spares {
            discard(&self.act, &self.home, spare);
        }
    }

    pub fn ready(&self) -> usize {
        self.lock().ready.len()
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.stop();
    }
}

fn dir_of(home: &std::path::Path, id: &str) -> PathBuf {
    super::record::workspaces_dir(home).join(id)
}

/// A shell: the folders an executor binds, and the executor, started on them.
fn make(act: &Activator, home: &std::path::Path) -> Result<Spare> {
    let id = super::open::new_id();
    let dir = dir_of(home, &id);
    std::fs::create_dir_all(&dir).map_err(|e| cloud_harness_error::Error::io(&dir, e))?;
    std::fs::write(dir.join(MARKER), b"")
        .map_err(|e| cloud_harness_error::Error::io(&dir.join(MARKER), e))?;
    let mut cleanup = Cleanup {
        dir: Some(dir.clone()),
        executor: None,
        store: act.provisioner.store.clone(),
    };
    let places = Places::of(&dir);
    std::fs::create_dir_all(&places.repo)
        .map_err(|e| cloud_harness_error::Error::io(&places.repo, e))?;
    mounts::share(&places.mounts)?;
    cleanup.executor = act.make_executor(&places, &id)?;
    // Ready only once its agent listens.
    if !cleanup
        .executor
        .as_ref()
        .is_some_and(|e| e.answers(AGENT_START))
    {
        return Err(cloud_harness_error::Error::new(
            cloud_harness_error::Code::Upstream,
            "a spare executor's agent did not start",
        ));
    }
    let executor = cleanup.disarm().ok_or_else(|| {
        cloud_harness_error::Error::internal("a spare executor without a backend")
    })?;
    Ok(Spare { id, executor })
}

fn discard(act: &Activator, home: &std::path::Path, spare: Spare) {
    drop(Cleanup {
        dir: Some(dir_of(home, &spare.id)),
        executor: Some(spare.executor),
        store: act.provisioner.store.clone(),
    });
}

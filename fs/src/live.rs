//! Live tiers: the folders of a stack are watched (inotify), and a change builds a new
//! generation, makes it current and reports what the kernel must forget.

use crate::cas::Store;
use crate::discovery::SkillCache;
use crate::namespace::{Invalidation, Namespace};
use crate::stack::StackSpec;
use notify::{EventKind, RecursiveMode, Watcher};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Changes that arrive together (an editor's save, a `git checkout`) make one generation.
const SETTLE: Duration = Duration::from_millis(100);
const REPEAT_AFTER: Duration = Duration::from_millis(50);

enum Msg {
    Changed,
    Stop,
}

/// A namespace kept current, and what to do with its invalidations (tell the kernel).
pub type Target = (Arc<Namespace>, Box<dyn Fn(&[Invalidation]) + Send>);

pub struct LiveTiers {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

/// The folders of a stack, watched from before its first generation is built: a change made
/// while it is built, or before [`Watch::start`], is queued and makes the next generation.
pub struct Watch {
    spec: StackSpec,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    watched: Vec<(PathBuf, bool)>,
    watcher: Option<notify::RecommendedWatcher>,
}

impl LiveTiers {
    /// Starts watching the folders of `spec`; build the first generation after this.
    pub fn watch(spec: StackSpec) -> Watch {
        let (tx, rx) = channel();
        let watched = existing(&spec);
        let watcher = arm(&watched, &tx);
        Watch {
            spec,
            tx,
            rx,
            watched,
            watcher,
        }
    }
}

impl Watch {
    /// The stack being watched.
    pub fn spec(&self) -> &StackSpec {
        &self.spec
    }

    /// Each new generation is made current in every target, whose callback then receives
    /// the invalidations.
    pub fn start(self, store: Store, cache: Arc<SkillCache>, targets: Vec<Target>) -> LiveTiers {
        let tx = self.tx.clone();
        let thread = std::thread::Builder::new()
            .name("live-tiers".into())
            .spawn(move || run(self, store, cache, targets))
            .expect("spawn the live-tier thread");
        LiveTiers {
            tx,
            thread: Some(thread),
        }
    }
}

impl Drop for LiveTiers {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn arm(paths: &[(PathBuf, bool)], tx: &Sender<Msg>) -> Option<notify::RecommendedWatcher> {
    let tx = tx.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads (ours included: every generation re-reads the folders) change nothing.
        if let Ok(e) = event {
            if !matches!(e.kind, EventKind::Access(_)) {
                let _ = tx.send(Msg::Changed);
            }
        }
    })
    .map_err(|e| tracing::warn!(error = %e, "cannot watch live tiers"))
    .ok()?;
    for (path, whole) in paths {
        let mode = if *whole {
            RecursiveMode::Recursive
        } else {
            RecursiveMode::NonRecursive
        };
        if let Err(e) = watcher.watch(path, mode) {
            tracing::warn!(path = %path.display(), error = %e, "cannot watch");
        }
    }
    Some(watcher)
}

/// The live folders that exist now, canonical.
fn existing(spec: &StackSpec) -> Vec<(PathBuf, bool)> {
    spec.live_paths()
        .into_iter()
        .filter_map(|(p, whole)| Some((p.canonicalize().ok()?, whole)))
        .collect()
}

fn run(watch: Watch, store: Store, cache: Arc<SkillCache>, targets: Vec<Target>) {
    let Watch {
        spec,
        tx,
        rx,
        mut watched,
        watcher: mut _watcher,
    } = watch;
    loop {
        match rx.recv() {
            Ok(Msg::Changed) => {}
            Ok(Msg::Stop) | Err(_) => return,
        }
        let deadline = Instant::now() + SETTLE;
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Msg::Changed) => continue,
                Ok(Msg::Stop) => return,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        let previous = targets.first().map(|(ns, _)| ns.generation());
        let current = previous.as_ref().map(|g| g.digest());
        match spec.generation(&store, &cache) {
            Ok(next) if Some(next.digest()) != current => {
                let next = Arc::new(next);
                let digest = next.digest();
                // A name that a new conflict stops serving is said, never a silent
                // disappearance (listings and `.resolution.json` carry it too).
                for r in next.index.conflicts() {
                    let already = previous
                        .as_ref()
                        .is_some_and(|g| g.index.conflicts().any(|c| c.name == r.name));
                    if !already {
                        tracing::warn!(skill = %r.name, generation = %digest, "a live change made a same-tier conflict: the skill is no longer served until it is settled");
                    }
                }
                let changes: Vec<Vec<Invalidation>> = targets
                    .iter()
                    .map(|(ns, _)| ns.set_generation(next.clone()))
                    .collect();
                for ((_, apply), items) in targets.iter().zip(&changes) {
                    apply(items);
                }
                // A lookup that read the previous generation may answer the kernel just after
                // the invalidation; saying it again shortly after closes that window.
                std::thread::sleep(REPEAT_AFTER);
                for ((_, apply), items) in targets.iter().zip(&changes) {
                    apply(items);
                }
                tracing::info!(generation = %digest, "new generation");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "a live tier changed but cannot be read; still serving the previous generation")
            }
        }
        // Folders may have appeared (a new `.claude/skills`) or gone.
        let now = existing(&spec);
        if now != watched {
            watched = now;
            _watcher = arm(&watched, &tx);
            // What was written into a new folder before its watch existed sent no event:
            // read once more now that it is watched.
            let _ = tx.send(Msg::Changed);
        }
    }
}

//! Live tiers: the folders of a stack are watched (inotify, within the budgets of
//! [`crate::watch`]), and a change builds a new generation, makes it current and reports what
//! the kernel must forget.

use crate::cas::Store;
use crate::discovery::SkillCache;
use crate::namespace::{Invalidation, Namespace};
use crate::stack::StackSpec;
use crate::watch::{Budget, Pool, Watcher};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Changes that arrive together (an editor's save, a `git checkout`) make one generation.
const SETTLE: Duration = Duration::from_millis(100);
const REPEAT_AFTER: Duration = Duration::from_millis(50);

/// A namespace kept current, and what to do with its invalidations (tell the kernel).
pub type Target = (Arc<Namespace>, Box<dyn Fn(&[Invalidation]) + Send>);

pub struct LiveTiers {
    /// Written to (or closed) to stop the thread.
    stop: UnixStream,
    thread: Option<JoinHandle<()>>,
}

/// The folders of a stack, watched from before its first generation is built: a change made
/// while it is built, or before [`Watch::start`], is queued and makes the next generation.
pub struct Watch {
    spec: StackSpec,
    /// None: live updates are off (the system gave no inotify instance).
    watcher: Option<Watcher>,
    warnings: Vec<String>,
    stop: (UnixStream, UnixStream),
}

impl LiveTiers {
    /// Starts watching the folders of `spec` within `budget`, its watches taken from `pool`;
    /// build the first generation after this.
    pub fn watch(spec: StackSpec, pool: &Pool, budget: Budget) -> std::io::Result<Watch> {
        let stop = UnixStream::pair()?;
        let (watcher, warnings) = match Watcher::new(pool.clone(), budget) {
            Ok(mut w) => {
                w.watch(&spec.live_paths());
                let warnings = w.warnings().to_vec();
                (Some(w), warnings)
            }
            Err(e) => {
                let said = format!("live updates are off: the system gives no more inotify instances ({e}; fs.inotify.max_user_instances)");
                tracing::warn!("{said}");
                (None, vec![said])
            }
        };
        Ok(Watch {
            spec,
            watcher,
            warnings,
            stop,
        })
    }
}

impl Watch {
    /// The stack being watched.
    pub fn spec(&self) -> &StackSpec {
        &self.spec
    }

    /// What is not watched, and why (a budget spent, a folder too deep).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Folders watched now.
    pub fn watched(&self) -> usize {
        self.watcher.as_ref().map_or(0, Watcher::len)
    }

    /// Each new generation is made current in every target, whose callback then receives
    /// the invalidations.
    pub fn start(self, store: Store, cache: Arc<SkillCache>, targets: Vec<Target>) -> LiveTiers {
        let Watch {
            spec,
            watcher,
            stop: (stop, stopped),
            ..
        } = self;
        let thread = std::thread::Builder::new()
            .name("live-tiers".into())
            .spawn(move || run(spec, watcher, stopped, store, cache, targets))
            .expect("spawn the live-tier thread");
        LiveTiers {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for LiveTiers {
    fn drop(&mut self) {
        let _ = self.stop.write_all(b"x");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum Woke {
    Changed,
    Quiet,
    Stop,
}

/// Waits for a change of the watched folders (draining what the kernel queued) or the word
/// to stop, at most `limit` (forever without one).
fn wait(watcher: &mut Option<Watcher>, stopped: &mut UnixStream, limit: Option<Duration>) -> Woke {
    let deadline = limit.map(|l| Instant::now() + l);
    loop {
        let left = match deadline {
            None => PollTimeout::NONE,
            Some(d) => {
                let ms = d.saturating_duration_since(Instant::now()).as_millis();
                PollTimeout::try_from(ms.min(60_000) as i32).unwrap_or(PollTimeout::ZERO)
            }
        };
        let (stop_ready, change_ready) = {
            let mut fds = vec![PollFd::new(stopped.as_fd(), PollFlags::POLLIN)];
            if let Some(w) = watcher.as_ref() {
                fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, left) {
                Ok(0) => return Woke::Quiet,
                Ok(_) => (
                    fds[0].any().unwrap_or(true),
                    fds.get(1).is_some_and(|f| f.any().unwrap_or(false)),
                ),
                Err(nix::errno::Errno::EINTR) => (false, false),
                Err(_) => return Woke::Stop,
            }
        };
        if stop_ready {
            let _ = stopped.read(&mut [0u8; 1]);
            return Woke::Stop;
        }
        if change_ready && watcher.as_mut().is_some_and(Watcher::changed) {
            return Woke::Changed;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Woke::Quiet;
        }
    }
}

fn run(
    spec: StackSpec,
    mut watcher: Option<Watcher>,
    mut stopped: UnixStream,
    store: Store,
    cache: Arc<SkillCache>,
    targets: Vec<Target>,
) {
    let mut again = false;
    loop {
        if !again {
            match wait(&mut watcher, &mut stopped, None) {
                Woke::Changed => {}
                Woke::Quiet => continue,
                Woke::Stop => return,
            }
        }
        again = false;
        loop {
            match wait(&mut watcher, &mut stopped, Some(SETTLE)) {
                Woke::Changed => continue,
                Woke::Quiet => break,
                Woke::Stop => return,
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
        // Folders may have appeared (a new `.claude/skills`, a new skill) or gone. What was
        // written into a new folder before its watch existed sent no event: read once more.
        if let Some(w) = watcher.as_mut() {
            again = w.watch(&spec.live_paths());
        }
    }
}

//! Live tiers: the folders of a stack are watched (inotify, within the budgets of
//! [`crate::watch`]), and a change builds a new generation, makes it current and reports what
//! the kernel must forget.
//!
//! A generation reads the stack's folders again (a file unchanged since it was last read is
//! not read again, see [`cloud_harness_store::cas`]'s import), so generations are paced: at least
//! [`MIN_INTERVAL`] apart, twice as far apart each time changes keep coming before the
//! interval is over (up to [`MAX_INTERVAL`]), back to the minimum after [`QUIET`] without a
//! change. A writer touching a file every few milliseconds costs a generation every 30 s.

use crate::watch::{Budget, Pool, Watcher};
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::namespace::{Invalidation, Namespace};
use cloud_harness_skills::stack::StackSpec;
use cloud_harness_store::cas::Store;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Changes that arrive together (an editor's save, a `git checkout`) make one generation.
const SETTLE: Duration = Duration::from_millis(100);
/// Changes that never stop for [`SETTLE`] make a generation anyway, this long past its time.
const SETTLE_AT_MOST: Duration = Duration::from_secs(1);
/// The least time between two generations.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The most the time between two generations grows to while changes keep coming.
pub const MAX_INTERVAL: Duration = Duration::from_secs(30);
/// A change this long after the last generation finds the interval back at its least.
pub const QUIET: Duration = Duration::from_secs(10);
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
        LiveTiers::watch_with(spec, Watcher::new(pool.clone(), budget))
    }

    /// [`LiveTiers::watch`] with the watcher the system gave, or why it gave none.
    fn watch_with(spec: StackSpec, made: std::io::Result<Watcher>) -> std::io::Result<Watch> {
        let stop = UnixStream::pair()?;
        let (watcher, warnings) = match made {
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

/// When generations may be built: see the module's documentation.
#[derive(Debug)]
struct Pace {
    interval: Duration,
    /// When the last generation was built.
    last: Option<Instant>,
}

impl Pace {
    fn new() -> Pace {
        Pace {
            interval: MIN_INTERVAL,
            last: None,
        }
    }

    /// A change came at `now`: when its generation may be built.
    fn changed(&mut self, now: Instant) -> Instant {
        let Some(last) = self.last else {
            return now;
        };
        let since = now.saturating_duration_since(last);
        if since >= QUIET {
            self.interval = MIN_INTERVAL;
            return now;
        }
        if since < self.interval {
            let ready = last + self.interval;
            // Changes keep coming: the next waits longer.
            self.interval = (self.interval * 2).min(MAX_INTERVAL);
            return ready;
        }
        now
    }

    fn built(&mut self, at: Instant) {
        self.last = Some(at);
    }
}

/// Takes in changes until `ready` and then until [`SETTLE`] passes without one (at most
/// [`SETTLE_AT_MOST`] past `ready`); false when told to stop.
fn settle(watcher: &mut Option<Watcher>, stopped: &mut UnixStream, ready: Instant) -> bool {
    let mut last_change = Instant::now();
    loop {
        let until = ready.max(last_change + SETTLE).min(ready + SETTLE_AT_MOST);
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        match wait(watcher, stopped, Some(left)) {
            Woke::Changed => last_change = Instant::now(),
            Woke::Quiet => {}
            Woke::Stop => return false,
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
    let mut pace = Pace::new();
    loop {
        if !again {
            match wait(&mut watcher, &mut stopped, None) {
                Woke::Changed => {}
                Woke::Quiet => continue,
                Woke::Stop => return,
            }
        }
        again = false;
        let ready = pace.changed(Instant::now());
        if !settle(&mut watcher, &mut stopped, ready) {
            return;
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
        // Paced from the end of the work: a generation that takes longer than the interval
        // still leaves the interval free.
        pace.built(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_harness_skills::generation::View;
    use cloud_harness_skills::resolver::Tier;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn generations_wait_longer_while_changes_keep_coming_and_less_after_a_quiet_time() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut pace = Pace::new();
        // The first change is built at once.
        assert_eq!(pace.changed(t0), t0);
        pace.built(t0);
        // Changes every moment: 1, 2, 4, 8, 16 s apart, then 30 s.
        let mut last = t0;
        for gap in [1, 2, 4, 8, 16, 30, 30] {
            let ready = pace.changed(last + Duration::from_millis(150));
            assert_eq!(ready, last + s(gap));
            pace.built(ready);
            last = ready;
        }
        // A change past the interval is built at once, the interval kept.
        let late = last + s(31);
        assert_eq!(pace.changed(late - s(22)), last + s(30));
        pace.built(last + s(30));
        last += s(30);
        // After a quiet time, at once again, and the next 1 s later.
        let after = last + QUIET;
        assert_eq!(pace.changed(after), after);
        pace.built(after);
        assert_eq!(pace.changed(after + s(0)), after + s(1));
    }

    /// A stack of one folder, watched; each generation made current is counted.
    struct Live {
        _tmp: tempfile::TempDir,
        dir: std::path::PathBuf,
        ns: Arc<Namespace>,
        built: Arc<AtomicUsize>,
        _live: LiveTiers,
    }

    fn live(made: impl FnOnce(&Pool) -> std::io::Result<Watcher>) -> (Live, Vec<String>) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path().join("store")).unwrap();
        let dir = tmp.path().join("skills");
        std::fs::create_dir_all(dir.join("s")).unwrap();
        std::fs::write(dir.join("s/SKILL.md"), "---\ndescription: v0\n---\n").unwrap();
        let spec = StackSpec {
            dirs: vec![(Tier::Owner, dir.clone())],
            ..StackSpec::default()
        };
        let pool = Pool::new(100);
        let watch = LiveTiers::watch_with(spec, made(&pool)).unwrap();
        let warnings = watch.warnings().to_vec();
        let cache = Arc::new(SkillCache::default());
        let first = Arc::new(watch.spec().generation(&store, &cache).unwrap());
        let ns = Arc::new(Namespace::new(store.clone(), View::Merged, first));
        let built = Arc::new(AtomicUsize::new(0));
        let counted = built.clone();
        // Told twice per generation (once more shortly after).
        let apply = Box::new(move |_: &[Invalidation]| {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        let live = watch.start(store, cache, vec![(ns.clone(), apply)]);
        let made = Live {
            _tmp: tmp,
            dir,
            ns,
            built,
            _live: live,
        };
        (made, warnings)
    }

    impl Live {
        fn generations(&self) -> usize {
            self.built.load(Ordering::Relaxed) / 2
        }

        fn serves(&self, text: &str) -> bool {
            let g = self.ns.generation();
            let served = g
                .index
                .winners()
                .any(|c| c.info.meta.description.contains(text));
            served
        }
    }

    fn waited_for(what: &str, mut probe: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !probe() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_writer_that_never_stops_gets_few_generations_and_its_last_change_served() {
        let (l, warnings) = live(|pool| Watcher::new(pool.clone(), Budget::default()));
        assert!(warnings.is_empty(), "{warnings:?}");
        // A change every 150 ms for 4.5 s: a generation after each would be 30.
        let skill = l.dir.join("s/SKILL.md");
        for i in 1..=30 {
            std::fs::write(&skill, format!("---\ndescription: v{i}\n---\n")).unwrap();
            std::thread::sleep(Duration::from_millis(150));
        }
        let while_writing = l.generations();
        waited_for("the last change is served", || l.serves("v30"));
        // Built at about 0.1, 1.1, 3.1 s while writing (and 7.1 s after): a slower machine
        // builds fewer, never more.
        assert!(while_writing <= 4, "{while_writing} generations");
        assert!(l.generations() <= 5, "{} generations", l.generations());
    }

    #[test]
    fn no_inotify_instance_turns_live_updates_off_with_a_warning() {
        let refused = || Err(std::io::Error::from_raw_os_error(nix::libc::EMFILE));
        let (l, warnings) = live(|_| refused());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("live updates are off")
                && warnings[0].contains("fs.inotify.max_user_instances"),
            "{warnings:?}"
        );
        // Served as it was; a change is not seen, and stopping ends the thread.
        assert!(l.serves("v0"));
        std::fs::write(l.dir.join("s/SKILL.md"), "---\ndescription: v1\n---\n").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(l.generations(), 0);
        assert!(l.serves("v0"));
    }
}

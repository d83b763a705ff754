//! Live tiers: the folders of a stack are watched (inotify, within the budgets of
//! [`crate::watch`]), and a change builds a new generation, makes it current and reports what
//! the kernel must forget.
//!
//! A generation reads the stack's folders again (a file unchanged since it was last read is
//! not read again, see [`cloud_harness_store::cas`]'s import), so generations are paced: at least
//! [`MIN_INTERVAL`] apart, twice as far apart each time changes keep coming before the
//! interval is over (up to [`MAX_INTERVAL`]), back to the minimum after [`QUIET`] without a
//! change. A writer touching a file every few milliseconds costs a generation every 30 s.
//!
//! A live tier holds no thread while nothing changes: one thread of the process waits for
//! the changes of every live tier ([`waiter`]), and a generation is built on a thread of its
//! own, which ends with it.

mod waiter;

use crate::watch::{Budget, Pool, Watcher};
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::namespace::{Invalidation, Namespace};
use cloud_harness_skills::stack::StackSpec;
use cloud_harness_store::cas::Store;
use std::sync::Arc;
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
pub type Target = (Arc<Namespace>, Box<dyn Fn(&[Invalidation]) + Send + Sync>);

/// A stack's live tiers, kept current until dropped.
pub struct LiveTiers {
    /// None: live updates are off (no inotify instance, or no waiter).
    tier: Option<Arc<waiter::Tier>>,
}

/// The folders of a stack, watched from before its first generation is built: a change made
/// while it is built, or before [`Watch::start`], is queued and makes the next generation.
pub struct Watch {
    spec: StackSpec,
    /// None: live updates are off (the system gave no inotify instance).
    watcher: Option<Watcher>,
    warnings: Vec<String>,
}

impl LiveTiers {
    /// Starts watching the folders of `spec` within `budget`, its watches taken from `pool`;
    /// build the first generation after this.
    pub fn watch(spec: StackSpec, pool: &Pool, budget: Budget) -> std::io::Result<Watch> {
        LiveTiers::watch_with(spec, Watcher::new(pool.clone(), budget))
    }

    /// [`LiveTiers::watch`] with the watcher the system gave, or why it gave none.
    fn watch_with(spec: StackSpec, made: std::io::Result<Watcher>) -> std::io::Result<Watch> {
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
        let Watch { spec, watcher, .. } = self;
        let Some(watcher) = watcher else {
            return LiveTiers { tier: None };
        };
        let work = Generations {
            spec,
            store,
            cache,
            targets,
        };
        match waiter::watch(watcher, work) {
            Ok(tier) => LiveTiers { tier: Some(tier) },
            Err(e) => {
                tracing::warn!(error = %e, "live updates are off: no thread waits for changes");
                LiveTiers { tier: None }
            }
        }
    }
}

impl Drop for LiveTiers {
    /// Stops watching; a generation being built is waited for (none is applied after).
    fn drop(&mut self) {
        if let Some(tier) = self.tier.take() {
            waiter::unwatch(&tier);
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

/// A change waiting for its generation: taken in until `ready`, then until [`SETTLE`] passes
/// without another (at most [`SETTLE_AT_MOST`] past `ready`).
#[derive(Debug, Clone, Copy)]
struct Settling {
    ready: Instant,
    last_change: Instant,
}

impl Settling {
    /// When its generation is built, as things stand.
    fn until(&self) -> Instant {
        self.ready
            .max(self.last_change + SETTLE)
            .min(self.ready + SETTLE_AT_MOST)
    }
}

/// What a change of a stack's folders makes: a new generation, current in every target.
struct Generations {
    spec: StackSpec,
    store: Store,
    cache: Arc<SkillCache>,
    targets: Vec<Target>,
}

impl Generations {
    /// Builds the stack's generation and, if it differs, makes it current and tells the
    /// targets what changed. Then watches the folders as they are now (some may have
    /// appeared or gone): whether a folder is newly watched, so what was written into it
    /// before its watch existed, which sent no event, needs another generation.
    fn build(&self, watcher: &std::sync::Mutex<Watcher>) -> bool {
        let targets = &self.targets;
        let previous = targets.first().map(|(ns, _)| ns.generation());
        let current = previous.as_ref().map(|g| g.digest());
        match self.spec.generation(&self.store, &self.cache) {
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
        let places = self.spec.live_paths();
        watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .watch(&places)
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

    /// Threads of this process named `name`.
    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    }

    #[test]
    fn one_thread_waits_for_every_stack_and_each_sees_its_own_changes() {
        let stacks: Vec<Live> = (0..30)
            .map(|_| live(|pool| Watcher::new(pool.clone(), Budget::default())).0)
            .collect();
        assert_eq!(waiter::tiers(), 30);
        assert_eq!(threads_named("live-tiers"), 1);
        // Every other stack changes: those, and only those, get a generation.
        for (i, l) in stacks.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            let text = format!("---\ndescription: changed-{i}\n---\n");
            std::fs::write(l.dir.join("s/SKILL.md"), text).unwrap();
        }
        for (i, l) in stacks.iter().enumerate() {
            if i % 2 == 0 {
                waited_for("a changed stack is served", || {
                    l.serves(&format!("changed-{i}"))
                });
                waited_for("its generation is told twice", || l.generations() == 1);
            }
        }
        waited_for("the generations' threads end", || {
            threads_named("live-build") == 0
        });
        for (i, l) in stacks.iter().enumerate() {
            let expected = if i % 2 == 0 { 1 } else { 0 };
            assert_eq!(l.generations(), expected, "stack {i}");
        }
        assert_eq!(threads_named("live-tiers"), 1);
        drop(stacks);
        assert_eq!(waiter::tiers(), 0);
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

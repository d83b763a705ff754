//! The one thread that waits for the changes of every live tier of the process: one epoll
//! over every tier's inotify instance, its timeout the nearest time a generation is due. It
//! only reads what the kernel queued and keeps time; a generation due is built on a thread
//! of its own, so a slow one (a large project read again) holds up no other tier.
//!
//! A tier's instance is armed for one wake at a time (`EPOLLONESHOT`) and armed again once
//! its events are read. The waiter never waits for a tier's watcher: while a generation's
//! thread holds it (watching folders that appeared), the change is noted and that thread
//! reads and arms it when done.

use super::{Generations, Pace, Settling, MIN_INTERVAL};
use crate::watch::Watcher;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// A stack's live tiers as the waiter knows them.
pub(super) struct Tier {
    key: u64,
    watcher: Mutex<Watcher>,
    work: Generations,
    state: Mutex<State>,
    /// Signalled when a generation's thread ends.
    built: Condvar,
}

struct State {
    pace: Pace,
    /// A change waiting for its generation.
    settling: Option<Settling>,
    building: bool,
    /// A change came while building: another generation after this one.
    again: bool,
    /// Its instance was not armed again (its watcher was busy): the building thread does.
    unarmed: bool,
    stopped: bool,
}

struct Waiter {
    /// Whether its thread runs (started with the first tier; tried again until it does).
    running: Mutex<bool>,
    epoll: Epoll,
    /// Written to when a tier's due time may have come nearer.
    wake: EventFd,
    tiers: Mutex<HashMap<u64, Arc<Tier>>>,
    next_key: AtomicU64,
}

const WAKE: u64 = 0;

static WAITER: OnceLock<Waiter> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn waiter() -> io::Result<&'static Waiter> {
    let w = match WAITER.get() {
        Some(w) => w,
        None => {
            let made = Waiter {
                running: Mutex::new(false),
                epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
                wake: EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?,
                tiers: Mutex::new(HashMap::new()),
                next_key: AtomicU64::new(WAKE + 1),
            };
            made.epoll.add(
                made.wake.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, WAKE),
            )?;
            // Another caller may have made it meanwhile: theirs is kept.
            WAITER.get_or_init(|| made)
        }
    };
    let mut running = lock(&w.running);
    if !*running {
        // A system out of threads now: no tier is taken, and the next one tries again.
        std::thread::Builder::new()
            .name("live-tiers".into())
            .spawn(move || w.run())?;
        *running = true;
    }
    Ok(w)
}

/// Starts waiting for the changes `watcher` sees, each making a generation of `work`.
pub(super) fn watch(watcher: Watcher, work: Generations) -> io::Result<Arc<Tier>> {
    let w = waiter()?;
    let key = w.next_key.fetch_add(1, Ordering::Relaxed);
    let tier = Arc::new(Tier {
        key,
        watcher: Mutex::new(watcher),
        work,
        state: Mutex::new(State {
            pace: Pace::new(),
            settling: None,
            building: false,
            again: false,
            unarmed: false,
            stopped: false,
        }),
        built: Condvar::new(),
    });
    lock(&w.tiers).insert(key, tier.clone());
    let added = w.epoll.add(lock(&tier.watcher).as_fd(), armed(key));
    if let Err(e) = added {
        lock(&w.tiers).remove(&key);
        return Err(e.into());
    }
    Ok(tier)
}

/// Stops waiting for `tier`; a generation being built is waited for, and none comes after.
pub(super) fn unwatch(tier: &Arc<Tier>) {
    let Some(w) = WAITER.get() else { return };
    {
        let mut state = lock(&tier.state);
        state.stopped = true;
        state.settling = None;
        while state.building {
            state = tier.built.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
    let _ = w.epoll.delete(lock(&tier.watcher).as_fd());
    lock(&w.tiers).remove(&tier.key);
}

/// How many stacks' live tiers are waited for now.
#[cfg(test)]
pub(super) fn tiers() -> usize {
    WAITER.get().map_or(0, |w| lock(&w.tiers).len())
}

fn armed(key: u64) -> EpollEvent {
    EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT, key)
}

impl Waiter {
    fn arm(&self, tier: &Tier, watcher: &Watcher) {
        // ENOENT: no longer waited for.
        let _ = self.epoll.modify(watcher.as_fd(), &mut armed(tier.key));
    }

    fn wake(&self) {
        let _ = self.wake.write(1);
    }

    fn run(&'static self) {
        let mut events = vec![EpollEvent::empty(); 64];
        // The nearest time a generation is due, from the last pass over the tiers (a build
        // that ends, or a tier that changes, wakes the wait and makes another pass).
        let mut nearest: Option<Instant> = None;
        loop {
            cloud_harness_memory::idle::at_idle();
            let timeout = match nearest {
                // Bounded, so the thread gives back what it holds even with no tier left.
                None => EpollTimeout::try_from(cloud_harness_memory::idle::LOOK_EVERY)
                    .unwrap_or(EpollTimeout::NONE),
                Some(due) => {
                    let ms = due.saturating_duration_since(Instant::now()).as_millis();
                    // Rounded up: woken before it is due, it would only wait again.
                    let most = cloud_harness_memory::idle::LOOK_EVERY.as_millis();
                    let ms = (ms + 1).min(most) as u16;
                    EpollTimeout::from(ms)
                }
            };
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    tracing::error!(error = %e, "waiting for changes of live tiers");
                    std::thread::sleep(Duration::from_millis(100));
                    0
                }
            };
            let now = Instant::now();
            for event in &events[..n] {
                if event.data() == WAKE {
                    let _ = self.wake.read();
                    continue;
                }
                let tier = lock(&self.tiers).get(&event.data()).cloned();
                if let Some(tier) = tier {
                    self.changed(&tier, now);
                }
            }
            let tiers: Vec<Arc<Tier>> = lock(&self.tiers).values().cloned().collect();
            nearest = tiers
                .iter()
                .filter_map(|tier| self.build_if_due(tier, now))
                .min();
        }
    }

    /// `tier`'s instance has events: read them, and if one is a change, note it.
    fn changed(&self, tier: &Tier, now: Instant) {
        let mut watcher = match tier.watcher.try_lock() {
            Ok(w) => w,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                let mut state = lock(&tier.state);
                if state.building {
                    // Its generation's thread holds it (watching folders): that thread reads
                    // and arms it when done, and builds again.
                    state.unarmed = true;
                    state.again = true;
                    return;
                }
                drop(state);
                // Held for a moment only (a generation's last step, or a stop).
                lock(&tier.watcher)
            }
        };
        let changed = watcher.changed();
        self.arm(tier, &watcher);
        drop(watcher);
        if changed {
            note_change(&mut lock(&tier.state), now);
        }
    }

    /// Starts `tier`'s generation if it is due; when the next one is due, if any.
    fn build_if_due(&'static self, tier: &Arc<Tier>, now: Instant) -> Option<Instant> {
        let mut state = lock(&tier.state);
        let until = state.settling.map(|s| s.until());
        if until.is_none_or(|u| u > now) || state.building || state.stopped {
            return until;
        }
        state.settling = None;
        state.building = true;
        state.again = false;
        drop(state);
        let t = tier.clone();
        let spawned = std::thread::Builder::new()
            .name("live-build".into())
            .spawn(move || self.build(&t));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread for a live tier's generation; trying again");
            let mut state = lock(&tier.state);
            state.building = false;
            let ready = now + MIN_INTERVAL;
            let retry = Settling {
                ready,
                last_change: ready,
            };
            state.settling = Some(retry);
            drop(state);
            tier.built.notify_all();
            return Some(retry.until());
        }
        None // its thread wakes the waiter when done
    }

    /// A generation's thread: builds it, then reads what came meanwhile.
    fn build(&self, tier: &Tier) {
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tier.work.build(&tier.watcher)
        }));
        // A bug, not a reason to leave the tier building for good (a stop would wait on it).
        let newly_watched = built.unwrap_or_else(|_| {
            tracing::error!("building a live tier's generation panicked");
            false
        });
        let mut watcher = lock(&tier.watcher);
        let changed = watcher.changed();
        let now = Instant::now();
        let mut state = lock(&tier.state);
        // Taken together with the end of `building`, under both locks: the waiter either
        // saw it building and left the arming here, or sees it done and arms it itself.
        if std::mem::take(&mut state.unarmed) {
            self.arm(tier, &watcher);
        }
        // Paced from the end of the work: a generation that takes longer than the interval
        // still leaves the interval free.
        state.pace.built(now);
        state.building = false;
        let again = std::mem::take(&mut state.again) || changed || newly_watched;
        if again {
            note_change(&mut state, now);
        }
        drop(state);
        drop(watcher);
        tier.built.notify_all();
        self.wake();
    }
}

/// A change at `now`: a generation is due once it settles.
fn note_change(state: &mut State, now: Instant) {
    if state.stopped {
        return;
    }
    if state.building {
        state.again = true;
        return;
    }
    match &mut state.settling {
        Some(s) => s.last_change = now,
        None => {
            let ready = state.pace.changed(now);
            state.settling = Some(Settling {
                ready,
                last_change: now,
            });
        }
    }
}

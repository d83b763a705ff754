//! When the process's threads give back what the allocator holds free for them.
//!
//! mimalloc returns a page to the system only once every block in it is free, and a block freed
//! by another thread than the one that allocated it waits on its page until that thread
//! collects it. A thread that made a workspace's records (a FUSE thread answering its lookups,
//! a runtime worker, a blocking thread that opened it) and then waits for work keeps those
//! pages, whoever else asks the allocator to give back: after closing 100 workspaces, the
//! server's pages still counted ~290,000 blocks in use where 2,500 were live, and its resident
//! memory stayed 80-110 MiB above the empty server's (`cargo bench --bench scale`).
//!
//! So the process [`ask`]s, and each long-lived thread gives back its own at its next idle
//! point ([`at_idle`]: a blocking thread after work given through [`spawn_blocking`], a thread
//! that waits on an epoll when the wait ends, every worker of a runtime [`answered_by`] in a
//! task of its own): once per ask, an atomic load otherwise.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How many times the process has asked.
static ASKED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The ask this thread last gave back for.
    static ANSWERED: Cell<u64> = const { Cell::new(0) };
}

/// How long a thread that waits for work may wait before it looks whether it was asked: the
/// longest a thread with nothing to do keeps what it could give back.
pub const LOOK_EVERY: Duration = Duration::from_secs(2);

/// The runtimes whose workers answer each ask.
static RUNTIMES: Mutex<Vec<tokio::runtime::Handle>> = Mutex::new(Vec::new());

/// How long, at most, a worker's answer waits for the other workers' to have started.
const TURN: Duration = Duration::from_millis(20);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Asks every thread to give back at its next idle point, gives back this thread's now, and
/// has every worker of the runtimes [`answered_by`] answer.
pub fn ask() {
    ASKED.fetch_add(1, Ordering::Relaxed);
    at_idle();
    let runtimes = lock(&RUNTIMES).clone();
    for runtime in &runtimes {
        answer_on_every_worker(runtime);
    }
}

/// Has every worker of `runtime` answer each ask. A parked worker has no idle point of its
/// own to answer at until work wakes it, and that may be never: a runtime wakes one parked
/// worker for new work, and the same one may take it every time.
pub fn answered_by(runtime: &tokio::runtime::Handle) {
    lock(&RUNTIMES).push(runtime.clone());
}

/// `tokio::task::spawn_blocking`, the thread answering once `work` is done and what it held
/// dropped: a blocking thread kept alive by such work has no other idle point.
pub fn spawn_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(move || {
        let done = work();
        at_idle();
        done
    })
}

/// One task per worker, each answering and then waiting (at most [`TURN`]) until all have
/// started: a worker runs one task at a time, so while one waits the others are taken by
/// other workers (a busy worker's queue is stolen from). Asks come seconds apart, once the
/// server is quiet, so the wait blocks a worker rarely and briefly.
fn answer_on_every_worker(runtime: &tokio::runtime::Handle) {
    let workers = runtime.metrics().num_workers();
    let started = Arc::new((Mutex::new(0usize), Condvar::new()));
    for _ in 0..workers {
        let started = started.clone();
        runtime.spawn(async move {
            at_idle();
            let (count, all) = &*started;
            let mut count = lock(count);
            *count += 1;
            all.notify_all();
            let _ = all.wait_timeout_while(count, TURN, |count| *count < workers);
        });
    }
}

/// Gives back what the allocator holds free for this thread if the process has asked since it
/// last did; otherwise nothing.
pub fn at_idle() {
    let asked = ASKED.load(Ordering::Relaxed);
    // A thread's own value, without a destructor: there is no state in which it is gone.
    let _ = ANSWERED.try_with(|answered| {
        if answered.get() != asked {
            answered.set(asked);
            crate::allocator::give_back();
            #[cfg(test)]
            tests::answered(asked);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::tests::{rss_kib, ONE_AT_A_TIME};
    use mimalloc::MiMalloc;
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::mpsc::channel;
    use std::thread::ThreadId;

    /// Which thread answered which ask.
    static ANSWERS: Mutex<Vec<(u64, ThreadId)>> = Mutex::new(Vec::new());

    pub(super) fn answered(asked: u64) {
        lock(&ANSWERS).push((asked, std::thread::current().id()));
    }

    #[test]
    fn every_worker_of_a_runtime_answers_an_ask_even_parked() {
        let _turn = ONE_AT_A_TIME.lock().unwrap();
        const WORKERS: usize = 4;
        let workers = Arc::new(Mutex::new(Vec::new()));
        let seen = workers.clone();
        // Lives as long as the process: it stays among those that answer.
        static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
        let runtime = RUNTIME.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(WORKERS)
                .on_thread_start(move || lock(&*seen).push(std::thread::current().id()))
                .build()
                .unwrap()
        });
        answered_by(runtime.handle());
        // Every worker started, and parked with nothing to do.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while lock(&workers).len() < WORKERS && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(200));
        let workers = lock(&workers).clone();
        assert_eq!(workers.len(), WORKERS);
        for _ in 0..5 {
            ask();
            let asked = ASKED.load(Ordering::Relaxed);
            let answered = || {
                let answers = lock(&ANSWERS);
                workers
                    .iter()
                    .filter(|w| answers.contains(&(asked, **w)))
                    .count()
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while answered() < WORKERS && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(answered(), WORKERS, "ask {asked}: every worker answered");
        }
    }

    /// The server's case: a thread allocates, another frees, the first waits for work. Only
    /// the first can give its pages back, and it does at its idle point once asked. mimalloc
    /// is called directly (the tests' own allocator is the system's).
    #[test]
    fn what_one_thread_made_and_another_freed_goes_back_when_the_first_is_idle_after_an_ask() {
        let _turn = ONE_AT_A_TIME.lock().unwrap();
        const BLOCKS: usize = (64 << 20) / 512;
        let layout = Layout::from_size_align(512, 8).unwrap();
        // This thread's own mimalloc heap, as the server's threads have.
        unsafe { MiMalloc.dealloc(MiMalloc.alloc(layout), layout) };
        let (idle, wait_idle) = channel::<()>();
        let (was_idle, has_been) = channel::<()>();
        let (sent, blocks) = channel::<Vec<usize>>();
        let before = rss_kib();
        let owner = std::thread::spawn(move || {
            let blocks: Vec<usize> = (0..BLOCKS)
                .map(|_| {
                    let p = unsafe { MiMalloc.alloc(layout) };
                    assert!(!p.is_null());
                    unsafe { std::ptr::write_bytes(p, 0x5A, layout.size()) };
                    p as usize
                })
                .collect();
            // One block in 16 freed here: pages in use, not full (as a thread's pages are
            // after serving a while), so they stay this thread's.
            let (mine, theirs): (Vec<_>, Vec<_>) = blocks
                .into_iter()
                .enumerate()
                .partition(|(i, _)| i % 16 == 0);
            for (_, p) in mine {
                unsafe { MiMalloc.dealloc(p as *mut u8, layout) };
            }
            // Whatever an earlier test asked is answered before the frees below.
            at_idle();
            sent.send(theirs.into_iter().map(|(_, p)| p).collect())
                .unwrap();
            // Waits for work, as a parked worker; then is idle once.
            while wait_idle.recv().is_ok() {
                at_idle();
                was_idle.send(()).unwrap();
            }
        });
        // Freed here, by another thread than the one that made them.
        for p in blocks.recv().unwrap() {
            unsafe { MiMalloc.dealloc(p as *mut u8, layout) };
        }
        let resident = || rss_kib().saturating_sub(before) / 1024;
        // Idle before an ask since: nothing to do.
        idle.send(()).unwrap();
        has_been.recv().unwrap();
        let held = resident();
        // This thread gives back its own, not the other's.
        ask();
        let asked = resident();
        idle.send(()).unwrap();
        has_been.recv().unwrap();
        let left = resident();
        drop(idle);
        owner.join().unwrap();
        assert!(held > 48, "64 MiB freed stay resident at first: {held} MiB");
        assert!(
            asked > 48,
            "and while the thread that made them has not been idle since the ask: {asked} MiB"
        );
        assert!(
            asked - left > 48,
            "and go once it has: {left} MiB left of {asked} MiB"
        );
    }
}

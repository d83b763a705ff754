//! Counters of the store's work since the process started: how often an object read was
//! hashed against its digest, and how often it was trusted (hashed before, unchanged). The
//! server's metrics read them; nothing here depends on who reads.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Stats {
    /// Store objects read and hashed against their digest.
    pub objects_hashed: AtomicU64,
    /// Store objects read without hashing: this process had hashed the same, unchanged file.
    pub objects_trusted: AtomicU64,
}

pub static STATS: Stats = Stats {
    objects_hashed: AtomicU64::new(0),
    objects_trusted: AtomicU64::new(0),
};

thread_local! {
    /// The same two counts, of the reads this thread made.
    static THIS_THREAD: Cell<ObjectReads> = const { Cell::new(ObjectReads { hashed: 0, trusted: 0 }) };
}

/// Object reads, by whether they were hashed or trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObjectReads {
    pub hashed: u64,
    pub trusted: u64,
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one object read, in the process's counters and the calling thread's.
    pub fn object_read(&self, trusted: bool) {
        let counter = if trusted {
            &self.objects_trusted
        } else {
            &self.objects_hashed
        };
        Stats::add(counter, 1);
        THIS_THREAD.with(|c| {
            let mut reads = c.get();
            match trusted {
                true => reads.trusted += 1,
                false => reads.hashed += 1,
            }
            c.set(reads);
        });
    }
}

/// The object reads the calling thread made so far: what one piece of work cost while other
/// threads of the process read beside it (the process's counters would count theirs too).
pub fn this_thread() -> ObjectReads {
    THIS_THREAD.with(Cell::get)
}

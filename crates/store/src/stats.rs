//! Counters of the store's work since the process started: how often an object read was
//! hashed against its digest, and how often it was trusted (hashed before, unchanged). The
//! server's metrics read them; nothing here depends on who reads.

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

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

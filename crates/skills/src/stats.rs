//! Counters of the skill model's work since the process started: how often a skill folder's
//! parse came from the skill cache. The server's metrics read them.

use std::sync::atomic::{AtomicU64, Ordering};

pub struct Stats {
    pub skill_cache_hits: AtomicU64,
    pub skill_cache_misses: AtomicU64,
}

pub static STATS: Stats = Stats {
    skill_cache_hits: AtomicU64::new(0),
    skill_cache_misses: AtomicU64::new(0),
};

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

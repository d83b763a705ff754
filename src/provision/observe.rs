//! What an acquisition in progress shows of itself (its phase and the bytes fetched so far)
//! and how it is asked to stop: an import job holds one while it runs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Observer {
    phase: Mutex<&'static str>,
    bytes: AtomicU64,
    cancelled: AtomicBool,
}

impl Observer {
    pub fn set_phase(&self, phase: &'static str) {
        *self.phase.lock().expect("phase lock") = phase;
    }

    pub fn phase(&self) -> &'static str {
        *self.phase.lock().expect("phase lock")
    }

    pub fn set_bytes(&self, n: u64) {
        self.bytes.store(n, Ordering::Relaxed);
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Asks the acquisition to stop: a fetch in-process stops within its watch interval, one
    /// in a helper container when it ends; nothing is published either way.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

//! A workspace's use: when it was last used and whether it is paused (`pause` pauses and
//! resumes; this is what the workspace itself keeps of it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A workspace's use: when it was last used, whether it is paused.
#[derive(Debug)]
pub struct Idle {
    /// Milliseconds since the Unix epoch.
    pub(super) last_used: AtomicU64,
    pub(super) paused: AtomicBool,
    /// Held while pausing or resuming: one at a time.
    pub(super) turning: Mutex<()>,
}

impl Default for Idle {
    fn default() -> Idle {
        Idle {
            last_used: AtomicU64::new(now_ms()),
            paused: AtomicBool::new(false),
            turning: Mutex::new(()),
        }
    }
}

fn now_ms() -> u64 {
    cloud_harness_control::state::now_ms().max(0) as u64
}

impl Idle {
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    pub(super) fn touch(&self) {
        self.last_used.store(now_ms(), Ordering::SeqCst);
    }

    pub(super) fn unused_for(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.last_used.load(Ordering::SeqCst)))
    }
}

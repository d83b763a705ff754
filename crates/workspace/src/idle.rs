//! A workspace's use: when it was last used, whether it is paused, whether it was closed
//! (`pause` pauses and resumes; this is what the workspace itself keeps of it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A workspace's use: when it was last used, whether it is paused.
#[derive(Debug)]
pub struct Idle {
    /// Milliseconds since this process began, on the monotonic clock (a change of the wall
    /// clock neither pauses a workspace in use nor keeps one from pausing).
    last_used: AtomicU64,
    pub(super) paused: AtomicBool,
    /// Set by a close, under `turning`: a resume after it serves nothing again.
    pub(super) closed: AtomicBool,
    /// Held while pausing, resuming or closing: one at a time.
    pub(super) turning: Mutex<()>,
}

fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl Default for Idle {
    fn default() -> Idle {
        Idle {
            last_used: AtomicU64::new(now_ms()),
            paused: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            turning: Mutex::new(()),
        }
    }
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

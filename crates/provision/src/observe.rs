//! What an acquisition in progress shows of itself (its phase and the bytes fetched so far),
//! how it is asked to stop (an import job holds one while it runs), and who pays for a fetch
//! (the principal whose hourly budget of network acquisitions it takes).

use cloud_harness_error::Result;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Observer {
    phase: Mutex<&'static str>,
    bytes: AtomicU64,
    cancelled: AtomicBool,
    /// The principal a fetch counts against (none: the server's own work).
    payer: Option<String>,
}

impl Observer {
    /// An observer whose fetches count against `who`'s acquisitions per hour.
    pub fn paid_by(who: &str) -> Observer {
        Observer {
            payer: Some(who.to_owned()),
            ..Observer::default()
        }
    }

    /// Called before going to the network: takes one acquisition of the payer's budget, or
    /// refuses (RESOURCE_EXHAUSTED) when it is used up. Warm starts never get here.
    pub(crate) fn admit_fetch(&self) -> Result<()> {
        match &self.payer {
            Some(who) => cloud_harness_control::limits::quotas().acquisition(who),
            None => Ok(()),
        }
    }

    pub(crate) fn set_phase(&self, phase: &'static str) {
        *self.phase.lock().expect("phase lock") = phase;
    }

    pub fn phase(&self) -> &'static str {
        *self.phase.lock().expect("phase lock")
    }

    pub(crate) fn set_bytes(&self, n: u64) {
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

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

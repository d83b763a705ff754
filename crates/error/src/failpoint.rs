//! Named points where a test can have the process killed, to prove that a crash at that moment
//! of real work loses nothing (the crash suite, `tests/faults/`). Compiled in only with the
//! `failpoints` feature, which only the tests turn on: in a release build [`point`] is empty.
//!
//! `CLOUD_HARNESS_KILL_AT=NAME` kills the process with SIGKILL (no destructor, no flush, as
//! the kernel's OOM killer or a power cut would) the first time it reaches point `NAME`;
//! `NAME@N` the N-th time.

/// Point `name` of the work: a kill here must leave nothing half-made that a restart does not
/// clear.
#[inline]
pub fn point(name: &'static str) {
    #[cfg(feature = "failpoints")]
    armed::reach(name);
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// The point and the count from the environment, read once.
    fn target() -> &'static Option<(String, u64)> {
        static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
        TARGET.get_or_init(|| {
            let spec = std::env::var("CLOUD_HARNESS_KILL_AT").ok()?;
            match spec.split_once('@') {
                Some((name, n)) => Some((name.to_owned(), n.parse().ok().filter(|n| *n > 0)?)),
                None => Some((spec, 1)),
            }
        })
    }

    pub(super) fn reach(name: &str) {
        static REACHED: AtomicU64 = AtomicU64::new(0);
        let Some((wanted, nth)) = target() else {
            return;
        };
        if wanted == name && REACHED.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
            eprintln!("cloud-harness: killed at {name}@{nth} (CLOUD_HARNESS_KILL_AT)");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    }
}

//! What tests of a live server wait for and need: a condition met within a time, and the
//! machine's leave to mount.

use std::time::{Duration, Instant};

/// Polls `done` until it holds; fails the test naming `what` after `within`.
pub fn until(what: &str, within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether this process may mount FUSE file systems (root and `/dev/fuse`). Under CI it must.
pub fn mounting_available() -> bool {
    let ok = nix::unistd::geteuid().is_root() && std::path::Path::new("/dev/fuse").exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "the mount tests need root and /dev/fuse"
        );
        eprintln!("skipped: needs root and /dev/fuse");
    }
    ok
}

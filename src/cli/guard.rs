//! `cloud-harness mount-guard`: what `mount` and `serve` start beside themselves, to detach
//! their mounts if they die without unmounting (`cloud_harness_mount::guard`).

use cloud_harness_error::{Error, Result};
use cloud_harness_mount::guard;

pub fn run() -> Result<u8> {
    // The daemon's SIGINT (a terminal's ^C reaches the whole group) or a service manager's
    // SIGTERM to the unit's processes must not end the guard before the daemon: the guard
    // ends on its own once the daemon has.
    for signal in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
    ] {
        unsafe {
            // SAFETY: setting a signal's disposition to "ignore" before any thread exists.
            let _ = nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigIgn);
        }
    }
    match guard::watch(std::io::stdin().lock()) {
        Ok(0) => Ok(0),
        Ok(n) => {
            eprintln!("cloud-harness: the daemon ended without unmounting; detached {n} mount(s)");
            Ok(0)
        }
        Err(e) => Err(Error::internal(format!("the unmount guard: {e}"))),
    }
}

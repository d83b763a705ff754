//! `cloud-harness mount-guard`: what `mount` and `serve` start beside themselves, to detach
//! their mounts if they die without unmounting (`cloud_harness_mount::guard`); and, with
//! `--sweep`, what the service runs after it stopped, in case its guard was killed with it.

use cloud_harness_error::{Error, Result};
use cloud_harness_mount::guard;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct GuardArgs {
    /// Detach every FUSE mount of this program's left at or under this folder, and exit.
    #[arg(long, value_name = "DIR")]
    sweep: Option<PathBuf>,
}

pub fn run(args: &GuardArgs) -> Result<u8> {
    if let Some(root) = &args.sweep {
        return match guard::sweep(root) {
            Ok(0) => Ok(0),
            Ok(n) => {
                eprintln!(
                    "cloud-harness: detached {n} mount(s) left under {}",
                    root.display()
                );
                Ok(0)
            }
            // A home not made yet holds no mount.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(Error::internal(format!("sweeping {}: {e}", root.display()))),
        };
    }
    // The daemon's SIGINT (a terminal's ^C reaches the whole group), a service manager's
    // SIGTERM to the unit's processes, or a closed terminal's SIGHUP must not end the guard
    // before the daemon: the guard ends on its own once the daemon has.
    for signal in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGHUP,
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

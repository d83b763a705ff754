//! `cloud-harness mount-guard MOUNTPOINT ID`: what `mount` starts beside itself, to detach its
//! mount if it dies without unmounting (`fs::guard`).

use clap::Args;
use cloud_harness_error::{Error, Result};
use cloud_harness_mount::guard;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct GuardArgs {
    /// The mount point, canonical.
    pub mountpoint: PathBuf,
    /// The mount's ID in the mount table.
    pub id: u64,
}

pub fn run(args: &GuardArgs) -> Result<u8> {
    // The daemon's SIGINT (a terminal's ^C reaches the whole group) must not end the guard:
    // the daemon unmounts, and the guard then ends on its own.
    unsafe {
        // SAFETY: setting a signal's disposition to "ignore" before any thread exists.
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::SigHandler::SigIgn,
        );
    }
    match guard::watch(&args.mountpoint, args.id) {
        Ok(true) => {
            eprintln!(
                "cloud-harness: the daemon of {} ended without unmounting; detached it",
                args.mountpoint.display()
            );
            Ok(0)
        }
        Ok(false) => Ok(0),
        Err(e) => Err(Error::internal(format!(
            "detaching {}: {e}",
            args.mountpoint.display()
        ))),
    }
}

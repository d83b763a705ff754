//! `cloud-harness mount-guard`: what `mount` and `serve` start beside themselves, to detach
//! their mounts if they die without unmounting (`cloud_harness_mount::guard`); and, with
//! `--sweep`, what the service runs after it stopped, in case its guard was killed with it.

use super::control::HomeArg;
use cloud_harness_error::{Error, Result};
use cloud_harness_mount::guard;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct GuardArgs {
    /// Detach every FUSE mount of this program's left in the workspaces of the home (which
    /// must not be served: the service's `ExecStopPost=`), and exit.
    #[arg(long)]
    sweep: bool,
    #[command(flatten)]
    home: HomeArg,
}

/// The command's first word, which `main` runs before anything else (the guard itself reads no
/// configuration: a bad one must not stop it).
pub const COMMAND: &str = "mount-guard";

pub fn run(args: &GuardArgs) -> Result<u8> {
    if !args.sweep {
        return Ok(guard());
    }
    let home = args.home.dir();
    let root = cloud_harness_workspace::workspaces_dir(&home);
    if !root.exists() {
        return Ok(0); // a home not made yet holds no mount
    }
    // Only a home no server serves: a live server's mounts are not left behind. Held while
    // sweeping, so none starts meanwhile.
    use cloud_harness_workspace::serving::{for_sweep, Sweep};
    let _serving = match for_sweep(&home) {
        Sweep::Free(held) => held,
        Sweep::Served => {
            eprintln!(
                "cloud-harness: {} is served by a running server: nothing swept",
                home.display()
            );
            return Ok(0);
        }
    };
    match guard::sweep(&root) {
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
    }
}

/// The guard: says it is ready, reads its daemon's records until the daemon is gone, then
/// detaches what is still mounted. Its exit code.
pub fn guard() -> u8 {
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
    let mut out = std::io::stdout();
    if out
        .write_all(&[guard::READY])
        .and_then(|()| out.flush())
        .is_err()
    {
        return 2;
    }
    match guard::watch(std::io::stdin().lock()) {
        Ok(guard::Ended {
            detached: 0,
            named,
            gone,
        }) if named > 0 && gone == named => {
            // fusermount's auto-unmount was first: said, so the end is never silent.
            eprintln!("cloud-harness: the daemon ended without unmounting; its {named} mount(s) were no longer mounted (detached already)");
            0
        }
        // Nothing named, or what could not be detached said already, one line each.
        Ok(guard::Ended { detached: 0, .. }) => 0,
        Ok(guard::Ended { detached, .. }) => {
            eprintln!(
                "cloud-harness: the daemon ended without unmounting; detached {detached} mount(s)"
            );
            0
        }
        Err(e) => {
            eprintln!("cloud-harness: the unmount guard: {e}");
            1
        }
    }
}

//! `cloud-harness prewarm MOUNTPOINT`: the walker a mounting process starts right after
//! mounting (`fs::prewarm`); prints what it did as one JSON line.

use clap::Args;
use cloud_harness_error::{Error, Result};
use cloud_harness_mount::prewarm::{self, Budget};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

#[derive(Debug, Args)]
pub struct PrewarmArgs {
    /// The mount to walk.
    pub mountpoint: PathBuf,
    /// List folders and look files up, without reading any (a mount whose loads are
    /// counted: a page read ahead would hide the agent's read).
    #[arg(long)]
    pub no_content: bool,
}

pub fn run(args: &PrewarmArgs) -> Result<u8> {
    // Dies with the thread that started it; if that is gone already, so is the reason to walk.
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| Error::internal(format!("PR_SET_PDEATHSIG: {e}")))?;
    if nix::unistd::getppid() != parent {
        return Ok(1);
    }
    prewarm::lower_priority();
    let budget = match args.no_content {
        true => Budget::metadata(),
        false => Budget::default(),
    };
    let summary = prewarm::walk(&args.mountpoint, budget, &AtomicBool::new(false));
    let line = serde_json::to_string(&summary).map_err(|e| Error::internal(e.to_string()))?;
    println!("{line}");
    Ok(0)
}

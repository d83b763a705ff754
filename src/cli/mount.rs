//! `cloud-harness mount`: the skills filesystem daemon.

use crate::cli::tiers::TierArgs;
use clap::Args;
use cloud_harness_error::{Error, Result};
use cloud_harness_mount::fuse::{self, MountConfig};
use cloud_harness_mount::guard::Guards;
use cloud_harness_mount::live::LiveTiers;
use cloud_harness_mount::prewarm::{Prewarm, Summary};
use cloud_harness_mount::stats::{Op, STATS};
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::generation::View;
use cloud_harness_skills::namespace::Namespace;
use cloud_harness_skills::resolver::Tier;
use cloud_harness_store::cas::Store;
use nix::sys::signal::{SigSet, Signal};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Args)]
pub struct MountArgs {
    /// An existing, empty directory to mount on.
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub tiers: TierArgs,
    /// Serve one tier's view alone at the root (e.g. `--only owner` for an owner-skills mount).
    #[arg(long, value_name = "TIER")]
    pub only: Option<Tier>,
    /// Let every user read the mount (otherwise root and the mounting user).
    #[arg(long)]
    pub allow_other: bool,
    /// The most of the process's FUSE threads that answer the mount at once (default: one
    /// per CPU, at most 8; the pool has two per CPU, at least 8).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Do not walk the mount in the background right after mounting (by default every folder
    /// is listed and every small file read once, so a reader's first access finds the
    /// kernel's caches full).
    #[arg(long)]
    pub no_prewarm: bool,
}

/// The prewarm's line, on stderr beside the serving line (benchmarks wait for it), and in
/// the log.
fn report(mountpoint: &str, s: &Summary) {
    s.log(mountpoint);
    eprintln!(
        "cloud-harness: prewarmed {} entries and {} files ({} KiB) in {} ms{}",
        s.entries,
        s.files,
        s.bytes >> 10,
        s.took_ms,
        match (s.cut_short, s.errors) {
            (true, _) => " (cut short)",
            (false, 0) => "",
            (false, _) => " (some steps failed)",
        }
    );
}

/// Mounts, serves until SIGTERM or SIGINT (or an external unmount), then unmounts.
pub fn run(store: &Store, args: &MountArgs) -> Result<u8> {
    // Blocked here, before any thread exists, so only the waiter below receives them.
    let signals = SigSet::from_iter([Signal::SIGINT, Signal::SIGTERM]);
    signals
        .thread_block()
        .map_err(|e| Error::internal(format!("blocking signals: {e}")))?;

    let cache = Arc::new(SkillCache::default());
    let pool =
        cloud_harness_mount::watch::Pool::new(cloud_harness_mount::watch::Pool::system_default());
    let watch = LiveTiers::watch(args.tiers.stack(store, &cache)?, &pool, Default::default())
        .map_err(|e| Error::internal(format!("watching the tiers' folders: {e}")))?;
    for w in watch.warnings() {
        eprintln!("cloud-harness: {w}");
    }
    let generation = watch.spec().generation(store, &cache)?;
    let digest = generation.digest();
    let view = args.only.map_or(View::Merged, View::Tier);
    let ns = Arc::new(Namespace::new(store.clone(), view, Arc::new(generation)));
    let config = MountConfig {
        allow_other: args.allow_other,
        threads: args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get().min(8))),
        // One mount: its fusermount helper stays beside the guard, in case the guard fails.
        auto_unmount: true,
        // A mount of its own, outside any workspace: no usage to count.
        loads: None,
    };
    let mounted = fuse::mount(ns.clone(), &args.mountpoint, &config)
        .map_err(|e| Error::internal(format!("mounting at {}: {e}", args.mountpoint.display())))?;
    let notifier = mounted.notifier();
    let apply = Box::new(move |items: &[_]| fuse::invalidate(&notifier, items));
    let _live = watch.start(store.clone(), cache, vec![(ns, apply)]);
    let program = std::env::current_exe()
        .map_err(|e| Error::internal(format!("finding this program: {e}")))?;
    let guards = Guards::new(program.clone());
    guards
        .watch(&args.mountpoint)
        .map_err(|e| Error::internal(format!("starting the unmount guard: {e}")))?;
    let prewarm = match args.no_prewarm {
        true => None,
        false => {
            let shown = args.mountpoint.display().to_string();
            let started =
                Prewarm::start(&program, &args.mountpoint, true, move |s| report(&shown, s))
                    .map_err(|e| Error::internal(format!("spawning the prewarm thread: {e}")))?;
            Some(started)
        }
    };
    let mountpoint = args.mountpoint.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(sig) = signals.wait() {
                tracing::info!(signal = ?sig, "unmounting");
                // Its open folders would keep the mount busy.
                drop(prewarm);
                if let Err(e) = fuse::unmount(&mountpoint) {
                    tracing::error!(error = %e, mountpoint = %mountpoint.display(), "unmount failed");
                }
            }
        })
        .map_err(|e| Error::internal(format!("spawning the signal thread: {e}")))?;
    eprintln!(
        "cloud-harness: serving skills at {} (generation {digest})",
        args.mountpoint.display()
    );
    // Served by the pool's threads until unmounted (by the signal thread, or from outside).
    mounted.wait_end(None);
    // What the kernel asked for, in all: how well its caches served the mount's readers.
    let requests: Vec<String> = Op::ALL
        .iter()
        .map(|op| format!("{}={}", op.as_str(), STATS.ops(*op)))
        .collect();
    tracing::info!(requests = %requests.join(" "), "unmounted");
    Ok(0)
}

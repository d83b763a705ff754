//! The scale bench's figures: each step's line, the table, the JSON line, the plots, and
//! whether the server was back at its start after every workspace closed.

use crate::plot;
use crate::resources::{self, Usage};
use serde_json::{json, Value};
use std::path::Path;

pub struct Step {
    pub n: usize,
    pub usage: Usage,
    /// All mounts under the home, and of those the FUSE ones.
    pub mounts: (u64, u64),
    pub open_p50_ms: f64,
    pub open_p99_ms: f64,
    /// A workspace's first run: its sandbox starts, then the script runs.
    pub first_run_p50_ms: f64,
    pub first_run_p99_ms: f64,
    pub read_ms: f64,
    pub walk_ms: f64,
    /// The same walk of a copy of the mount's tree on tmpfs, interleaved with it.
    pub walk_tmpfs_ms: f64,
    /// Opens whose warnings said live updates are off (no inotify instance left).
    pub unwatched: usize,
}

impl Step {
    /// The walk of the mount against the walk of its tmpfs copy.
    pub fn walk_ratio(&self) -> f64 {
        self.walk_ms / self.walk_tmpfs_ms
    }
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// What one workspace adds above the empty server, at `step`.
pub fn per_workspace(step: &Step, empty: &Usage, f: fn(&Usage) -> u64) -> f64 {
    (f(&step.usage) as f64 - f(empty) as f64) / step.n as f64
}

pub fn print_step(s: &Step, empty: &Usage) {
    let u = &s.usage;
    println!(
        "scale: N={}: server RSS {:.1} MiB, owned PSS {:.1} MiB ({} processes), threads {} (+{} owned), fds {} (+{} store objects), inotify {} instances / {} watches, mounts {} ({} FUSE); per workspace {:.2} MiB (server RSS and owned PSS) and {:.1} threads; open p50 {:.1} ms p99 {:.1} ms; first run p50 {:.1} ms p99 {:.1} ms; read {:.2} ms; walk {:.2} ms ({:.2} ms on tmpfs, {:.2}x); {} opens without live updates",
        s.n, mib(u.rss_kib), mib(u.owned_pss_kib), u.owned_processes, u.threads, u.owned_threads,
        u.fds, u.object_fds, u.inotify_instances, u.inotify_watches, s.mounts.0, s.mounts.1,
        per_workspace(s, empty, Usage::memory_kib) / 1024.0,
        per_workspace(s, empty, Usage::total_threads),
        s.open_p50_ms, s.open_p99_ms, s.first_run_p50_ms, s.first_run_p99_ms, s.read_ms,
        s.walk_ms, s.walk_tmpfs_ms, s.walk_ratio(), s.unwatched
    );
}

/// The server at its start and after every workspace closed, with the names of its threads.
pub struct Ends {
    pub empty: Usage,
    pub empty_threads: resources::Counted,
    pub closed: Usage,
    pub closed_threads: resources::Counted,
    /// The empty server's mounts under the home (the workspaces folder's own), and those
    /// after every workspace closed.
    pub empty_mounts: (u64, u64),
    pub mounts: (u64, u64),
}

/// The server's stop (SIGTERM) with `live` workspaces open, each with its sandbox.
pub struct Stopped {
    pub live: usize,
    /// The processes the server owned then (each sandbox's two and the unmount guard), and
    /// those still there 10 s after its exit.
    pub owned: usize,
    pub owned_left: usize,
    /// From SIGTERM to its exit.
    pub secs: f64,
    pub clean_exit: bool,
    /// Mounts under the home once it has exited.
    pub mounts_left: u64,
}

pub fn report(steps: &[Step], ends: Ends, stop: Stopped) {
    let Ends {
        empty,
        empty_threads,
        closed,
        closed_threads,
        empty_mounts,
        mounts,
    } = ends;
    let (empty, closed) = (&empty, &closed);
    println!("| N | server RSS MiB | owned PSS MiB (processes) | threads (+ owned) | fds | inotify instances / watches | mounts (FUSE) | memory / workspace MiB | threads / workspace | open p50 / p99 ms | first run p50 / p99 ms | skills_read ms | walk ms (tmpfs, ratio) | opens without live updates |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let row = |n: String, u: &Usage, m: (u64, u64)| {
        format!(
            "| {n} | {:.1} | {:.1} ({}) | {} (+{}) | {} | {} / {} | {} ({})",
            mib(u.rss_kib),
            mib(u.owned_pss_kib),
            u.owned_processes,
            u.threads,
            u.owned_threads,
            u.fds,
            u.inotify_instances,
            u.inotify_watches,
            m.0,
            m.1
        )
    };
    println!(
        "{} | | | | | | | |",
        row("0 (empty)".into(), empty, empty_mounts)
    );
    for s in steps {
        println!(
            "{} | {:.2} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} | {:.2} ({:.2}, {:.2}x) | {} |",
            row(s.n.to_string(), &s.usage, s.mounts),
            per_workspace(s, empty, Usage::memory_kib) / 1024.0,
            per_workspace(s, empty, Usage::total_threads),
            s.open_p50_ms,
            s.open_p99_ms,
            s.first_run_p50_ms,
            s.first_run_p99_ms,
            s.read_ms,
            s.walk_ms,
            s.walk_tmpfs_ms,
            s.walk_ratio(),
            s.unwatched
        );
    }
    println!(
        "{} | | | | | | | |",
        row("0 (all closed)".into(), closed, mounts)
    );
    let rows: Vec<Value> = steps
        .iter()
        .map(|s| {
            json!({"n": s.n, "rssKib": s.usage.rss_kib, "ownedRssKib": s.usage.owned_rss_kib, "ownedPssKib": s.usage.owned_pss_kib,
                "ownedProcesses": s.usage.owned_processes, "threads": s.usage.threads,
                "ownedThreads": s.usage.owned_threads, "fds": s.usage.fds,
                "inotifyInstances": s.usage.inotify_instances, "inotifyWatches": s.usage.inotify_watches,
                "mounts": s.mounts.0, "fuseMounts": s.mounts.1,
                "openP50Ms": s.open_p50_ms, "openP99Ms": s.open_p99_ms,
                "firstRunP50Ms": s.first_run_p50_ms, "firstRunP99Ms": s.first_run_p99_ms, "readMs": s.read_ms,
                "walkMs": s.walk_ms, "walkTmpfsMs": s.walk_tmpfs_ms, "unwatchedOpens": s.unwatched})
        })
        .collect();
    println!(
        "{}",
        json!({"empty": {"rssKib": empty.rss_kib, "threads": empty.threads, "fds": empty.fds, "ownedProcesses": empty.owned_processes},
            "closed": {"rssKib": closed.rss_kib, "threads": closed.threads, "fds": closed.fds, "ownedProcesses": closed.owned_processes, "mounts": mounts.0},
            "stop": {"live": stop.live, "ownedProcesses": stop.owned, "ownedLeft": stop.owned_left, "secs": stop.secs, "cleanExit": stop.clean_exit, "mountsLeft": stop.mounts_left},
            "steps": rows})
    );
    if let Ok(dir) = std::env::var("SCALE_PLOTS") {
        plots(Path::new(&dir), steps);
    }
    // Back at the start: no mount but the empty server's (as root with bubblewrap, the
    // workspaces folder is a mount of its own while the server runs), no process but the unmount guard (started at the first
    // mount, it stays), no thread but the runtime's idle pool (its threads end on their own),
    // the executors' link thread and the threads of the process's FUSE pool and live-tier
    // waiter (started with the first mount and live tier, they serve every later one),
    // a few descriptors at most (the guard's pipe). Memory is shown, not judged: the
    // allocator keeps some pages of the threads that ended, for the next ones.
    let lasting = |threads: &resources::Counted| -> usize {
        threads
            .iter()
            .filter(|(name, _)| {
                name != "tokio-rt-worker" && !name.starts_with("fuse-") && name != "live-tiers"
            })
            .map(|(_, n)| n)
            .sum()
    };
    // (The executors' link thread, one per server, starts with the first executor.)
    let back = lasting(&closed_threads) <= lasting(&empty_threads) + 1
        && closed.owned_processes <= empty.owned_processes + 1
        && closed.fds <= empty.fds + 8
        && mounts == empty_mounts;
    println!(
        "scale: after closing every workspace: threads {} (empty {}), owned processes {} (empty {}), fds {} (empty {}), RSS {:.1} MiB (empty {:.1}), mounts {}: {}",
        closed.threads, empty.threads, closed.owned_processes, empty.owned_processes,
        closed.fds, empty.fds, mib(closed.rss_kib), mib(empty.rss_kib), mounts.0,
        if back { "back at the start" } else { "NOT back at the start" }
    );
    println!(
        "scale: a stop with {} workspaces open ({} processes owned): {:.1} s, {}, {} mounts and {} of those processes left",
        stop.live,
        stop.owned,
        stop.secs,
        if stop.clean_exit { "a clean exit" } else { "NOT a clean exit (or not in time)" },
        stop.mounts_left,
        stop.owned_left
    );
    // Each sandbox is bubblewrap and the run agent.
    let stopped = stop.owned > 2 * stop.live
        && stop.clean_exit
        && stop.mounts_left == 0
        && stop.owned_left == 0;
    if !back || !stopped {
        eprintln!("scale: failed (back at the start {back}, stopped cleanly {stopped})");
        std::process::exit(1);
    }
}

fn plots(dir: &Path, steps: &[Step]) {
    use plot::Series;
    std::fs::create_dir_all(dir).unwrap();
    let series = |name: &'static str, f: &dyn Fn(&Step) -> f64| Series {
        name,
        points: steps.iter().map(|s| (s.n as f64, f(s))).collect(),
    };
    let figures = [
        (
            "scale-memory.svg",
            "Memory against open workspaces",
            "MiB",
            vec![
                series("server RSS", &|s| mib(s.usage.rss_kib)),
                series("owned PSS", &|s| mib(s.usage.owned_pss_kib)),
            ],
        ),
        (
            "scale-threads.svg",
            "Threads and processes",
            "count",
            vec![
                series("server threads", &|s| s.usage.threads as f64),
                series("owned threads", &|s| s.usage.owned_threads as f64),
                series("owned processes", &|s| s.usage.owned_processes as f64),
            ],
        ),
        (
            "scale-kernel.svg",
            "Descriptors, mounts, inotify watches",
            "count",
            vec![
                series("fds", &|s| s.usage.fds as f64),
                series("mounts", &|s| s.mounts.0 as f64),
                series("inotify watches", &|s| s.usage.inotify_watches as f64),
            ],
        ),
        (
            "scale-latency.svg",
            "Latency against open workspaces",
            "ms",
            vec![
                series("open p50", &|s| s.open_p50_ms),
                series("open p99", &|s| s.open_p99_ms),
                series("first run p50", &|s| s.first_run_p50_ms),
                series("skills_read", &|s| s.read_ms),
                series("walk of a mount", &|s| s.walk_ms),
                series("walk of its tmpfs copy", &|s| s.walk_tmpfs_ms),
            ],
        ),
    ];
    for (file, title, unit, lines) in figures {
        let text = plot::svg(title, "open workspaces (log scale)", unit, &lines);
        std::fs::write(dir.join(file), text).unwrap();
    }
    println!("scale: plots written to {}", dir.display());
}

//! The scale bench: one `serve --http` holding N workspaces (N = 10, 100, 1,000 by default,
//! `SCALE_STEPS=10,100`), each with its two FUSE mounts, a bubblewrap executor (one run of a
//! script made its sandbox) and a live repository tier (one skill written into it), all on
//! the same warm toolkit plus one of four distinct ones. At each step: the server's RSS, the
//! summed RSS of every process it owns, threads, open descriptors, mounts, inotify instances
//! and watches, and what each workspace adds above the empty server; `workspace_open` p50/p99
//! and the first run's (its sandbox's start and the script) over the step's last opens, a
//! `skills_read` and a walk of one mount (medians). Then every
//! workspace is closed and the server's figures compared with its empty start.
//!
//! `cargo bench --bench scale` (as root, with /dev/fuse and bubblewrap). Writes a table and
//! a JSON line to stdout and, with `SCALE_PLOTS=DIR`, SVG plots of each figure against N
//! (docs/benchmarks holds those of the last run in the docs).

#[path = "support/plot.rs"]
mod plot;
#[path = "support/resources.rs"]
mod resources;
#[path = "support/server.rs"]
mod server;
#[path = "../tests/support/mod.rs"]
mod support;

use resources::Usage;
use serde_json::{json, Value};
use server::{Mcp, Server};
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

/// Toolkits besides the one every workspace has: workspace `i` has distinct toolkit `i % 4`.
const DISTINCT: usize = 4;
/// `workspace_open` latency is taken over each step's last this many opens.
const LAST_OPENS: usize = 20;
const READS: usize = 21;
const WALKS: usize = 5;

struct Step {
    n: usize,
    usage: Usage,
    /// All mounts under the home, and of those the FUSE ones.
    mounts: (u64, u64),
    open_p50_ms: f64,
    open_p99_ms: f64,
    /// A workspace's first run: its sandbox starts, then the script runs.
    first_run_p50_ms: f64,
    first_run_p99_ms: f64,
    read_ms: f64,
    walk_ms: f64,
    /// Opens whose warnings said live updates are off (no inotify instance left).
    unwatched: usize,
}

fn missing() -> Option<&'static str> {
    if !nix::unistd::geteuid().is_root() {
        return Some("root (FUSE mounts with allow_other, bubblewrap sandboxes)");
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse");
    }
    if !support::executor_backend("bwrap") {
        return Some("bubblewrap");
    }
    None
}

/// A toolkit of `skills` skills named `{name}-NN` (the first with a script), warm in the store.
fn toolkit(
    store: &cloud_harness_store::cas::Store,
    src: &Path,
    name: &str,
    skills: usize,
) -> Value {
    use std::os::unix::fs::PermissionsExt;
    let root = src.join(name);
    for i in 0..skills {
        let skill = format!("{name}-{i:02}");
        let dir = root.join(&skill);
        std::fs::create_dir_all(dir.join("references")).unwrap();
        let text =
            format!("---\nname: {skill}\ndescription: Skill {i} of {name}.\n---\nBody {i}.\n");
        std::fs::write(dir.join("SKILL.md"), text).unwrap();
        std::fs::write(dir.join("references/notes.md"), "notes\n".repeat(300)).unwrap();
    }
    let script = root.join(format!("{name}-00/scripts/hello.sh"));
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::write(&script, "#!/bin/sh\necho scaled\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    serde_json::to_value(support::warm_toolkit(store, &root, name)).unwrap()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn quantile(xs: &[Duration], p: f64) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort();
    xs.get(((xs.len().max(1) - 1) as f64 * p).round() as usize)
        .map_or(0.0, |d| ms(*d))
}

/// Reads every file under `dir`, not following links: how many.
fn walk(dir: &Path) -> usize {
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let t = entry.file_type().unwrap();
        if t.is_dir() {
            files += walk(&entry.path());
        } else if t.is_file() {
            let mut bytes = Vec::new();
            std::fs::File::open(entry.path())
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .unwrap();
            files += 1;
        }
    }
    files
}

fn main() {
    if let Some(what) = missing() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the scale bench needs {what} (run .ci/setup as root)"
        );
        println!("scale bench skipped: it needs {what}");
        return;
    }
    let steps: Vec<usize> = std::env::var("SCALE_STEPS")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("SCALE_STEPS: counts, comma-separated")
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src");
    let common = toolkit(&store, &src, "common", 40);
    let distinct: Vec<Value> = (0..DISTINCT)
        .map(|i| toolkit(&store, &src, &format!("distinct{i}"), 5))
        .collect();
    let home = tmp.path().join("home");
    // Workspaces pause after this long unused (SCALE_PAUSE): 60 s is longer than the steps
    // of 10 and 100 take, so their figures are of workspaces all unpaused. 1,000 unpaused
    // would need ~23 GiB: run that step with SCALE_PAUSE=30, and only the opens of the last
    // 30 s or so stay unpaused, as on a runner whose agents come and go.
    let pause: u64 = std::env::var("SCALE_PAUSE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let pause_env = pause.to_string();
    let server = Server::start(
        store.root(),
        &home,
        &[("CLOUD_HARNESS_IDLE_PAUSE", pause_env.as_str())],
    );
    let pid = server.pid();
    let mcp = Mcp::new(&server.url, 8);
    let session = mcp.session().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let empty = resources::usage(pid);
    let empty_threads = resources::names(pid).0;
    let empty_mounts = resources::mounts_under(&home);
    println!("scale: the empty server: {empty:?}, mounts {empty_mounts:?}");

    let mut workspaces: Vec<String> = Vec::new();
    let mut opens: Vec<Duration> = Vec::new();
    let mut first_runs: Vec<Duration> = Vec::new();
    let mut unwatched = 0;
    let mut results = Vec::new();
    let run =
        |ws: &str| json!({"workspace": ws, "skill": "common-00", "script": "scripts/hello.sh"});
    let started = Instant::now();
    for &n in &steps {
        while workspaces.len() < n {
            let i = workspaces.len();
            let args = json!({"idempotencyKey": format!("scale-{i}"), "toolkits": [common, distinct[i % DISTINCT]]});
            let t = Instant::now();
            let opened = mcp
                .tool(&session, "workspace_open", args)
                .unwrap_or_else(|e| panic!("open {i}: {e}"));
            opens.push(t.elapsed());
            let result = &opened["structuredContent"];
            if result["warnings"]
                .to_string()
                .contains("live updates are off")
            {
                unwatched += 1;
            }
            let ws = result["workspace"].as_str().unwrap().to_owned();
            let live = home
                .join("workspaces")
                .join(&ws)
                .join("repo/.agents/skills/live-one");
            std::fs::create_dir_all(&live).unwrap();
            std::fs::write(
                live.join("SKILL.md"),
                "---\nname: live-one\ndescription: A skill of the repository tier.\n---\nLive.\n",
            )
            .unwrap();
            let t = Instant::now();
            let ran = mcp
                .run_approved(&server.api(), &session, &run(&ws))
                .unwrap_or_else(|e| panic!("run in workspace {i}: {e}"));
            first_runs.push(t.elapsed());
            assert!(ran.to_string().contains("scaled"), "run {i}: {ran}");
            workspaces.push(ws);
            if (i + 1).is_multiple_of(100) {
                println!(
                    "scale: {} open ({:.0} s)",
                    i + 1,
                    started.elapsed().as_secs_f64()
                );
            }
        }
        // The prewarm walks and the live tiers' first generations settle.
        std::thread::sleep(Duration::from_secs(3));
        let last = &opens[opens.len() - LAST_OPENS.min(n)..];
        let last_runs = &first_runs[first_runs.len() - LAST_OPENS.min(n)..];
        let middle = &workspaces[n / 2];
        let reads: Vec<Duration> = (0..READS)
            .map(|k| {
                let t = Instant::now();
                let skill = format!("common-{:02}", 1 + k % 39);
                mcp.tool(
                    &session,
                    "skills_read",
                    json!({"workspace": middle, "skill": skill}),
                )
                .unwrap();
                t.elapsed()
            })
            .collect();
        let mount = home.join("workspaces").join(middle).join("mounts/skills");
        walk(&mount);
        let walks: Vec<Duration> = (0..WALKS)
            .map(|_| {
                let t = Instant::now();
                assert!(walk(&mount) > 40);
                t.elapsed()
            })
            .collect();
        let step = Step {
            n,
            usage: resources::usage(pid),
            mounts: resources::mounts_under(&home),
            open_p50_ms: quantile(last, 0.5),
            open_p99_ms: quantile(last, 0.99),
            first_run_p50_ms: quantile(last_runs, 0.5),
            first_run_p99_ms: quantile(last_runs, 0.99),
            read_ms: quantile(&reads, 0.5),
            walk_ms: quantile(&walks, 0.5),
            unwatched,
        };
        print_step(&step, &empty);
        results.push(step);
        if let Some(hold) = std::env::var("SCALE_HOLD")
            .ok()
            .and_then(|s| s.parse().ok())
        {
            println!("scale: holding {hold} s for a look (server pid {pid})");
            std::thread::sleep(Duration::from_secs(hold));
        }
    }
    paused(&mcp, &workspaces, &home, pid, &empty, pause);
    // A session of its own: the steps' one may have timed out while they paused.
    let session = mcp.session().unwrap();
    for (i, ws) in workspaces.iter().enumerate() {
        mcp.tool(&session, "workspace_close", json!({"workspace": ws}))
            .unwrap_or_else(|e| panic!("close {i}: {e}"));
    }
    // The runtime's blocking threads end after 10 s idle; those still there are not counted.
    std::thread::sleep(Duration::from_secs(12));
    let closed = resources::usage(pid);
    let closed_mounts = resources::mounts_under(&home);
    let (closed_threads, processes) = resources::names(pid);
    println!(
        "scale: after closing, the server's threads {closed_threads:?} and its processes {processes:?}"
    );
    let clean_exit = server.stop();
    let ends = Ends {
        empty,
        empty_threads,
        closed,
        closed_threads,
        empty_mounts,
        mounts: closed_mounts,
    };
    report(&results, ends, clean_exit);
}

/// Once every workspace has paused: what the runner holds then, and how long a call to a
/// paused workspace waits for its resume (a `skills_read`, the resume and the read), over
/// workspaces spread across all of them.
fn paused(mcp: &Mcp, workspaces: &[String], home: &Path, pid: u32, empty: &Usage, pause: u64) {
    let n = workspaces.len();
    // Every workspace pauses within `pause` of its last use; pausing them (unmounts, sandboxes
    // stopped) takes its own time, which grows with their number (1,000 unpaused ones
    // together took longer than 2 minutes).
    let deadline = Instant::now() + Duration::from_secs(pause + 120 + n as u64 / 2);
    while resources::mounts_under(home).1 > 0 {
        assert!(Instant::now() < deadline, "the workspaces did not pause");
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(12)); // blocking threads idle out
    let held = resources::usage(pid);
    println!(
        "scale: paused, the server's threads {:?}",
        resources::names(pid).0
    );
    if let Some(hold) = std::env::var("SCALE_HOLD_PAUSED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        println!("scale: holding {hold} s for a look at the paused server (pid {pid})");
        std::thread::sleep(Duration::from_secs(hold));
    }
    // A session of its own: the steps' one may have timed out meanwhile.
    let session = &mcp.session().unwrap();
    let session = session.as_str();
    let resumes: Vec<Duration> = (0..LAST_OPENS.min(n))
        .map(|k| {
            let ws = &workspaces[k * n / LAST_OPENS.min(n)];
            let t = Instant::now();
            mcp.tool(
                session,
                "skills_read",
                json!({"workspace": ws, "skill": "common-00"}),
            )
            .unwrap();
            t.elapsed()
        })
        .collect();
    let step = Step {
        n,
        usage: held,
        mounts: (0, 0),
        open_p50_ms: 0.0,
        open_p99_ms: 0.0,
        first_run_p50_ms: 0.0,
        first_run_p99_ms: 0.0,
        read_ms: 0.0,
        walk_ms: 0.0,
        unwatched: 0,
    };
    let u = &step.usage;
    println!(
        "scale: N={n} paused: server RSS {:.1} MiB, owned PSS {:.1} MiB ({} processes), threads {} (+{} owned), fds {}, inotify {} instances; per workspace {:.2} MiB and {:.2} threads; a call that resumes one: p50 {:.1} ms p99 {:.1} ms",
        mib(u.rss_kib), mib(u.owned_pss_kib), u.owned_processes, u.threads, u.owned_threads,
        u.fds, u.inotify_instances,
        per_workspace(&step, empty, Usage::memory_kib) / 1024.0,
        per_workspace(&step, empty, Usage::total_threads),
        quantile(&resumes, 0.5), quantile(&resumes, 0.99)
    );
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// What one workspace adds above the empty server, at `step`.
fn per_workspace(step: &Step, empty: &Usage, f: fn(&Usage) -> u64) -> f64 {
    (f(&step.usage) as f64 - f(empty) as f64) / step.n as f64
}

fn print_step(s: &Step, empty: &Usage) {
    let u = &s.usage;
    println!(
        "scale: N={}: server RSS {:.1} MiB, owned PSS {:.1} MiB ({} processes), threads {} (+{} owned), fds {} (+{} store objects), inotify {} instances / {} watches, mounts {} ({} FUSE); per workspace {:.2} MiB (server RSS and owned PSS) and {:.1} threads; open p50 {:.1} ms p99 {:.1} ms; first run p50 {:.1} ms p99 {:.1} ms; read {:.2} ms; walk {:.2} ms; {} opens without live updates",
        s.n, mib(u.rss_kib), mib(u.owned_pss_kib), u.owned_processes, u.threads, u.owned_threads,
        u.fds, u.object_fds, u.inotify_instances, u.inotify_watches, s.mounts.0, s.mounts.1,
        per_workspace(s, empty, Usage::memory_kib) / 1024.0,
        per_workspace(s, empty, Usage::total_threads),
        s.open_p50_ms, s.open_p99_ms, s.first_run_p50_ms, s.first_run_p99_ms, s.read_ms,
        s.walk_ms, s.unwatched
    );
}

/// The server at its start and after every workspace closed, with the names of its threads.
struct Ends {
    empty: Usage,
    empty_threads: resources::Counted,
    closed: Usage,
    closed_threads: resources::Counted,
    /// The empty server's mounts under the home (the workspaces folder's own), and those
    /// after every workspace closed.
    empty_mounts: (u64, u64),
    mounts: (u64, u64),
}

fn report(steps: &[Step], ends: Ends, clean_exit: bool) {
    let Ends {
        empty,
        empty_threads,
        closed,
        closed_threads,
        empty_mounts,
        mounts,
    } = ends;
    let (empty, closed) = (&empty, &closed);
    println!("| N | server RSS MiB | owned PSS MiB (processes) | threads (+ owned) | fds | inotify instances / watches | mounts (FUSE) | memory / workspace MiB | threads / workspace | open p50 / p99 ms | first run p50 / p99 ms | skills_read ms | walk ms | opens without live updates |");
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
            "{} | {:.2} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} | {:.2} | {} |",
            row(s.n.to_string(), &s.usage, s.mounts),
            per_workspace(s, empty, Usage::memory_kib) / 1024.0,
            per_workspace(s, empty, Usage::total_threads),
            s.open_p50_ms,
            s.open_p99_ms,
            s.first_run_p50_ms,
            s.first_run_p99_ms,
            s.read_ms,
            s.walk_ms,
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
                "walkMs": s.walk_ms, "unwatchedOpens": s.unwatched})
        })
        .collect();
    println!(
        "{}",
        json!({"empty": {"rssKib": empty.rss_kib, "threads": empty.threads, "fds": empty.fds, "ownedProcesses": empty.owned_processes},
            "closed": {"rssKib": closed.rss_kib, "threads": closed.threads, "fds": closed.fds, "ownedProcesses": closed.owned_processes, "mounts": mounts.0},
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
    if !back || !clean_exit {
        eprintln!("scale: failed (back at the start {back}, clean exit {clean_exit})");
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
            ],
        ),
    ];
    for (file, title, unit, lines) in figures {
        let text = plot::svg(title, "open workspaces (log scale)", unit, &lines);
        std::fs::write(dir.join(file), text).unwrap();
    }
    println!("scale: plots written to {}", dir.display());
}

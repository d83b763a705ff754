//! The scale bench: one `serve --http` holding N workspaces (N = 10, 100, 1,000 by default,
//! `SCALE_STEPS=10,100`), each with its two FUSE mounts, a bubblewrap executor (one run of a
//! script made its sandbox) and a live repository tier (one skill written into it), all on
//! the same warm toolkit plus one of four distinct ones. At each step: the server's RSS, the
//! summed RSS of every process it owns, threads, open descriptors, mounts, inotify instances
//! and watches, and what each workspace adds above the empty server; `workspace_open` p50/p99
//! and the first run's (its sandbox's start and the script) over the step's last opens, a
//! `skills_read` and a walk of one mount, beside a walk of a tmpfs copy of it (medians).
//! Then every workspace is closed and the server's figures compared with its empty start;
//! last, ten workspaces are opened and run in again and the server stopped with their
//! sandboxes live: how long its stop takes, and that it leaves no mount.
//!
//! `cargo bench --bench scale` (as root, with /dev/fuse and bubblewrap). Writes a table and
//! a JSON line to stdout and, with `SCALE_PLOTS=DIR`, SVG plots of each figure against N
//! (docs/benchmarks holds those of the last run in the docs).

#[path = "support/plot.rs"]
mod plot;
#[path = "support/scale_report.rs"]
mod report;
#[path = "support/resources.rs"]
mod resources;
#[path = "support/server.rs"]
mod server;
#[path = "../tests/support/mod.rs"]
mod support;

use report::{mib, per_workspace, print_step, report, Ends, Step, Stopped};
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
/// Workspaces open, each with its sandbox, when the server is stopped.
const STOP_LIVE: usize = 10;

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

/// Each live tier holds an inotify instance: with fewer than `n` left, the last opens go
/// without live updates (and say so), which changes what a step measures.
fn warn_of_inotify_limit(n: usize) {
    let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    if let Some(limit) = limit.filter(|limit| *limit < n + 16) {
        println!(
            "scale: warning: fs.inotify.max_user_instances is {limit}: past it, workspaces open without live updates (the package raises it: packaging/sysctl/60-cloud-harness.conf)"
        );
    }
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

/// `WALKS` walks of `mount`, each after one of a copy of it on tmpfs (`/dev/shm`), the same
/// run's baseline: the machine's noise moves both, so their ratio is what compares steps.
fn walks_beside_tmpfs(mount: &Path) -> (Vec<Duration>, Vec<Duration>) {
    let copy = Path::new("/dev/shm").join(format!("cloud-harness-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    copy_tree(mount, &copy);
    let timed = |dir: &Path| {
        let t = Instant::now();
        assert!(walk(dir) > 40);
        t.elapsed()
    };
    walk(mount);
    walk(&copy);
    let (mut walks, mut tmpfs_walks) = (Vec::new(), Vec::new());
    for _ in 0..WALKS {
        tmpfs_walks.push(timed(&copy));
        walks.push(timed(mount));
    }
    std::fs::remove_dir_all(&copy).unwrap();
    (walks, tmpfs_walks)
}

/// Copies the folders and files under `from` to `to` (links left out, as the walk skips them).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let t = entry.file_type().unwrap();
        if t.is_dir() {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        } else if t.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
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
    let largest = steps.iter().copied().max().unwrap_or(0);
    warn_of_inotify_limit(largest);
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src");
    let common = toolkit(&store, &src, "common", 40);
    let distinct: Vec<Value> = (0..DISTINCT)
        .map(|i| toolkit(&store, &src, &format!("distinct{i}"), 5))
        .collect();
    let home = tmp.path().join("home");
    // Workspaces pause after this long unused (SCALE_PAUSE): longer than the steps take, so
    // each step's figures are of workspaces all unpaused (60 s for 10 and 100; opening and
    // running in 1,000 takes some 90 s, so 240 s once a step is larger).
    let pause: u64 = std::env::var("SCALE_PAUSE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if largest > 100 { 240 } else { 60 });
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
    let started = Instant::now();
    for &n in &steps {
        while workspaces.len() < n {
            let i = workspaces.len();
            let toolkits = json!([common, distinct[i % DISTINCT]]);
            let opened = open_and_run(
                &mcp,
                &session,
                &server.api(),
                &home,
                &format!("scale-{i}"),
                toolkits,
            );
            opens.push(opened.open);
            first_runs.push(opened.first_run);
            unwatched += usize::from(opened.unwatched);
            workspaces.push(opened.workspace);
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
        let (walks, tmpfs_walks) = walks_beside_tmpfs(&mount);
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
            walk_tmpfs_ms: quantile(&tmpfs_walks, 0.5),
            unwatched,
        };
        print_step(&step, &empty);
        results.push(step);
        hold(&format!("N={n}"), pid);
    }
    paused(&mcp, &workspaces, &home, pid, &empty, pause);
    // A session of its own: the steps' one may have timed out while they paused.
    let session = mcp.session().unwrap();
    for (i, ws) in workspaces.iter().enumerate() {
        mcp.tool(&session, "workspace_close", json!({"workspace": ws}))
            .unwrap_or_else(|e| panic!("close {i}: {e}"));
    }
    // The runtime's blocking threads end after 10 s idle, and the server gives back what the
    // allocator holds free from 5 s to 20 s after the last close, every 2 s: looked at once
    // both are past.
    std::thread::sleep(Duration::from_secs(30));
    let closed = resources::usage(pid);
    let closed_mounts = resources::mounts_under(&home);
    let (closed_threads, processes) = resources::names(pid);
    println!(
        "scale: after closing, the server's threads {closed_threads:?} and its processes {processes:?}"
    );
    hold("all closed", pid);
    // A stop with sandboxes live: the server ends each before it unmounts its workspace (the
    // sandbox's namespace holds copies of the mounts, whose sessions would be waited for in
    // vain). The client's connections go first, so that the stop does not wait one out.
    let session = mcp.session().unwrap();
    for i in 0..STOP_LIVE {
        let toolkits = json!([common, distinct[i % DISTINCT]]);
        open_and_run(
            &mcp,
            &session,
            &server.api(),
            &home,
            &format!("stop-{i}"),
            toolkits,
        );
    }
    let owned = resources::descendants(pid);
    drop(mcp);
    let t = Instant::now();
    let clean_exit = server.stop(Duration::from_secs(120));
    let secs = t.elapsed().as_secs_f64();
    // The sandboxes end with the server; the unmount guard once it has seen it go.
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left = owned
            .iter()
            .filter(|p| Path::new(&format!("/proc/{p}")).exists())
            .count();
        if left == 0 || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stop = Stopped {
        live: STOP_LIVE,
        owned: owned.len(),
        owned_left: left,
        secs,
        clean_exit,
        mounts_left: resources::mounts_under(&home).0,
    };
    let ends = Ends {
        empty,
        empty_threads,
        closed,
        closed_threads,
        empty_mounts,
        mounts: closed_mounts,
    };
    report(&results, ends, stop);
}

/// A workspace just opened and run in once.
struct Opened {
    workspace: String,
    open: Duration,
    /// Its first run: its sandbox starts, then the script runs.
    first_run: Duration,
    /// Its open said live updates are off (no inotify instance left).
    unwatched: bool,
}

/// Opens a workspace on `toolkits`, writes a skill into its repository tier (live) and runs
/// a script of the common toolkit in it.
fn open_and_run(
    mcp: &Mcp,
    session: &str,
    api: &str,
    home: &Path,
    key: &str,
    toolkits: Value,
) -> Opened {
    let args = json!({"idempotencyKey": key, "toolkits": toolkits});
    let t = Instant::now();
    let opened = mcp
        .tool(session, "workspace_open", args)
        .unwrap_or_else(|e| panic!("open {key}: {e}"));
    let open = t.elapsed();
    let result = &opened["structuredContent"];
    let unwatched = result["warnings"]
        .to_string()
        .contains("live updates are off");
    let workspace = result["workspace"].as_str().unwrap().to_owned();
    let live = home
        .join("workspaces")
        .join(&workspace)
        .join("repo/.agents/skills/live-one");
    std::fs::create_dir_all(&live).unwrap();
    std::fs::write(
        live.join("SKILL.md"),
        "---\nname: live-one\ndescription: A skill of the repository tier.\n---\nLive.\n",
    )
    .unwrap();
    let run = json!({"workspace": workspace, "skill": "common-00", "script": "scripts/hello.sh"});
    let t = Instant::now();
    let ran = mcp
        .run_approved(api, session, &run)
        .unwrap_or_else(|e| panic!("run in {key}: {e}"));
    let first_run = t.elapsed();
    assert!(ran.to_string().contains("scaled"), "run in {key}: {ran}");
    Opened {
        workspace,
        open,
        first_run,
        unwatched,
    }
}

/// `SCALE_HOLD` seconds for a look at the server (`/proc/PID/smaps`, say), if set.
fn hold(at: &str, pid: u32) {
    hold_for("SCALE_HOLD", at, pid);
}

/// The seconds in `var`, if set, for a look at the server.
fn hold_for(var: &str, at: &str, pid: u32) {
    if let Some(hold) = std::env::var(var).ok().and_then(|s| s.parse().ok()) {
        println!("scale: {at}: holding {hold} s for a look (server pid {pid})");
        std::thread::sleep(Duration::from_secs(hold));
    }
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
    hold_for("SCALE_HOLD_PAUSED", "paused", pid);
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
        walk_tmpfs_ms: 0.0,
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

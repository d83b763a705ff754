//! The soak: one `serve --http` holding, for `SOAK_SECONDS` (600 by default), 64 readers
//! walking and reading a workspace's mount while its live tier changes every second,
//! `skills_run` calls beside them, and 200 MCP clients. Per minute: errors (goal 0; an
//! `ENOENT` for a live skill removed meanwhile is counted apart), p50/p99 of a file read
//! through the mount and of an MCP call, and the server's RSS, open descriptors and threads
//! (and the RSS of the processes it owns). At the end, how far those moved after the first
//! minute (goal: within ±10%). Open store objects are counted apart: they are the process's
//! bounded cache of open files (2,048 at most), which the live tier's new files fill over
//! minutes.
//!
//! `cargo bench --bench soak` (as root, with /dev/fuse and bubblewrap); CI runs
//! `SOAK_SECONDS=60 cargo bench --profile dev --bench soak`. Exits 1 on any error, and on a
//! drift past 10% in a run of 5 minutes or more.

// The soak reads some of what these give, the scale bench all.
#[allow(dead_code)]
#[path = "support/resources.rs"]
mod resources;
#[path = "support/server.rs"]
mod server;
#[path = "../tests/support/mod.rs"]
mod support;

use resources::Usage;
use server::{Mcp, Server};

use serde_json::{json, Value};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const READERS: usize = 64;
const CLIENTS: usize = 200;
/// Each client's pause between calls: a steady load two cores can carry in a debug build.
const CLIENT_PAUSE: Duration = Duration::from_millis(250);
/// Each reader's pause after a walk of the whole mount: without it 64 readers of the kernel's
/// cache take both cores, and the soak measures the scheduler, not the server.
const READER_PAUSE: Duration = Duration::from_millis(200);
/// Live skills kept at once: one added a second, the oldest removed.
const LIVE: usize = 5;

/// Latencies in log2 buckets of microseconds: bounded, whatever the number of samples.
struct Histogram([AtomicU64; 40]);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Histogram {
    fn add(&self, d: Duration) {
        let us = d.as_micros().max(1) as u64;
        self.0[(63 - us.leading_zeros() as usize).min(39)].fetch_add(1, Relaxed);
    }

    /// The upper bound of the bucket holding the `p` quantile, in ms.
    fn quantile_ms(&self, p: f64) -> f64 {
        let counts: Vec<u64> = self.0.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let mut seen = 0;
        for (i, n) in counts.iter().enumerate() {
            seen += n;
            if total > 0 && seen as f64 >= p * total as f64 {
                return (1u64 << (i + 1)) as f64 / 1000.0;
            }
        }
        0.0
    }

    fn count(&self) -> u64 {
        self.0.iter().map(|c| c.load(Relaxed)).sum()
    }
}

/// One minute's figures.
#[derive(Default)]
struct Minute {
    reads: Histogram,
    calls: Histogram,
    runs: AtomicU64,
    read_errors: AtomicU64,
    call_errors: AtomicU64,
    run_errors: AtomicU64,
    vanished: AtomicU64,
    first_errors: Mutex<Vec<String>>,
}

impl Minute {
    fn error(&self, counter: &AtomicU64, what: String) {
        counter.fetch_add(1, Relaxed);
        let mut first = self.first_errors.lock().unwrap();
        if first.len() < 5 {
            first.push(what);
        }
    }

    fn errors(&self) -> u64 {
        [&self.read_errors, &self.call_errors, &self.run_errors]
            .iter()
            .map(|c| c.load(Relaxed))
            .sum()
    }
}

struct Clock {
    started: Instant,
    minutes: Vec<Minute>,
}

impl Clock {
    fn now(&self) -> &Minute {
        let i = (self.started.elapsed().as_secs() / 60) as usize;
        &self.minutes[i.min(self.minutes.len() - 1)]
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What is missing for a real soak here, if anything.
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

/// A toolkit of 40 skills, one (`soak-runner`) with a script, warm in the store.
fn toolkit(store: &cloud_harness_store::cas::Store, src: &Path) -> Value {
    use std::os::unix::fs::PermissionsExt;
    for i in 0..40 {
        let name = if i == 0 {
            "soak-runner".to_owned()
        } else {
            format!("soak-{i:02}")
        };
        let dir = src.join(&name);
        std::fs::create_dir_all(dir.join("references")).unwrap();
        let skill =
            format!("---\nname: {name}\ndescription: Skill {i} of the soak.\n---\nBody {i}.\n");
        std::fs::write(dir.join("SKILL.md"), skill).unwrap();
        std::fs::write(dir.join("references/notes.md"), "notes\n".repeat(300)).unwrap();
    }
    let script = src.join("soak-runner/scripts/hello.sh");
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::write(&script, "#!/bin/sh\necho soaked\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    serde_json::to_value(support::warm_toolkit(store, src, "soak")).unwrap()
}

/// Reads every file under `dir` (not following links), timing each.
fn walk(dir: &Path, clock: &Clock, stop: &AtomicBool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return note_missing(dir, clock, std::fs::read_dir(dir).err());
    };
    for entry in entries {
        if stop.load(Relaxed) {
            return;
        }
        let Ok(entry) = entry else { continue };
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(&path, clock, stop),
            Ok(t) if t.is_file() => {
                let started = Instant::now();
                let mut bytes = Vec::new();
                match std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut bytes)) {
                    Ok(_) => clock.now().reads.add(started.elapsed()),
                    Err(e) => note_missing(&path, clock, Some(e)),
                }
            }
            _ => {}
        }
    }
}

/// An `ENOENT` under a live skill the writer removes is expected; anything else is an error.
fn note_missing(path: &Path, clock: &Clock, e: Option<std::io::Error>) {
    let Some(e) = e else { return };
    let live = path.to_string_lossy().contains("/live-");
    let minute = clock.now();
    if live && e.kind() == std::io::ErrorKind::NotFound {
        minute.vanished.fetch_add(1, Relaxed);
    } else {
        minute.error(&minute.read_errors, format!("{}: {e}", path.display()));
    }
}

fn main() {
    let seconds = env_or("SOAK_SECONDS", 600);
    if let Some(what) = missing() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the soak needs {what} (run .ci/setup as root)"
        );
        println!("soak skipped: it needs {what}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let spec = toolkit(&store, &tmp.path().join("src"));
    let home = tmp.path().join("home");
    let server = Server::start(store.root(), &home, &[]);
    let pid = server.pid();
    let mcp = Arc::new(Mcp::new(&server.url, CLIENTS + 8));
    let session = mcp.session().unwrap();
    let opened = mcp
        .tool(
            &session,
            "workspace_open",
            json!({"idempotencyKey": "soak", "toolkits": [spec]}),
        )
        .unwrap();
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = home.join("workspaces").join(&ws);
    let mount = dir.join("mounts/skills");
    let live_root = dir.join("repo/.agents/skills");
    // The script approved once, as an operator would.
    let run_args = json!({"workspace": ws, "skill": "soak-runner", "script": "scripts/hello.sh"});
    mcp.run_approved(&server.api(), &session, &run_args)
        .unwrap_or_else(|e| panic!("skills_run: {e}"));

    let minutes = (seconds as usize).div_ceil(60).max(1);
    let clock = Arc::new(Clock {
        started: Instant::now(),
        minutes: (0..minutes).map(|_| Minute::default()).collect(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let samples: Arc<Mutex<Vec<Usage>>> = Arc::default();
    let mut threads = Vec::new();
    for _ in 0..READERS {
        let (clock, stop, mount) = (clock.clone(), stop.clone(), mount.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                walk(&mount, &clock, &stop);
                std::thread::sleep(READER_PAUSE);
            }
        }));
    }
    {
        let (clock, stop, live_root) = (clock.clone(), stop.clone(), live_root.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Relaxed) {
                let skill = live_root.join(format!("live-{n}"));
                std::fs::create_dir_all(&skill).unwrap();
                let text =
                    format!("---\nname: live-{n}\ndescription: Live skill {n}.\n---\nBody.\n");
                std::fs::write(skill.join("SKILL.md"), text).unwrap();
                if n > 0 {
                    let before = live_root.join(format!("live-{}/SKILL.md", n - 1));
                    let _ = std::fs::write(
                        before,
                        format!(
                            "---\nname: live-{}\ndescription: Changed.\n---\nAgain.\n",
                            n - 1
                        ),
                    );
                }
                if n >= LIVE {
                    let _ = std::fs::remove_dir_all(live_root.join(format!("live-{}", n - LIVE)));
                }
                n += 1;
                let _ = clock.now();
                std::thread::sleep(Duration::from_secs(1));
            }
        }));
    }
    {
        let (clock, stop, mcp, args) = (clock.clone(), stop.clone(), mcp.clone(), run_args.clone());
        threads.push(std::thread::spawn(move || {
            let session = mcp.session().unwrap();
            while !stop.load(Relaxed) {
                let minute = clock.now();
                match mcp.tool(&session, "skills_run", args.clone()) {
                    Ok(r) if r.to_string().contains("soaked") => {
                        minute.runs.fetch_add(1, Relaxed);
                    }
                    Ok(r) => minute.error(&minute.run_errors, format!("skills_run: {r}")),
                    Err(e) => minute.error(&minute.run_errors, e),
                }
            }
        }));
    }
    for c in 0..CLIENTS {
        let (clock, stop, mcp, ws) = (clock.clone(), stop.clone(), mcp.clone(), ws.clone());
        threads.push(std::thread::spawn(move || {
            let session = loop {
                match mcp.session() {
                    Ok(s) => break s,
                    Err(e) => {
                        let m = clock.now();
                        m.error(&m.call_errors, format!("initialize: {e}"));
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            };
            let mut i = c;
            while !stop.load(Relaxed) {
                let (name, args) = match i % 2 {
                    0 => ("skills_list", json!({"workspace": ws})),
                    _ => (
                        "skills_read",
                        json!({"workspace": ws, "skill": format!("soak-{:02}", 1 + i % 39)}),
                    ),
                };
                let started = Instant::now();
                let minute = clock.now();
                match mcp.tool(&session, name, args) {
                    Ok(_) => minute.calls.add(started.elapsed()),
                    Err(e) => minute.error(&minute.call_errors, e),
                }
                i += 1;
                std::thread::sleep(CLIENT_PAUSE);
            }
        }));
    }
    // A sample of the server at the end of every minute.
    let deadline = Duration::from_secs(seconds);
    let mut next = Duration::from_secs(60).min(deadline);
    while clock.started.elapsed() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        if clock.started.elapsed() >= next {
            samples.lock().unwrap().push(resources::usage(pid));
            next = (next + Duration::from_secs(60)).min(deadline + Duration::from_secs(1));
        }
    }
    if samples.lock().unwrap().len() < minutes {
        samples.lock().unwrap().push(resources::usage(pid));
    }
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let clean_exit = server.stop(Duration::from_secs(120));

    report(&clock, &samples.lock().unwrap(), seconds, clean_exit);
}

fn report(clock: &Clock, samples: &[Usage], seconds: u64, clean_exit: bool) {
    println!("| minute | reads | read p50 / p99 ms | MCP calls | call p50 / p99 ms | runs | errors | ENOENT of removed live skills | RSS MiB | threads | fds (+ open store objects) | owned RSS MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, (m, s)) in clock.minutes.iter().zip(samples).enumerate() {
        println!(
            "| {} | {} | {:.2} / {:.2} | {} | {:.2} / {:.2} | {} | {} | {} | {:.1} | {} | {} (+{}) | {:.1} |",
            i + 1, m.reads.count(), m.reads.quantile_ms(0.5), m.reads.quantile_ms(0.99),
            m.calls.count(), m.calls.quantile_ms(0.5), m.calls.quantile_ms(0.99),
            m.runs.load(Relaxed), m.errors(), m.vanished.load(Relaxed),
            s.rss_kib as f64 / 1024.0, s.threads, s.fds, s.object_fds, s.owned_rss_kib as f64 / 1024.0
        );
        for e in m.first_errors.lock().unwrap().iter() {
            println!("    error in minute {}: {e}", i + 1);
        }
        rows.push(json!({"minute": i + 1, "reads": m.reads.count(), "readP99Ms": m.reads.quantile_ms(0.99), "calls": m.calls.count(), "callP99Ms": m.calls.quantile_ms(0.99), "runs": m.runs.load(Relaxed), "errors": m.errors(), "vanished": m.vanished.load(Relaxed), "rssKib": s.rss_kib, "threads": s.threads, "fds": s.fds, "storeObjectFds": s.object_fds, "ownedRssKib": s.owned_rss_kib}));
    }
    let errors: u64 = clock.minutes.iter().map(Minute::errors).sum();
    // Drift: the last minute against the end of the first (after warm-up).
    let drift = |f: fn(&Usage) -> u64| -> f64 {
        match (samples.first(), samples.last()) {
            (Some(a), Some(b)) if samples.len() > 1 && f(a) > 0 => {
                (f(b) as f64 - f(a) as f64) * 100.0 / f(a) as f64
            }
            _ => 0.0,
        }
    };
    let (rss, threads, fds) = (drift(|s| s.rss_kib), drift(|s| s.threads), drift(|s| s.fds));
    let objects = samples.last().map_or(0, |s| s.object_fds);
    println!("soak: {seconds} s, {errors} errors; after minute 1: RSS {rss:+.1}%, threads {threads:+.1}%, fds {fds:+.1}% (and {objects} open store objects at the end); the server exited {}", if clean_exit { "cleanly" } else { "with an error" });
    println!(
        "{}",
        json!({"soakSeconds": seconds, "errors": errors, "rssDriftPct": rss, "threadsDriftPct": threads, "fdsDriftPct": fds, "minutes": rows})
    );
    let drifted = seconds >= 300 && [rss, threads, fds].iter().any(|d| d.abs() > 10.0);
    if errors > 0 || !clean_exit || drifted {
        eprintln!(
            "soak failed: {errors} errors, clean exit {clean_exit}, drift past 10% {drifted}"
        );
        std::process::exit(1);
    }
}

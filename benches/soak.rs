//! The soak: one `serve --http` holding, for `SOAK_SECONDS` (600 by default), 64 readers
//! walking and reading a workspace's mount while its live tier changes every second,
//! `skills_run` calls beside them, and 200 MCP clients. Per minute: errors (goal 0; an
//! `ENOENT` for a live skill removed meanwhile is counted apart), p50/p99 of a file read
//! through the mount and of an MCP call, and the server's RSS, open descriptors and threads
//! (and the RSS of the processes it owns). At the end, how far those moved after the first
//! minute (goal: within ±10%). Open store objects are counted apart: they are the views'
//! bounded cache of open files (256 each), which the live tier's new files fill over minutes.
//!
//! `cargo bench --bench soak` (as root, with /dev/fuse and bubblewrap); CI runs
//! `SOAK_SECONDS=60 cargo bench --profile dev --bench soak`. Exits 1 on any error, and on a
//! drift past 10% in a run of 5 minutes or more.

#[path = "../tests/support/mod.rs"]
mod support;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
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

/// The server's RSS (KiB), threads, open descriptors other than store objects, its
/// descendants' RSS (KiB), and its open store objects: those are a cache of the views, 256
/// per view at most (`skills::namespace`), which a live tier's new files fill over minutes.
type Sample = (u64, u64, u64, u64, u64);

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

/// The server under soak, ended if the bench ends early (a panic): none is left running.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Mcp {
    url: String,
    http: reqwest::blocking::Client,
}

impl Mcp {
    fn post(&self, session: Option<&str>, body: &Value) -> Result<(Option<String>, Value), String> {
        let mut r = self
            .http
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .header("MCP-Protocol-Version", "2025-11-25")
            .body(body.to_string());
        if let Some(s) = session {
            r = r.header("Mcp-Session-Id", s);
        }
        let response = r.send().map_err(|e| e.to_string())?;
        let id = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        let text = response.text().map_err(|e| e.to_string())?;
        let answer = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .rfind(|v| v.get("id").is_some())
            .or_else(|| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null);
        if !status.is_success() && status.as_u16() != 202 {
            return Err(format!("{status}: {text}"));
        }
        Ok((id, answer))
    }

    fn session(&self) -> Result<String, String> {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "soak", "version": "1"}}});
        let (id, _) = self.post(None, &init)?;
        let id = id.ok_or("no session id")?;
        self.post(
            Some(&id),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )?;
        Ok(id)
    }

    /// A tool call's result; an error for a transport failure or `isError`.
    fn tool(&self, session: &str, name: &str, args: Value) -> Result<Value, String> {
        let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": args}});
        let (_, answer) = self.post(Some(session), &body)?;
        let result = answer
            .get("result")
            .cloned()
            .ok_or_else(|| format!("{name}: {answer}"))?;
        if result["isError"] == json!(true) {
            return Err(format!("{name}: {}", result["structuredContent"]));
        }
        Ok(result)
    }
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

/// The server's RSS (KiB), threads and open descriptors, and the RSS of its descendants.
fn sample(pid: u32) -> Sample {
    let field = |status: &str, key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let (mut fds, mut objects) = (0, 0);
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        match target.to_string_lossy().contains("/store/objects/") {
            true => objects += 1,
            false => fds += 1,
        }
    }
    // Descendants: every process whose chain of parents reaches `pid`.
    let mut parents = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(pp) = ppid {
            parents.insert(p, pp);
        }
    }
    let owned: u64 = parents
        .keys()
        .filter(|&&p| {
            let mut at = p;
            for _ in 0..64 {
                match parents.get(&at) {
                    Some(&pp) if pp == pid => return true,
                    Some(&pp) if pp > 1 => at = pp,
                    _ => return false,
                }
            }
            false
        })
        .map(|p| {
            field(
                &std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default(),
                "VmRSS:",
            )
        })
        .sum();
    (
        field(&status, "VmRSS:"),
        field(&status, "Threads:"),
        fds,
        owned,
        objects,
    )
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
    let mut server = Server(
        Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
            .args(["serve", "--http", "127.0.0.1:0", "--auth", "none"])
            .env("TOOLKIT_CACHE_ROOT", store.root())
            .env("CLOUD_HARNESS_HOME", &home)
            .env("CLOUD_HARNESS_EXECUTOR", "bwrap")
            .env("CLOUD_HARNESS_CONTAINERS", "off")
            .env("CLOUD_HARNESS_STANDBY_HELPERS", "0")
            .env("CLOUD_HARNESS_MIN_FREE_MIB", "1")
            .env("ALLOWED_GIT_HOSTS", support::WARM_HOST)
            // One machine plays every client, as one principal: its quotas never bind.
            .env("CLOUD_HARNESS_LIMIT_SESSIONS", "100000")
            .env("CLOUD_HARNESS_LIMIT_REQUESTS_PER_SECOND", "10000000")
            .env("CLOUD_HARNESS_LIMIT_REQUESTS_IN_FLIGHT", "100000")
            .env("CLOUD_HARNESS_LIMIT_RUNS", "1000")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = BufReader::new(server.0.stderr.take().unwrap());
    let mut line = String::new();
    let url = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve ended");
        if let Some(rest) = line.split("at http://").nth(1) {
            break format!("http://{}", rest.trim());
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let pid = server.0.id();
    let http = reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(CLIENTS + 8)
        .build()
        .unwrap();
    let mcp = Arc::new(Mcp {
        url: url.clone(),
        http,
    });
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
    if let Err(e) = mcp.tool(&session, "skills_run", run_args.clone()) {
        let digest = e
            .split("\"digest\":\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .map(str::to_owned);
        let digest = digest.unwrap_or_else(|| panic!("skills_run: {e}"));
        let approval =
            json!({"digest": digest, "skill": "soak-runner", "reason": "the soak's own script"});
        let r = mcp
            .http
            .post(format!("{}/api/v1/approvals", url.trim_end_matches("/mcp")))
            .header("Content-Type", "application/json")
            .body(approval.to_string())
            .send()
            .unwrap();
        assert!(
            r.status().is_success(),
            "approval: {}",
            r.text().unwrap_or_default()
        );
    }

    let minutes = (seconds as usize).div_ceil(60).max(1);
    let clock = Arc::new(Clock {
        started: Instant::now(),
        minutes: (0..minutes).map(|_| Minute::default()).collect(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
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
            samples.lock().unwrap().push(sample(pid));
            next = (next + Duration::from_secs(60)).min(deadline + Duration::from_secs(1));
        }
    }
    if samples.lock().unwrap().len() < minutes {
        samples.lock().unwrap().push(sample(pid));
    }
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = server.0.wait().unwrap();

    report(&clock, &samples.lock().unwrap(), seconds, status.success());
}

fn report(clock: &Clock, samples: &[Sample], seconds: u64, clean_exit: bool) {
    println!("| minute | reads | read p50 / p99 ms | MCP calls | call p50 / p99 ms | runs | errors | ENOENT of removed live skills | RSS MiB | threads | fds (+ open store objects) | owned RSS MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, (m, s)) in clock.minutes.iter().zip(samples).enumerate() {
        println!(
            "| {} | {} | {:.2} / {:.2} | {} | {:.2} / {:.2} | {} | {} | {} | {:.1} | {} | {} (+{}) | {:.1} |",
            i + 1, m.reads.count(), m.reads.quantile_ms(0.5), m.reads.quantile_ms(0.99),
            m.calls.count(), m.calls.quantile_ms(0.5), m.calls.quantile_ms(0.99),
            m.runs.load(Relaxed), m.errors(), m.vanished.load(Relaxed),
            s.0 as f64 / 1024.0, s.1, s.2, s.4, s.3 as f64 / 1024.0
        );
        for e in m.first_errors.lock().unwrap().iter() {
            println!("    error in minute {}: {e}", i + 1);
        }
        rows.push(json!({"minute": i + 1, "reads": m.reads.count(), "readP99Ms": m.reads.quantile_ms(0.99), "calls": m.calls.count(), "callP99Ms": m.calls.quantile_ms(0.99), "runs": m.runs.load(Relaxed), "errors": m.errors(), "vanished": m.vanished.load(Relaxed), "rssKib": s.0, "threads": s.1, "fds": s.2, "storeObjectFds": s.4, "ownedRssKib": s.3}));
    }
    let errors: u64 = clock.minutes.iter().map(Minute::errors).sum();
    // Drift: the last minute against the end of the first (after warm-up).
    let drift = |f: fn(&Sample) -> u64| -> f64 {
        match (samples.first(), samples.last()) {
            (Some(a), Some(b)) if samples.len() > 1 && f(a) > 0 => {
                (f(b) as f64 - f(a) as f64) * 100.0 / f(a) as f64
            }
            _ => 0.0,
        }
    };
    let (rss, threads, fds) = (drift(|s| s.0), drift(|s| s.1), drift(|s| s.2));
    let objects = samples.last().map_or(0, |s| s.4);
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

//! One server's home and store, started again and again, killed at a kill point or after a
//! random delay; the seeded random numbers; the calls the steps make, which tolerate a server
//! that dies while answering.

use crate::support::http::{start, Running};
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a run is killed.
#[derive(Debug, Clone)]
pub enum Kill {
    /// At a named kill point (`NAME` or `NAME@N`).
    At(String),
    /// After this long, wherever it is.
    After(Duration),
}

/// A home and a store that outlive the servers started on them.
pub struct Site {
    pub root: tempfile::TempDir,
    env: Vec<(String, String)>,
    pub random: Random,
    /// Kills that hit a process mid-work, and restarts made after them.
    pub kills: usize,
    pub restarts: usize,
    /// What the last killed server logged, and its unmount guard after it (shown when
    /// something was left behind).
    pub last_log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Site {
    pub fn new(env: &[(&str, String)], random: Random) -> Site {
        Site {
            root: tempfile::tempdir().unwrap(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            random,
            kills: 0,
            restarts: 0,
            last_log: Default::default(),
        }
    }

    pub fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    pub fn store(&self) -> PathBuf {
        self.root.path().join("store")
    }

    /// `serve --http` on this site (workspaces mounted, every caller the operator), armed to
    /// die at `kill_at`; what it logged if it died before it listened.
    pub fn start(&self, kill_at: Option<&str>) -> Result<Running, String> {
        let mut env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if let Some(point) = kill_at {
            env.push(("CLOUD_HARNESS_KILL_AT", point));
        }
        start(self.root.path(), &["--auth", "none"], &env)
    }

    /// A server that must start.
    pub fn serve(&mut self) -> Running {
        let running = self
            .start(None)
            .unwrap_or_else(|log| panic!("serve did not start: {log}"));
        wait_ready(&running);
        running
    }

    /// Runs `work` against a server armed with `kill`, and waits for that server to die.
    /// Whether the kill hit it mid-work (a point reached, or the delay ran out first); a
    /// named point must be reached.
    pub fn killed_during(&mut self, kill: &Kill, work: impl FnOnce(&Running)) -> bool {
        let point = match kill {
            Kill::At(p) => Some(p.as_str()),
            Kill::After(_) => None,
        };
        let mut running = match self.start(point) {
            Ok(r) => r,
            // Killed at start-up (restoring what the last kill left).
            Err(log) => {
                assert!(log.contains("killed at"), "serve did not start: {log}");
                self.kills += 1;
                return true;
            }
        };
        wait_ready(&running);
        self.last_log = running.log.clone();
        let hit = match kill {
            Kill::At(_) => {
                work(&running);
                let status =
                    wait_for_exit(&mut running, Duration::from_secs(60)).unwrap_or_else(|| {
                        panic!(
                            "{kill:?} was never reached: {}",
                            running.log.lock().unwrap()
                        )
                    });
                assert_eq!(status, Some(9), "{kill:?}: {}", running.log.lock().unwrap());
                true
            }
            Kill::After(delay) => {
                let pid = running.child.id();
                let delay = *delay;
                let killer = std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                });
                work(&running);
                // Killed before the work ended (else the work was over first).
                let mid_work = killer.is_finished();
                killer.join().unwrap();
                let _ = running.child.wait();
                mid_work
            }
        };
        self.kills += usize::from(hit);
        hit
    }

    /// Stops a server as systemd does (SIGTERM), which must end it cleanly.
    pub fn stop(&self, mut running: Running) {
        let pid = nix::unistd::Pid::from_raw(running.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = running.child.wait().unwrap();
        assert!(
            status.success(),
            "serve ended with {status}: {}",
            running.log.lock().unwrap()
        );
    }

    /// The CLI on this site; its exit status and output.
    pub fn cli(&self, args: &[&str]) -> (bool, String) {
        let out = self.cli_command(args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    pub fn cli_command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-harness"));
        cmd.args(args)
            .env("TOOLKIT_CACHE_ROOT", self.store())
            .env("CLOUD_HARNESS_HOME", self.home())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }
}

/// The exit of `running` within `limit`: `Some(signal)` or `Some(None)` for an exit code.
fn wait_for_exit(running: &mut Running, limit: Duration) -> Option<Option<i32>> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = running.child.try_wait().unwrap() {
            return Some(status.signal());
        }
        if std::time::Instant::now() > deadline {
            let _ = running.child.kill();
            let _ = running.child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `/readyz` says the server has restored what it had.
fn wait_ready(running: &Running) {
    let client = client();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = client
            .get(format!("http://{}/readyz", running.addr))
            .send()
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return;
        }
        if std::time::Instant::now() > deadline {
            panic!("never ready: {}", running.log.lock().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// A JSON request to the API; the status and the answer, or the error of a server that died.
pub fn api(
    running: &Running,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let mut r = client().request(
        method.parse().unwrap(),
        format!("http://{}{path}", running.addr),
    );
    if let Some(b) = body {
        r = r
            .header("Content-Type", "application/json")
            .body(b.to_string());
    }
    let response = r.send().map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let text = response.text().map_err(|e| e.to_string())?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// `workspace_open` over MCP; its result, or the error of a server that died while opening.
pub fn open(running: &Running, request: &Value) -> Result<Value, String> {
    let session = session(running)?;
    tool(running, &session, "workspace_open", request.clone())
}

/// A new MCP session (initialized); its id, or the error of a server that died meanwhile.
pub fn session(running: &Running) -> Result<String, String> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "crash", "version": "1"}}});
    let response = post(running, None, &init)?;
    let id = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| format!("no session: {}", response.status()))?
        .to_owned();
    let _ = response.text();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(running, Some(&id), &initialized)?;
    Ok(id)
}

fn post(
    running: &Running,
    session: Option<&str>,
    body: &Value,
) -> Result<reqwest::blocking::Response, String> {
    let mut r = client()
        .post(format!("http://{}/mcp", running.addr))
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(id) = session {
        r = r.header("Mcp-Session-Id", id);
    }
    r.send().map_err(|e| e.to_string())
}

/// A tool call; its `result`, or why there was none.
pub fn tool(running: &Running, session: &str, name: &str, args: Value) -> Result<Value, String> {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": args}});
    let response = post(running, Some(session), &body)?;
    let text = response.text().map_err(|e| e.to_string())?;
    // A JSON body, or SSE events of which the last `data:` is the answer.
    let answer = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .rfind(|v| v.get("id").is_some())
        .or_else(|| serde_json::from_str(&text).ok())
        .ok_or_else(|| format!("no answer in {text:?}"))?;
    answer
        .get("result")
        .cloned()
        .ok_or_else(|| format!("an error: {answer}"))
}

/// The processes (other than this one) whose command line or environment names `root`.
pub fn processes_naming(root: &Path) -> Vec<String> {
    let wanted = root.as_os_str().as_encoded_bytes();
    let me = std::process::id();
    let mut found = Vec::new();
    for (pid, dir) in crate::support::procs::all() {
        if pid == me {
            continue;
        }
        let read = |what: &str| std::fs::read(dir.join(what)).unwrap_or_default();
        let (cmdline, environ) = (read("cmdline"), read("environ"));
        let names = |bytes: &[u8]| bytes.windows(wanted.len()).any(|w| w == wanted);
        // A zombie has neither; one of this test's own threads' children may be starting.
        if names(&cmdline) || names(&environ) {
            let shown = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push(format!("{pid}: {shown}"));
        }
    }
    found
}

/// xorshift64*: small, and the same sequence for the same seed on every machine.
pub struct Random(u64);

impl Random {
    /// From `CRASH_SEED`, else from the clock; printed so a failure can be replayed.
    pub fn seeded(step: &str) -> Random {
        let seed = std::env::var("CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("crash suite, {step}: seed {seed} (CRASH_SEED={seed} replays it)");
        Random(seed.max(1))
    }

    /// A sequence no one needs to replay (not printed).
    pub fn unprinted() -> Random {
        Random(0x9e37_79b9_7f4a_7c15)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

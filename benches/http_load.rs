//! `serve --http` under load, over loopback: 200 concurrent clients, each with its own session
//! of the 2025-11-25 protocol, calling `skills_list` (and `skills_read` of a SKILL.md) for a
//! bounded time against a workspace of 1,000 skills. p50, p99, throughput, errors and the
//! server's RSS (after warm-up and at the end), once over a reused connection per client and
//! once with a new connection per request; rounds interleaved, medians reported. The same
//! listing called in-process is the baseline.
//!
//! `cargo bench --bench http_load` (`LOAD_SECONDS`, `LOAD_CLIENTS`, `LOAD_ROUNDS` to change
//! the defaults of 5, 200 and 3).

#[path = "../tests/support/mod.rs"]
mod support;

// The server's allocator, so the load generator (on the same two cores) takes as little CPU
// from it as it can.
#[global_allocator]
static ALLOCATOR: cloud_harness_memory::Allocator = cloud_harness_memory::Allocator;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds (user and system) process `pid` used so far.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// One client's session: its HTTP/1.1 connection (kept, or made anew for every request) and
/// session id. The client is hyper's own connection, with no pool or middleware in front: the
/// load generator shares the server's two cores, and reqwest's layers took CPU the server then
/// lacked.
struct Session {
    /// `host:port` and the path of the server's MCP endpoint.
    addr: String,
    path: String,
    reuse: bool,
    connection: Option<Sender>,
    id: String,
}

/// The JSON-RPC answer in a response body (JSON, or an SSE `data:` line), as bytes: the load
/// generator neither validates nor copies the 51 KB pages it only checks by their ends.
fn answer(body: &[u8]) -> Option<&[u8]> {
    body.split(|&b| b == b'\n')
        .map(|l| l.strip_prefix(b"data: ").unwrap_or(l))
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .find(|l| l.starts_with(b"{"))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// An error with every cause under it (a client error alone may name only the request).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned()
}

/// What the load generator checks of an answer, in full: a whole JSON-RPC response, neither an
/// error nor a tool failure. Read without building it (the rest is skipped, not kept).
#[derive(serde::Deserialize)]
struct Checked {
    jsonrpc: serde::de::IgnoredAny,
    result: Option<CheckedResult>,
    error: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct CheckedResult {
    #[serde(rename = "isError", default)]
    is_error: bool,
}

/// Every this many answers of a client are parsed in full; the others are checked by their
/// two ends, which say whether the answer is this request's result and whole. The load
/// generator shares the server's two cores: parsing every 60 KB page took a third of its CPU
/// (`perf`), which the server then lacked.
const PARSE_EVERY: u64 = 16;

/// Whether `line` is a successful, whole answer to request `n`.
fn check(line: &[u8], n: u64) -> Result<(), String> {
    if n.is_multiple_of(PARSE_EVERY) {
        let checked: Checked = serde_json::from_slice(line).map_err(|e| e.to_string())?;
        let _ = checked.jsonrpc;
        return match checked.error.is_some() || checked.result.is_none_or(|r| r.is_error) {
            true => Err(shown(line)),
            false => Ok(()),
        };
    }
    // rmcp writes `jsonrpc`, `id`, then `result` (or `error`); a tool result ends with
    // `isError` (and `_meta` when there is one).
    let head = format!("{{\"jsonrpc\":\"2.0\",\"id\":{n},\"result\":{{");
    let tail = &line[line.len().saturating_sub(256)..];
    let ok = line.starts_with(head.as_bytes())
        && line.ends_with(b"}}")
        && contains(tail, b"\"isError\":false")
        && !contains(tail, b"\"isError\":true");
    match ok {
        true => Ok(()),
        false => Err(shown(line)),
    }
}

impl Session {
    /// A connection to send on: the kept one when it is still open, else a new one.
    async fn connection(&mut self) -> Result<&mut Sender, String> {
        if self.connection.as_ref().is_none_or(|c| c.is_closed()) {
            let tcp = tokio::net::TcpStream::connect(&self.addr)
                .await
                .map_err(|e| chain(&e))?;
            tcp.set_nodelay(true).map_err(|e| chain(&e))?;
            let (sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .map_err(|e| chain(&e))?;
            tokio::spawn(connection);
            self.connection = Some(sender);
        }
        let sender = self.connection.as_mut().expect("a connection");
        sender.ready().await.map_err(|e| chain(&e))?;
        Ok(sender)
    }

    async fn send(
        &mut self,
        method: hyper::Method,
        body: String,
        in_session: bool,
    ) -> Result<(Option<String>, bytes::Bytes), String> {
        use http_body_util::BodyExt;
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(&self.path)
            .header("Host", &self.addr)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2025-11-25");
        if in_session {
            request = request.header("Mcp-Session-Id", &self.id);
        }
        let request = request
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .map_err(|e| chain(&e))?;
        let response = self
            .connection()
            .await?
            .send_request(request)
            .await
            .map_err(|e| chain(&e))?;
        if !self.reuse {
            // A connection per request: this one ends with its answer (its task reads the rest
            // of the body, then closes the socket).
            self.connection = None;
        }
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let id = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| chain(&e))?
            .to_bytes();
        Ok((id, body))
    }

    async fn post(
        &mut self,
        body: &Value,
        in_session: bool,
    ) -> Result<(Option<String>, bytes::Bytes), String> {
        self.send(hyper::Method::POST, body.to_string(), in_session)
            .await
    }

    async fn start(url: &str, reuse: bool) -> Session {
        let url: hyper::Uri = url.parse().expect("the server's URL");
        let mut s = Session {
            addr: url.authority().expect("a host and port").to_string(),
            path: url.path().to_owned(),
            reuse,
            connection: None,
            id: String::new(),
        };
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "load", "version": "1"}}});
        let (id, _) = s.post(&init, false).await.unwrap();
        s.id = id.expect("a session id");
        s.post(
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            true,
        )
        .await
        .unwrap();
        s
    }

    /// Ends the session (as a well-behaved client does, freeing its place).
    async fn close(&mut self) {
        let _ = self.send(hyper::Method::DELETE, String::new(), true).await;
    }

    /// One tool call, checked; its answer, or why it failed.
    async fn call(
        &mut self,
        n: u64,
        tool: &str,
        arguments: &Value,
    ) -> Result<bytes::Bytes, String> {
        let body = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
        let (_, text) = self.post(&body, true).await?;
        let line = answer(&text).ok_or("no answer")?;
        check(line, n)?;
        Ok(text)
    }

    /// One tool call, its answer parsed.
    async fn call_value(&mut self, n: u64, tool: &str, arguments: &Value) -> Value {
        let text = self.call(n, tool, arguments).await.unwrap();
        serde_json::from_slice(answer(&text).unwrap()).unwrap()
    }
}

struct Outcome {
    latencies: Vec<Duration>,
    errors: usize,
    elapsed: Duration,
    rss_warm: f64,
    rss_end: f64,
    /// Cores the server and this load generator kept busy.
    server_cores: f64,
    client_cores: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn load(
    url: &str,
    pid: u32,
    clients: usize,
    seconds: u64,
    reuse: bool,
    tool: &str,
    arguments: Value,
) -> Outcome {
    let arguments = Arc::new(arguments);
    let mut sessions = Vec::new();
    for _ in 0..clients {
        sessions.push(Session::start(url, reuse).await);
    }
    let started = Instant::now();
    let (server_cpu, client_cpu) = (cpu_seconds(&pid.to_string()), cpu_seconds("self"));
    let deadline = started + Duration::from_secs(seconds);
    let warm_at = started + Duration::from_secs(seconds.min(2));
    let tasks: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            let (arguments, tool) = (arguments.clone(), tool.to_owned());
            tokio::spawn(async move {
                let (mut latencies, mut errors, mut n) = (Vec::new(), 0, 1);
                let mut first_error = None;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match s.call(n, &tool, &arguments).await {
                        Ok(_) => latencies.push(t.elapsed()),
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                    n += 1;
                }
                s.close().await;
                (latencies, errors, first_error)
            })
        })
        .collect();
    tokio::time::sleep_until(warm_at.into()).await;
    let rss_warm = rss_mib(pid);
    let mut outcome = Outcome {
        latencies: Vec::new(),
        errors: 0,
        elapsed: Duration::ZERO,
        rss_warm,
        rss_end: 0.0,
        server_cores: 0.0,
        client_cores: 0.0,
    };
    for t in tasks {
        let (l, e, first) = t.await.unwrap();
        outcome.latencies.extend(l);
        outcome.errors += e;
        if let Some(first) = first {
            // What went wrong is said, not only counted.
            eprintln!(
                "{tool}: an error: {}",
                first.chars().take(300).collect::<String>()
            );
        }
    }
    outcome.elapsed = started.elapsed();
    outcome.rss_end = rss_mib(pid);
    let wall = outcome.elapsed.as_secs_f64();
    outcome.server_cores = (cpu_seconds(&pid.to_string()) - server_cpu) / wall;
    outcome.client_cores = (cpu_seconds("self") - client_cpu) / wall;
    outcome.latencies.sort();
    outcome
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

fn main() {
    let seconds = env_or("LOAD_SECONDS", 5);
    let clients = env_or("LOAD_CLIENTS", 200) as usize;
    let rounds = env_or("LOAD_ROUNDS", 3) as usize;
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/load");
    for i in 0..1000 {
        let skill = src.join(format!("load-skill-{i:04}"));
        std::fs::create_dir_all(skill.join("references")).unwrap();
        std::fs::write(
            skill.join("SKILL.md"),
            format!("---\nname: load-skill-{i:04}\ndescription: Skill {i} under load.\n---\nBody of skill {i}.\n"),
        )
        .unwrap();
        std::fs::write(skill.join("references/notes.md"), format!("notes {i}")).unwrap();
    }
    let spec = support::warm_toolkit(&store, &src, "load");

    let mut server: Child = Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--no-mount",
            "--auth",
            "none",
        ])
        .env("TOOLKIT_CACHE_ROOT", store.root())
        .env("CLOUD_HARNESS_HOME", tmp.path().join("home"))
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        .env("CLOUD_HARNESS_CONTAINERS", "off")
        .env("ALLOWED_GIT_HOSTS", support::WARM_HOST)
        // One machine plays all 200 clients, as one principal (`--auth none`): its quotas
        // are raised past what the load asks, so the checks are paid for but never bind.
        .env("CLOUD_HARNESS_LIMIT_SESSIONS", "1000")
        .env("CLOUD_HARNESS_LIMIT_REQUESTS_PER_SECOND", "10000000")
        .env("CLOUD_HARNESS_LIMIT_REQUESTS_IN_FLIGHT", "100000")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    let url = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve ended");
        if let Some(rest) = line.split("at http://").nth(1) {
            break format!("http://{}", rest.trim());
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let pid = server.id();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let workspace = runtime.block_on(async {
        let mut s = Session::start(&url, true).await;
        let spec = serde_json::to_value(&spec).unwrap();
        let opened = s
            .call_value(
                PARSE_EVERY,
                "workspace_open",
                &json!({"idempotencyKey": "load", "toolkits": [spec]}),
            )
            .await;
        opened["result"]["structuredContent"]["workspace"]
            .as_str()
            .unwrap()
            .to_owned()
    });

    // The baseline: the same page in-process, no HTTP.
    let workspaces = cloud_harness_workspace::Workspaces::with_executors(
        tmp.path().join("baseline-home"),
        support::warm_provisioner(&store),
        false,
        cloud_harness_executor::Settings::with_kind(cloud_harness_executor::Kind::Host),
    )
    .unwrap();
    let baseline_ws = workspaces
        .open(cloud_harness_workspace::OpenRequest {
            repository_url: None,
            idempotency_key: "baseline".into(),
            toolkits: vec![spec.clone()],
            allow_toolkit_workspace_changes: false,
            idle_pause: true,
        })
        .unwrap();
    let ws = workspaces
        .get(baseline_ws["workspace"].as_str().unwrap())
        .unwrap();
    let mut direct: Vec<Duration> = (0..50)
        .map(|_| {
            let t = Instant::now();
            let listing = ws.list_page(None, false, None, 100);
            assert_eq!(listing["count"], 100);
            t.elapsed()
        })
        .collect();
    direct.sort();

    let calls = [
        ("skills_list", json!({"workspace": workspace})),
        (
            "skills_read",
            json!({"workspace": workspace, "skill": "load-skill-0500"}),
        ),
    ];
    println!(
        "{clients} clients, {seconds} s a run, {rounds} rounds interleaved, a workspace of 1,003 skills (medians over rounds)"
    );
    let sizes = runtime.block_on(async {
        let mut s = Session::start(&url, true).await;
        let mut sizes = Vec::new();
        for (tool, args) in &calls {
            sizes.push(s.call(PARSE_EVERY, tool, args).await.unwrap().len());
        }
        s.close().await;
        sizes
    });
    println!(
        "an answer on the wire: skills_list {:.1} KB, skills_read {:.1} KB",
        sizes[0] as f64 / 1e3,
        sizes[1] as f64 / 1e3
    );
    println!(
        "in-process skills_list (baseline): p50 {:.2} ms, p99 {:.2} ms",
        percentile(&direct, 0.5).as_secs_f64() * 1e3,
        percentile(&direct, 0.99).as_secs_f64() * 1e3
    );
    let mut figures: Vec<Vec<[f64; 8]>> = vec![Vec::new(); 4];
    for _ in 0..rounds {
        for (m, (reuse, (tool, args))) in [true, false]
            .iter()
            .flat_map(|r| calls.iter().map(move |c| (*r, c)))
            .enumerate()
        {
            let o = runtime.block_on(load(&url, pid, clients, seconds, reuse, tool, args.clone()));
            let n = o.latencies.len().max(1);
            figures[m].push([
                percentile(&o.latencies, 0.5).as_secs_f64() * 1e3,
                percentile(&o.latencies, 0.99).as_secs_f64() * 1e3,
                n as f64 / o.elapsed.as_secs_f64(),
                o.errors as f64,
                o.rss_warm,
                o.rss_end,
                o.server_cores,
                o.client_cores,
            ]);
        }
    }
    for (m, (reuse, (tool, _))) in [true, false]
        .iter()
        .flat_map(|r| calls.iter().map(move |c| (*r, c)))
        .enumerate()
    {
        let col = |i: usize| median(figures[m].iter().map(|f| f[i]).collect());
        println!(
            "{tool:<11} {:<22} p50 {:>7.2} ms  p99 {:>7.2} ms  {:>7.0} calls/s  errors {:>3}  RSS {:.0} -> {:.0} MiB  cores: server {:.2}, load {:.2}",
            if reuse { "reused connection" } else { "connection per call" },
            col(0),
            col(1),
            col(2),
            col(3),
            col(4),
            col(5),
            col(6),
            col(7)
        );
    }
    let _ = server.kill();
    let _ = server.wait();
}

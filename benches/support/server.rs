//! A `serve --http` process for a bench, and a small MCP client of it over Streamable HTTP.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running server, ended (killed) when dropped: a bench that ends early (a panic) leaves
/// none running.
pub struct Server {
    pub child: Child,
    /// The MCP endpoint, `http://127.0.0.1:PORT/mcp`.
    pub url: String,
}

impl Server {
    /// `serve --http 127.0.0.1:0 --auth none` on `store` and `home`, with a bubblewrap
    /// executor, no helper containers, and `env` on top. One machine plays every client, as
    /// one principal: its quotas are lifted so they never bind.
    pub fn start(store: &Path, home: &Path, env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cloud-harness"));
        command
            .args(["serve", "--http", "127.0.0.1:0", "--auth", "none"])
            .env("TOOLKIT_CACHE_ROOT", store)
            .env("CLOUD_HARNESS_HOME", home)
            .env("CLOUD_HARNESS_EXECUTOR", "bwrap")
            .env("CLOUD_HARNESS_CONTAINERS", "off")
            .env("CLOUD_HARNESS_STANDBY_HELPERS", "0")
            .env("CLOUD_HARNESS_MIN_FREE_MIB", "1")
            .env("ALLOWED_GIT_HOSTS", crate::support::WARM_HOST)
            .env("CLOUD_HARNESS_LIMIT_SESSIONS", "100000")
            .env("CLOUD_HARNESS_LIMIT_WORKSPACES", "100000")
            .env("CLOUD_HARNESS_LIMIT_REQUESTS_PER_SECOND", "10000000")
            .env("CLOUD_HARNESS_LIMIT_REQUESTS_IN_FLIGHT", "100000")
            .env("CLOUD_HARNESS_LIMIT_RUNS", "1000")
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("start cloud-harness serve");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let url = loop {
            line.clear();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "serve ended");
            if let Some(rest) = line.split("at http://").nth(1) {
                break format!("http://{}", rest.trim());
            }
        };
        // The server's log, kept where BENCH_SERVER_LOG says (else dropped).
        let log: Box<dyn std::io::Write + Send> = match std::env::var_os("BENCH_SERVER_LOG") {
            Some(path) => Box::new(std::fs::File::create(path).expect("the server log")),
            None => Box::new(std::io::sink()),
        };
        std::thread::spawn(move || {
            let mut log = log;
            std::io::copy(&mut stderr, &mut log)
        });
        Server { child, url }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The operator API's base, `http://127.0.0.1:PORT/api/v1`.
    pub fn api(&self) -> String {
        format!("{}/api/v1", self.url.trim_end_matches("/mcp"))
    }

    /// SIGTERM, then waits up to `wait`: whether the server exited cleanly in time (if not,
    /// it is killed when dropped).
    pub fn stop(mut self, wait: Duration) -> bool {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + wait;
        while std::time::Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => return false,
            }
        }
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An error with every cause under it: reqwest's own message alone ("error sending
/// request") does not say whether the connection was refused, reset or closed.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// An MCP client: each call one POST, its answer read from JSON or the SSE stream.
pub struct Mcp {
    pub url: String,
    pub http: reqwest::blocking::Client,
}

impl Mcp {
    /// A client keeping up to `connections` idle connections.
    pub fn new(url: &str, connections: usize) -> Mcp {
        let http = reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(120))
            .pool_max_idle_per_host(connections)
            // The server closes a connection idle for 10 s (`HEADER_TIMEOUT`): one kept
            // longer may be reused just as it closes, and the call fails unsent.
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        Mcp {
            url: url.to_owned(),
            http,
        }
    }

    pub fn post(
        &self,
        session: Option<&str>,
        body: &Value,
    ) -> Result<(Option<String>, Value), String> {
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
        let response = r.send().map_err(|e| with_causes(&e))?;
        let id = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        let text = response.text().map_err(|e| with_causes(&e))?;
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

    pub fn session(&self) -> Result<String, String> {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}});
        let (id, _) = self.post(None, &init)?;
        let id = id.ok_or("no session id")?;
        self.post(
            Some(&id),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )?;
        Ok(id)
    }

    /// A tool call's result; an error for a transport failure or `isError`.
    pub fn tool(&self, session: &str, name: &str, args: Value) -> Result<Value, String> {
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

    /// Runs `args` by `skills_run`, approving the script's digest first if the server asks
    /// for an approval (as an operator would, once).
    pub fn run_approved(&self, api: &str, session: &str, args: &Value) -> Result<Value, String> {
        match self.tool(session, "skills_run", args.clone()) {
            Ok(r) => Ok(r),
            Err(e) => {
                let digest = e
                    .split("\"digest\":\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .ok_or_else(|| format!("skills_run: {e}"))?;
                let approval = json!({"digest": digest, "skill": args["skill"], "reason": "the bench's own script"});
                let r = self
                    .http
                    .post(format!("{api}/approvals"))
                    .header("Content-Type", "application/json")
                    .body(approval.to_string())
                    .send()
                    .map_err(|e| e.to_string())?;
                if !r.status().is_success() {
                    return Err(format!("approval: {}", r.text().unwrap_or_default()));
                }
                self.tool(session, "skills_run", args.clone())
            }
        }
    }
}

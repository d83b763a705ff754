//! A `serve --http` that checks tokens, as the control plane's tests use it: its first-start
//! operator token, an HTTP client of its API, its CLI, MCP calls with a bearer token.

use super::http::{answer_of, raw, server_in, Server};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

/// A server that checks tokens (the default), its first-start operator token, and the CLI's
/// environment for its home.
pub struct World {
    pub server: Server,
    pub operator: String,
    pub http: reqwest::blocking::Client,
}

pub fn world_with(tmp: tempfile::TempDir, env: &[(&str, &str)]) -> World {
    world_of(server_in(tmp, &[], env))
}

/// A world whose github.com is the local HTTPS git server `git` (by a URL rewrite, the
/// server's host allowed, loopback let through the egress proxy); no executor.
pub fn github_world(tmp: tempfile::TempDir, git: &super::GitServer, certs: &super::Certs) -> World {
    let ca = certs.ca.display().to_string();
    let rewrite = format!("https://github.com/={}", git.url(""));
    world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", &git.host()),
            ("CLOUD_HARNESS_EXTRA_CA", &ca),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
            ("CLOUD_HARNESS_URL_REWRITE", &rewrite),
        ],
    )
}

/// A world of a server already started (that checks tokens).
pub fn world_of(server: Server) -> World {
    let operator = first_token(&server.tmp.path().join("home"), &server.log);
    World {
        server,
        operator,
        http: reqwest::blocking::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
    }
}

/// The operator token a server's first start left in `<home>/operator-token` (its first
/// line), waited for; the log names the file and never holds the token.
pub fn first_token(home: &std::path::Path, log: &std::sync::Mutex<String>) -> String {
    let file = home.join("operator-token");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if log.lock().unwrap().contains("first start") {
            let text = std::fs::read_to_string(&file).unwrap();
            let token = text.lines().next().unwrap_or_default().to_owned();
            assert!(token.starts_with("cht_"), "{}: {text}", file.display());
            return token;
        }
        assert!(
            Instant::now() < deadline,
            "no first-start token: {}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server whose store holds warm toolkits only (no executor, no helper containers, the
/// warm toolkits' host allowed), its store and home in `tmp`.
pub fn warm_world(tmp: tempfile::TempDir) -> World {
    world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", super::WARM_HOST),
        ],
    )
}

pub fn world() -> World {
    world_with(
        tempfile::tempdir().unwrap(),
        &[("CLOUD_HARNESS_EXECUTOR", "none")],
    )
}

impl World {
    /// An MCP session of the operator's.
    pub fn session(&self) -> String {
        mcp_session(self.server.addr, &self.operator)
    }

    /// A tool call in `session`, as the operator.
    pub fn tool(&self, session: &str, name: &str, args: Value) -> Value {
        tool(self.server.addr, &self.operator, session, name, args)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr)
    }

    pub fn home(&self) -> std::path::PathBuf {
        self.server.tmp.path().join("home")
    }

    /// A request with a bearer token (or none); the status and the JSON answer.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value) {
        let mut r = self
            .http
            .request(method.parse().unwrap(), self.url(path))
            .header("Content-Type", "application/json");
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r.body(b.to_owned());
        }
        let response = r.send().unwrap();
        let status = response.status().as_u16();
        let text = response.text().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A new `client` token named `name`: its secret.
    pub fn client(&self, name: &str) -> String {
        self.op(
            "POST",
            "/api/v1/tokens",
            Some(serde_json::json!({"name": name, "role": "client"})),
        )["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    pub fn op(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let (status, v) = self.call(method, path, Some(&self.operator), body.as_deref());
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {v}"
        );
        v
    }

    /// `/metrics`, as the operator reads it.
    pub fn metrics(&self) -> String {
        let r = self
            .http
            .get(self.url("/metrics"))
            .bearer_auth(&self.operator)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        r.text().unwrap()
    }

    /// The CLI on this server's home; its exit code and output.
    pub fn cli(&self, args: &[&str]) -> (i32, String) {
        self.cli_with(args, &[])
    }

    /// The CLI on this server's home, with more of the environment.
    pub fn cli_with(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
        let out = Command::new(BIN)
            .args(args)
            .envs(env.iter().copied())
            .env("CLOUD_HARNESS_HOME", self.home())
            .env("TOOLKIT_CACHE_ROOT", self.server.tmp.path().join("store"))
            .envs(self.server.database_env())
            .output()
            .unwrap();
        super::code_and_output(out)
    }

    /// This server's state database, opened as another process would.
    pub fn state(&self) -> cloud_harness_control::state::Db {
        match &self.server.database {
            Some(d) => cloud_harness_control::state::Db::connect(&d.url(), &self.home()).unwrap(),
            None => cloud_harness_control::state::Db::open_sqlite(&self.home()).unwrap(),
        }
    }

    pub fn audit_actions(&self) -> Vec<String> {
        let v = self.op("GET", "/api/v1/audit?limit=1000", None);
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// An MCP session of the 2025-11-25 protocol with a bearer token; its id.
pub fn mcp_session(addr: SocketAddr, token: &str) -> String {
    super::http::legacy_session_with(addr, &[("Authorization", &format!("Bearer {token}"))])
}

/// A tool call in `session`; its result (`isError` and `structuredContent`).
pub fn tool(addr: SocketAddr, token: &str, session: &str, name: &str, args: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": args}});
    let auth = format!("Bearer {token}");
    let answer = raw(
        addr,
        &body.to_string(),
        &[("Mcp-Session-Id", session), ("Authorization", &auth)],
    );
    answer_of(&answer)["result"].clone()
}

/// Two warm toolkits that both bring `dup` to the owner tier, differently, and one whose
/// skill has a script.
pub fn conflicting_kits(tmp: &tempfile::TempDir) -> (Value, Value, Value) {
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let make = |name: &str, body: &str| {
        let src = tmp.path().join("src").join(name);
        super::materialize(&src, &super::dir(vec![("dup", super::skill("dup", body))]));
        serde_json::to_value(super::warm_toolkit(&store, &src, name)).unwrap()
    };
    let one = make("one", "One's copy.");
    let two = make("two", "Two's copy.");
    let src = tmp.path().join("src/scripted");
    super::materialize(
        &src,
        &super::dir(vec![(
            "alpha",
            super::dir(vec![
                (
                    "SKILL.md",
                    super::file(
                        "---\nname: alpha\ndescription: Says hello.\n---\nRun scripts/hello.sh.\n",
                    ),
                ),
                (
                    "scripts",
                    super::dir(vec![(
                        "hello.sh",
                        super::Node::Exec(b"#!/bin/sh\necho hello from alpha\n".to_vec()),
                    )]),
                ),
            ]),
        )]),
    );
    let scripted = serde_json::to_value(super::warm_toolkit(&store, &src, "scripted")).unwrap();
    (one, two, scripted)
}

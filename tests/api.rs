//! The control plane's HTTP API and who may call it, against a real `serve --http` on
//! loopback: tokens and roles, browser sessions with their origin and CSRF checks, decisions
//! that change what opens and what runs, the audit log, bad input.

mod support;

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};
use support::http::{answer_of, raw, server_in, Server};
use support::{dir, file, skill};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

/// A server that checks tokens (the default), its first-start operator token, and the CLI's
/// environment for its home.
struct World {
    server: Server,
    operator: String,
    http: reqwest::blocking::Client,
}

fn world_with(tmp: tempfile::TempDir, env: &[(&str, &str)]) -> World {
    let server = server_in(tmp, &[], env);
    let deadline = Instant::now() + Duration::from_secs(10);
    let operator = loop {
        let log = server.log.lock().unwrap().clone();
        if let Some(t) = log.split_whitespace().find(|w| w.starts_with("cht_")) {
            break t.to_owned();
        }
        assert!(Instant::now() < deadline, "no first-start token: {log}");
        std::thread::sleep(Duration::from_millis(20));
    };
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

fn world() -> World {
    world_with(
        tempfile::tempdir().unwrap(),
        &[("CLOUD_HARNESS_EXECUTOR", "none")],
    )
}

impl World {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr)
    }

    fn home(&self) -> std::path::PathBuf {
        self.server.tmp.path().join("home")
    }

    /// A request with a bearer token (or none); the status and the JSON answer.
    fn call(
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

    fn op(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let (status, v) = self.call(method, path, Some(&self.operator), body.as_deref());
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {v}"
        );
        v
    }

    /// The CLI on this server's home; its exit code and output.
    fn cli(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new(BIN)
            .args(args)
            .env("CLOUD_HARNESS_HOME", self.home())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn audit_actions(&self) -> Vec<String> {
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
fn mcp_session(addr: SocketAddr, token: &str) -> String {
    let auth = format!("Bearer {token}");
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"api-test","version":"1"}}}"#;
    let answer = raw(addr, init, &[("Authorization", &auth)]);
    let session = answer
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session: {answer}"));
    raw(
        addr,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        &[("Mcp-Session-Id", &session), ("Authorization", &auth)],
    );
    session
}

/// A tool call in `session`; its result (`isError` and `structuredContent`).
fn tool(addr: SocketAddr, token: &str, session: &str, name: &str, args: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": args}});
    let auth = format!("Bearer {token}");
    let answer = raw(
        addr,
        &body.to_string(),
        &[("Mcp-Session-Id", session), ("Authorization", &auth)],
    );
    answer_of(&answer)["result"].clone()
}

#[test]
fn callers_without_a_valid_token_are_refused_and_a_client_token_cannot_write() {
    let w = world();
    // No token: 401 with a challenge, for the API and for MCP alike.
    let response = w.http.get(w.url("/api/v1/whoami")).send().unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(
        response.headers()["www-authenticate"],
        "Bearer realm=\"cloud-harness\""
    );
    let v: Value = serde_json::from_str(&response.text().unwrap()).unwrap();
    assert_eq!(v["code"], "UNAUTHENTICATED");
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#;
    assert!(raw(w.server.addr, init, &[]).starts_with("HTTP/1.1 401"));
    assert!(raw(
        w.server.addr,
        init,
        &[("Authorization", "Bearer cht_not-a-token")]
    )
    .starts_with("HTTP/1.1 401"));
    assert_eq!(
        w.call("GET", "/api/v1/whoami", Some("cht_wrong"), None).0,
        401
    );

    // The operator makes a client token; the client may call MCP and read, not write.
    let made = w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "agent-platform", "role": "client"})),
    );
    let client = made["token"].as_str().unwrap().to_owned();
    assert_eq!(made["role"], "client");
    let session = mcp_session(w.server.addr, &client);
    let opened = tool(
        w.server.addr,
        &client,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "k1"}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    assert_eq!(
        w.call("GET", "/api/v1/approvals", Some(&client), None).0,
        200
    );
    assert_eq!(
        w.call("GET", "/api/v1/workspaces", Some(&client), None).0,
        200
    );
    let digest = format!("sha256:{}", "ab".repeat(32));
    let (status, v) = w.call(
        "POST",
        "/api/v1/approvals",
        Some(&client),
        Some(&json!({"digest": digest}).to_string()),
    );
    assert_eq!(
        (status, v["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "{v}"
    );
    assert_eq!(w.call("GET", "/api/v1/tokens", Some(&client), None).0, 403);
    assert_eq!(w.call("GET", "/api/v1/audit", Some(&client), None).0, 403);
    assert_eq!(
        w.op("GET", "/api/v1/approvals", None)["approvals"],
        json!([])
    );

    // Revoked through the API: refused at once, MCP included.
    w.op("DELETE", "/api/v1/tokens/agent-platform", None);
    assert_eq!(w.call("GET", "/api/v1/whoami", Some(&client), None).0, 401);
    let listed = tool_status(w.server.addr, &client, &session);
    assert_eq!(listed, 401);
    let tokens = w.op("GET", "/api/v1/tokens", None);
    let revoked = tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "agent-platform")
        .unwrap();
    assert!(revoked["revokedAt"].is_i64(), "{tokens}");
    assert!(
        !tokens.to_string().contains(&client),
        "a listing shows no secret"
    );
    let actions = w.audit_actions();
    assert!(
        actions.contains(&"token.create".to_owned())
            && actions.contains(&"token.revoke".to_owned()),
        "{actions:?}"
    );
}

/// The HTTP status of a `tools/list` in `session` with `token`.
fn tool_status(addr: SocketAddr, token: &str, session: &str) -> u16 {
    let auth = format!("Bearer {token}");
    let answer = raw(
        addr,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
        &[("Mcp-Session-Id", session), ("Authorization", &auth)],
    );
    answer.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_token_made_and_revoked_with_the_cli_works_and_stops_working() {
    let w = world();
    let (code, out) = w.cli(&[
        "token",
        "create",
        "--name",
        "ci-runner",
        "--role",
        "operator",
    ]);
    assert_eq!(code, 0, "{out}");
    let made: Value = serde_json::from_str(&out).unwrap();
    let token = made["token"].as_str().unwrap().to_owned();
    let me = w.call("GET", "/api/v1/whoami", Some(&token), None);
    assert_eq!(me.0, 200);
    assert_eq!(me.1["actor"], "token:ci-runner");
    // A second token of that name is refused, and the first stays valid.
    let (code, out) = w.cli(&["token", "create", "--name", "ci-runner"]);
    assert_ne!(code, 0);
    assert!(out.contains("CONFLICT"), "{out}");
    let (code, out) = w.cli(&["token", "create", "--name", "../evil", "--role", "client"]);
    assert_ne!(code, 0);
    assert!(out.contains("INVALID_ARGUMENT"), "{out}");
    let (code, out) = w.cli(&["token", "revoke", "ci-runner"]);
    assert_eq!(code, 0, "{out}");
    // Another process revoked it: this one stops taking it within its one-second cache.
    let deadline = Instant::now() + Duration::from_secs(5);
    while w.call("GET", "/api/v1/whoami", Some(&token), None).0 != 401 {
        assert!(Instant::now() < deadline, "a revoked token still works");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, out) = w.cli(&["audit", "--action", "token.revoke"]);
    assert!(
        out.contains("token:ci-runner") && out.contains("cli:"),
        "{out}"
    );
}

#[test]
fn a_browser_session_writes_only_from_its_origin_with_its_csrf_token() {
    let w = world();
    let origin = format!("http://{}", w.server.addr);
    let (code, link) = w.cli(&["token", "login-url", "--url", &origin]);
    assert_eq!(code, 0, "{link}");
    let link = link.trim().to_owned();
    let response = w.http.get(&link).send().unwrap();
    assert_eq!(response.status().as_u16(), 303);
    let set_cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"),
        "{set_cookie}"
    );
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    // The link works once.
    assert_eq!(w.http.get(&link).send().unwrap().status().as_u16(), 401);

    let get = |path: &str| {
        w.http
            .get(w.url(path))
            .header("Cookie", &cookie)
            .send()
            .unwrap()
    };
    let me: Value = serde_json::from_str(&get("/api/v1/whoami").text().unwrap()).unwrap();
    assert_eq!(me["role"], "operator");
    let csrf = me["csrfToken"].as_str().unwrap().to_owned();
    let post = |origin: Option<&str>, csrf: Option<&str>| {
        let mut r = w
            .http
            .post(w.url("/api/v1/tokens"))
            .header("Cookie", &cookie)
            .header("Content-Type", "application/json")
            .body(json!({"name": "from-browser", "role": "client"}).to_string());
        if let Some(o) = origin {
            r = r.header("Origin", o);
        }
        if let Some(c) = csrf {
            r = r.header("X-CSRF-Token", c);
        }
        r.send().unwrap().status().as_u16()
    };
    assert_eq!(post(Some("http://evil.example"), Some(&csrf)), 403);
    assert_eq!(post(None, Some(&csrf)), 403);
    assert_eq!(post(Some(&origin), None), 403);
    assert_eq!(post(Some(&origin), Some("not-the-token")), 403);
    assert!(!w
        .op("GET", "/api/v1/tokens", None)
        .to_string()
        .contains("from-browser"));
    assert_eq!(post(Some(&origin), Some(&csrf)), 201);
    // Signing out ends the session.
    let out = w
        .http
        .post(w.url("/logout"))
        .header("Cookie", &cookie)
        .header("Origin", &origin)
        .header("X-CSRF-Token", &csrf)
        .send()
        .unwrap();
    assert_eq!(out.status().as_u16(), 204);
    assert_eq!(get("/api/v1/whoami").status().as_u16(), 401);
}

#[test]
fn auth_none_is_refused_off_loopback() {
    // Refused before anything binds; in a network namespace of its own all the same.
    let out = Command::new("unshare")
        .args([
            "-n",
            BIN,
            "serve",
            "--http",
            "0.0.0.0:0",
            "--auth",
            "none",
            "--no-mount",
        ])
        .env("CLOUD_HARNESS_HOME", tempfile::tempdir().unwrap().path())
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    if text.contains("unshare failed") && std::env::var_os("CI").is_none() {
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("--auth none") && text.contains("loopback"),
        "{text}"
    );
}

#[test]
fn bad_input_to_the_api_is_a_typed_error_and_stores_nothing() {
    let w = world();
    let long = "x".repeat(2000);
    let cases: Vec<(&str, &str, String, &str)> = vec![
        (
            "POST",
            "/api/v1/tokens",
            "not json".into(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/tokens",
            json!({"name": "a", "role": "root"}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/tokens",
            json!({"name": "a b", "role": "client"}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/tokens",
            json!({"name": 7, "role": "client"}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/tokens",
            json!({"name": "a", "role": "client", "admin": true}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/approvals",
            json!({"digest": "sha256:xyz"}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/approvals",
            json!({"digest": format!("sha256:{}", "a".repeat(64)), "reason": long}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/approvals",
            json!({"digest": format!("sha256:{}", "a".repeat(64)), "skill": "../etc"}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/overrides",
            json!({"skill": "Bad_Name", "source": "owner:x"}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/overrides",
            json!({"skill": "ok", "source": "a\u{0}b"}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/api/v1/overrides",
            json!({"skill": "ok"}).to_string(),
            "INVALID_ARGUMENT",
        ),
        (
            "DELETE",
            "/api/v1/approvals/apr_0000",
            String::new(),
            "NOT_FOUND",
        ),
        (
            "DELETE",
            "/api/v1/overrides/apr_0000",
            String::new(),
            "NOT_FOUND",
        ),
        (
            "DELETE",
            "/api/v1/tokens/nobody",
            String::new(),
            "NOT_FOUND",
        ),
        (
            "GET",
            "/api/v1/audit?limit=0",
            String::new(),
            "INVALID_ARGUMENT",
        ),
        (
            "GET",
            "/api/v1/audit?cursor=bogus",
            String::new(),
            "INVALID_ARGUMENT",
        ),
        (
            "GET",
            "/api/v1/audit?colour=red",
            String::new(),
            "INVALID_ARGUMENT",
        ),
        ("GET", "/api/v1/nothing-here", String::new(), "NOT_FOUND"),
    ];
    let before = (
        w.op("GET", "/api/v1/tokens", None),
        w.op("GET", "/api/v1/approvals", None),
        w.op("GET", "/api/v1/overrides", None),
    );
    for (method, path, body, code) in &cases {
        let (status, v) = w.call(
            method,
            path,
            Some(&w.operator),
            (!body.is_empty()).then_some(body.as_str()),
        );
        assert_eq!(v["code"], *code, "{method} {path} {body}: {status} {v}");
        assert_eq!(v["status"], status, "{v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    // A body past the limit is refused whole.
    let (status, _) = w.call(
        "POST",
        "/api/v1/tokens",
        Some(&w.operator),
        Some(&"x".repeat(100 << 10)),
    );
    assert_eq!(status, 413);
    let after = (
        w.op("GET", "/api/v1/tokens", None),
        w.op("GET", "/api/v1/approvals", None),
        w.op("GET", "/api/v1/overrides", None),
    );
    assert_eq!(before, after, "a refused request stored something");
    let doc = w.op("GET", "/api/v1/openapi.json", None);
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/api/v1/tokens",
        "/api/v1/approvals",
        "/api/v1/overrides",
        "/api/v1/audit",
        "/api/v1/workspaces",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is not documented");
    }
}

/// Two warm toolkits that both bring `dup` to the owner tier, differently, and one whose
/// skill has a script.
fn conflicting_store(tmp: &tempfile::TempDir) -> (Value, Value, Value) {
    let store = cloud_harness_fs::cas::Store::open(tmp.path().join("store")).unwrap();
    let make = |name: &str, body: &str| {
        let src = tmp.path().join("src").join(name);
        support::materialize(&src, &dir(vec![("dup", skill("dup", body))]));
        serde_json::to_value(support::warm_toolkit(&store, &src, name)).unwrap()
    };
    let one = make("one", "One's copy.");
    let two = make("two", "Two's copy.");
    let src = tmp.path().join("src/scripted");
    support::materialize(
        &src,
        &dir(vec![(
            "alpha",
            dir(vec![
                (
                    "SKILL.md",
                    file(
                        "---\nname: alpha\ndescription: Says hello.\n---\nRun scripts/hello.sh.\n",
                    ),
                ),
                (
                    "scripts",
                    dir(vec![(
                        "hello.sh",
                        support::Node::Exec(b"#!/bin/sh\necho hello from alpha\n".to_vec()),
                    )]),
                ),
            ]),
        )]),
    );
    let scripted = serde_json::to_value(support::warm_toolkit(&store, &src, "scripted")).unwrap();
    (one, two, scripted)
}

#[test]
fn an_override_through_the_api_settles_a_conflict_and_an_open_then_serves_the_winner() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two, _) = conflicting_store(&tmp);
    let w = world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
        ],
    );
    let session = mcp_session(w.server.addr, &w.operator);
    let request = json!({"idempotencyKey": "conflict", "toolkits": [one, two]});
    let refused = tool(
        w.server.addr,
        &w.operator,
        &session,
        "workspace_open",
        request.clone(),
    );
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(
        refused["structuredContent"]["code"], "CONFLICT",
        "{refused}"
    );
    // Nothing of the refused open stays: the same key may open once the conflict is settled.
    w.op(
        "POST",
        "/api/v1/overrides",
        Some(json!({"skill": "dup", "source": "owner:two", "reason": "two's is current"})),
    );
    let opened = tool(
        w.server.addr,
        &w.operator,
        &session,
        "workspace_open",
        request,
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let read = tool(
        w.server.addr,
        &w.operator,
        &session,
        "skills_read",
        json!({"workspace": ws, "skill": "dup"}),
    );
    assert!(
        read["structuredContent"]["content"]
            .as_str()
            .unwrap()
            .contains("Two's copy."),
        "{read}"
    );
    let overrides = w.op("GET", "/api/v1/overrides", None);
    let o = &overrides["overrides"][0];
    assert_eq!(
        (
            o["skill"].as_str(),
            o["source"].as_str(),
            o["actor"].as_str()
        ),
        (Some("dup"), Some("owner:two"), Some("token:operator"))
    );
    // Moving it supersedes the first; both stay in the history.
    w.op(
        "POST",
        "/api/v1/overrides",
        Some(json!({"skill": "dup", "source": "owner:one"})),
    );
    let all = w.op("GET", "/api/v1/overrides?revoked=true", None);
    assert_eq!(all["overrides"].as_array().unwrap().len(), 2, "{all}");
    assert_eq!(
        w.op("GET", "/api/v1/overrides", None)["overrides"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert!(
        w.audit_actions()
            .iter()
            .filter(|a| *a == "override.set")
            .count()
            == 2
    );
}

#[test]
fn an_approval_through_the_api_lets_a_script_run_and_its_revocation_stops_it() {
    if !support::executor_backend("bwrap") {
        assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, _, scripted) = conflicting_store(&tmp);
    let w = world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
        ],
    );
    let made = w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "agent", "role": "client"})),
    );
    let client = made["token"].as_str().unwrap().to_owned();
    let session = mcp_session(w.server.addr, &client);
    let opened = tool(
        w.server.addr,
        &client,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "runs", "toolkits": [scripted]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = || {
        tool(
            w.server.addr,
            &client,
            &session,
            "skills_run",
            json!({"workspace": ws, "skill": "alpha", "script": "scripts/hello.sh"}),
        )
    };
    let refused = run();
    assert_eq!(
        refused["structuredContent"]["code"], "FORBIDDEN",
        "{refused}"
    );
    let digest = refused["structuredContent"]["details"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    // The refusal waits for the operator, with what it asked to run.
    let pending = w.op("GET", "/api/v1/approvals/pending", None);
    assert_eq!(pending["pending"][0]["digest"], digest, "{pending}");
    assert_eq!(pending["pending"][0]["script"], "scripts/hello.sh");
    let approval = w.op(
        "POST",
        "/api/v1/approvals",
        Some(json!({"digest": digest, "skill": "alpha", "reason": "read it"})),
    );
    let ran = run();
    assert_eq!(ran["isError"], false, "{ran}");
    assert!(
        ran["structuredContent"]["stdout"]
            .as_str()
            .unwrap()
            .contains("hello from alpha"),
        "{ran}"
    );
    assert_eq!(
        w.op("GET", "/api/v1/approvals/pending", None)["pending"],
        json!([])
    );
    w.op(
        "DELETE",
        &format!(
            "/api/v1/approvals/{}?reason=done",
            approval["id"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(run()["structuredContent"]["code"], "FORBIDDEN");
    let audit = w.op("GET", "/api/v1/audit?limit=1000", None);
    let entries = audit["entries"].as_array().unwrap();
    let by = |action: &str| {
        entries
            .iter()
            .filter(|e| e["action"] == action)
            .collect::<Vec<_>>()
    };
    assert_eq!(by("run.refused").len(), 2, "{audit}");
    assert_eq!(by("run.refused")[0]["actor"], "token:agent");
    assert_eq!(by("approval.grant")[0]["actor"], "token:operator");
    assert_eq!(by("approval.revoke").len(), 1);
    // Filtered and paged: newest first, a cursor to the rest.
    let page = w.op("GET", "/api/v1/audit?limit=2", None);
    assert_eq!(page["entries"].as_array().unwrap().len(), 2);
    let next = page["nextCursor"].as_str().unwrap();
    let rest = w.op(
        "GET",
        &format!("/api/v1/audit?limit=1000&cursor={next}"),
        None,
    );
    assert_eq!(rest["entries"].as_array().unwrap().len() + 2, entries.len());
    let mine = w.op("GET", "/api/v1/audit?actor=token:agent", None);
    assert!(mine["entries"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["actor"] == "token:agent"));
}

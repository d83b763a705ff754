//! Who may call the control plane's HTTP API and MCP, against a real `serve --http` on
//! loopback: tokens and roles, browser sessions with their origin and CSRF checks, bad input.

use crate::support;

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};
use support::api::{mcp_session, tool, world, BIN};
use support::http::raw;

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
        set_cookie.starts_with("__Host-")
            && set_cookie.contains("HttpOnly")
            && set_cookie.contains("Secure")
            && set_cookie.contains("SameSite=Strict")
            && set_cookie.contains("Path=/")
            && !set_cookie.contains("Domain"),
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
    assert_eq!(out.status().as_u16(), 303);
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
    // A body past the limit is refused whole, in the API's error shape.
    let (status, refused) = w.call(
        "POST",
        "/api/v1/tokens",
        Some(&w.operator),
        Some(&"x".repeat(100 << 10)),
    );
    assert_eq!(status, 413);
    assert_eq!(refused["code"], "TOO_LARGE", "{refused}");
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

/// Even with `--auth none`, a page of another site cannot make a browser change anything: a
/// write naming a foreign origin, a host name that is not this server's (DNS rebinding) and a
/// body that is not JSON (a form, a text/plain post) are refused before anything is stored.
#[test]
fn without_auth_a_foreign_page_still_cannot_write() {
    let server = support::http::server(&[]);
    let url = format!("http://{}/api/v1/approvals", server.addr);
    let http = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let body = json!({"digest": format!("sha256:{}", "ab".repeat(32))}).to_string();
    let post = |headers: &[(&str, &str)]| {
        let mut r = http.post(&url).body(body.clone());
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let response = r.send().unwrap();
        let status = response.status().as_u16();
        let v: Value = serde_json::from_str(&response.text().unwrap()).unwrap_or(Value::Null);
        (status, v["code"].as_str().unwrap_or("").to_owned())
    };
    let json_type = ("Content-Type", "application/json");
    assert_eq!(
        post(&[json_type, ("Origin", "http://evil.example")]),
        (403, "FORBIDDEN".into())
    );
    let port = server.addr.port().to_string();
    let rebound = format!("evil.example:{port}");
    assert_eq!(
        post(&[json_type, ("Host", &rebound)]),
        (403, "FORBIDDEN".into())
    );
    assert_eq!(
        post(&[("Content-Type", "text/plain")]),
        (400, "INVALID_ARGUMENT".into())
    );
    assert_eq!(
        post(&[("Content-Type", "application/x-www-form-urlencoded")]),
        (400, "INVALID_ARGUMENT".into())
    );
    let listed: Value =
        serde_json::from_str(&http.get(&url).send().unwrap().text().unwrap()).unwrap();
    assert_eq!(listed["approvals"], json!([]), "{listed}");
    // This machine's own pages may write: a loopback origin, on any port.
    assert_eq!(
        post(&[json_type, ("Origin", "http://localhost:6274")]).0,
        201
    );
}

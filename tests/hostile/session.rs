//! The session and the probes, attacked: a database held locked (SQLite by another process's
//! transaction, PostgreSQL by a table lock) while probes and authenticated reads must answer
//! and a flood of made-up tokens arrives (`database`); the browser session's cookie, origin,
//! CSRF and Host rules (`browser`); probes that must name nothing and the first token kept out
//! of the log (`probes`).

mod browser;
mod database;
mod probes;

use crate::support;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::api::{mcp_session, tool, World};
use support::http::{answer_of, raw};

/// JSON bodies and answers (reqwest is built without its `json` feature here).
pub trait Json {
    fn json_body(self, v: &Value) -> Self;
}

impl Json for reqwest::blocking::RequestBuilder {
    fn json_body(self, v: &Value) -> Self {
        self.header("Content-Type", "application/json")
            .body(v.to_string())
    }
}

pub fn json_of(r: reqwest::blocking::Response) -> Value {
    let text = r.text().unwrap();
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// A warm toolkit of one skill in `tmp`'s store.
pub fn warm_kit(tmp: &tempfile::TempDir) -> Value {
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/kit");
    support::materialize(
        &src,
        &support::dir(vec![("lint", support::skill("lint", "Lint it."))]),
    );
    serde_json::to_value(support::warm_toolkit(&store, &src, "kit")).unwrap()
}

pub const WARM_ENV: [(&str, &str); 3] = [
    ("CLOUD_HARNESS_EXECUTOR", "none"),
    ("CLOUD_HARNESS_CONTAINERS", "off"),
    ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
];

/// A request with a bearer token; the status and the body (JSON when it is).
pub fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let http = reqwest::blocking::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut r = http.request(method.parse().unwrap(), format!("http://{addr}{path}"));
    if !token.is_empty() {
        r = r.bearer_auth(token);
    }
    if let Some(b) = body {
        r = r.json_body(&b);
    }
    let response = r.send().unwrap();
    let status = response.status().as_u16();
    let text = response.text().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The tools a new MCP session of `token` lists.
pub fn tools_list(addr: SocketAddr, token: &str) -> Value {
    let session = mcp_session(addr, token);
    let auth = format!("Bearer {token}");
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    answer_of(&raw(
        addr,
        &body,
        &[("Mcp-Session-Id", &session), ("Authorization", &auth)],
    ))
}

/// A token of the harness's shape that it never made.
pub fn made_up() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).unwrap();
    use base64::Engine;
    format!(
        "cht_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// `/readyz`, polled until its status is `want` (readiness is assessed in the background).
pub fn readyz_becomes(addr: SocketAddr, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = reqwest::blocking::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://{addr}/readyz"))
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().unwrap();
        if status == want {
            return body;
        }
        assert!(Instant::now() < deadline, "/readyz stayed {status}: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What a probe may say: only ready or not, and which kind of check failed.
pub fn names_nothing(body: &str, w: &World, workspaces: &[&str]) {
    for ws in workspaces {
        assert!(!body.contains(ws), "{body} names {ws}");
    }
    let home = w.home().display().to_string();
    assert!(
        !body.contains(&home) && !body.contains("state.db") && !body.contains('/'),
        "{body} names a path"
    );
}

/// A world whose operator and a client each opened a workspace of the warm kit; the client's
/// token, its workspace, and a second client token never used yet.
pub struct Scene {
    pub w: World,
    pub agent: String,
    pub agent_ws: String,
    pub operator_ws: String,
    pub fresh: String,
}

pub fn scene(w: World, kit: &Value) -> Scene {
    let session = w.session();
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "operator's", "toolkits": [kit]}),
    );
    let operator_ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap_or_else(|| panic!("{opened}"))
        .to_owned();
    let token = |name: &str| {
        w.op(
            "POST",
            "/api/v1/tokens",
            Some(json!({"name": name, "role": "client"})),
        )["token"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let agent = token("agent");
    let fresh = token("fresh");
    let addr = w.server.addr;
    let session = mcp_session(addr, &agent);
    let opened = tool(
        addr,
        &agent,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "agent's", "toolkits": [kit]}),
    );
    let agent_ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap_or_else(|| panic!("{opened}"))
        .to_owned();
    Scene {
        w,
        agent,
        agent_ws,
        operator_ws,
        fresh,
    }
}

/// What must keep answering while the database is locked: `/healthz`, and reads by a client
/// (its workspaces over the API, `skills_list` on its workspace, a new MCP session's
/// `tools/list` with a token never checked before when `fresh` is given).
pub fn reads_answer(s: &Scene, fresh: Option<&str>) {
    let addr = s.w.server.addr;
    let (status, body) = call(addr, "GET", "/healthz", "", None);
    assert_eq!((status, body), (200, Value::String("ok\n".into())));
    // A probe's credentials are not checked (a check would ask the database).
    let (status, body) = call(addr, "GET", "/healthz", &made_up(), None);
    assert_eq!((status, body), (200, Value::String("ok\n".into())));
    let (status, listed) = call(addr, "GET", "/api/v1/workspaces", &s.agent, None);
    assert_eq!(status, 200, "{listed}");
    assert!(listed.to_string().contains(&s.agent_ws), "{listed}");
    let session = mcp_session(addr, &s.agent);
    let skills = tool(
        addr,
        &s.agent,
        &session,
        "skills_list",
        json!({"workspace": s.agent_ws}),
    );
    assert_eq!(skills["isError"], false, "{skills}");
    assert!(skills.to_string().contains("lint"), "{skills}");
    let listed = tools_list(addr, fresh.unwrap_or(&s.agent));
    let tools = listed["result"]["tools"].as_array();
    assert!(tools.is_some_and(|t| !t.is_empty()), "{listed}");
}

/// Requests from threads of their own (`each` gives the method, path, token and body of the
/// n-th): each one's status and answer when it ends.
pub fn in_background(
    addr: SocketAddr,
    n: usize,
    each: impl Fn(usize) -> (&'static str, &'static str, String, Option<Value>) + Send + Sync + 'static,
) -> Vec<JoinHandle<(u16, Value)>> {
    let each = std::sync::Arc::new(each);
    (0..n)
        .map(|i| {
            let each = each.clone();
            std::thread::spawn(move || {
                let (method, path, token, body) = each(i);
                call(addr, method, path, &token, body)
            })
        })
        .collect()
}

//! The session and the probes, attacked: a database held locked (SQLite by another process's
//! transaction, PostgreSQL by a table lock) while probes and authenticated reads must answer
//! and a flood of made-up tokens arrives; the browser session's cookie, origin, CSRF and Host
//! rules; probes that must name nothing; the first token kept out of the log.

use crate::support;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::api::{first_token, mcp_session, tool, world_of, World, BIN};
use support::http::{answer_of, raw, server_in};

/// JSON bodies and answers (reqwest is built without its `json` feature here).
trait Json {
    fn json_body(self, v: &Value) -> Self;
}

impl Json for reqwest::blocking::RequestBuilder {
    fn json_body(self, v: &Value) -> Self {
        self.header("Content-Type", "application/json")
            .body(v.to_string())
    }
}

fn json_of(r: reqwest::blocking::Response) -> Value {
    let text = r.text().unwrap();
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// A warm toolkit of one skill in `tmp`'s store.
fn warm_kit(tmp: &tempfile::TempDir) -> Value {
    let store = cloud_harness_fs::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/kit");
    support::materialize(
        &src,
        &support::dir(vec![("lint", support::skill("lint", "Lint it."))]),
    );
    serde_json::to_value(support::warm_toolkit(&store, &src, "kit")).unwrap()
}

const WARM_ENV: [(&str, &str); 3] = [
    ("CLOUD_HARNESS_EXECUTOR", "none"),
    ("CLOUD_HARNESS_CONTAINERS", "off"),
    ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
];

/// A request with a bearer token; the status and the body (JSON when it is).
fn call(
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
fn tools_list(addr: SocketAddr, token: &str) -> Value {
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
fn made_up() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).unwrap();
    use base64::Engine;
    format!(
        "cht_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// `/readyz`, polled until its status is `want` (readiness is assessed in the background).
fn readyz_becomes(addr: SocketAddr, want: u16) -> String {
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
fn names_nothing(body: &str, w: &World, workspaces: &[&str]) {
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
struct Scene {
    w: World,
    agent: String,
    agent_ws: String,
    operator_ws: String,
    fresh: String,
}

fn scene(w: World, kit: &Value) -> Scene {
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
fn reads_answer(s: &Scene, fresh: Option<&str>) {
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
fn in_background(
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

#[test]
fn a_locked_sqlite_database_stops_neither_probes_nor_reads_and_writes_time_out_typed() {
    let tmp = tempfile::tempdir().unwrap();
    let kit = warm_kit(&tmp);
    let s = scene(world_of(server_in(tmp, &[], &WARM_ENV)), &kit);
    let addr = s.w.server.addr;
    readyz_becomes(addr, 200);

    // Another process takes the database's write lock and keeps it.
    let state = s.w.home().join("state.db");
    let lock = rusqlite::Connection::open(&state).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let other = rusqlite::Connection::open(&state).unwrap();
    other.busy_timeout(Duration::ZERO).unwrap();
    assert!(
        other.execute_batch("BEGIN IMMEDIATE").is_err(),
        "the lock is not held"
    );

    // Writes wait for it (each at most its bound), and a flood of made-up tokens comes in.
    let operator = s.w.operator.clone();
    let writers = in_background(addr, 2, move |i| {
        let body = json!({"name": format!("w{i}"), "role": "client"});
        ("POST", "/api/v1/tokens", operator.clone(), Some(body))
    });
    let flood = in_background(addr, 48, |_| ("GET", "/api/v1/workspaces", made_up(), None));
    std::thread::sleep(Duration::from_millis(300));

    // Meanwhile the probes and the reads answer, a token never checked before included.
    reads_answer(&s, Some(&s.fresh));
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "the writes did not wait for the lock: it was not in effect"
    );
    // Readiness says the database cannot take a transaction, naming no path.
    let body = readyz_becomes(addr, 503);
    let v: Value = serde_json::from_str(&body).unwrap();
    let failed: Vec<&Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{body}");
    assert_eq!(failed[0]["check"], "database usable", "{body}");
    names_nothing(&body, &s.w, &[&s.agent_ws, &s.operator_ws]);

    // The made-up tokens were refused; the writes end in a typed, retryable TIMEOUT.
    for f in flood {
        let (status, v) = f.join().unwrap();
        assert!(
            status == 401 || (status == 504 && v["code"] == "TIMEOUT"),
            "{status} {v}"
        );
    }
    for w in writers {
        let (status, v) = w.join().unwrap();
        assert_eq!((status, v["code"].as_str()), (504, Some("TIMEOUT")), "{v}");
        assert_eq!(v["details"]["retryable"], true, "{v}");
    }
    let tokens = s.w.op("GET", "/api/v1/tokens", None).to_string();
    assert!(
        !tokens.contains("\"w0\""),
        "a timed-out write was kept: {tokens}"
    );

    // Once the lock is let go, writes go through again and the server is ready.
    drop(other);
    drop(lock);
    s.w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "after", "role": "client"})),
    );
    readyz_becomes(addr, 200);
}

/// A `psql` session holding `LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE` until dropped (it
/// waits for more input inside the transaction; killed, its session ends and the lock goes).
struct TableLock(std::process::Child);

impl TableLock {
    fn take(db: &support::postgres::Database) -> TableLock {
        let mut child = Command::new("psql")
            .args([db.url().as_str(), "-X", "-q", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.as_mut().unwrap();
        stdin
            .write_all(b"BEGIN;\nLOCK TABLE tokens IN ACCESS EXCLUSIVE MODE;\n")
            .unwrap();
        stdin.flush().unwrap();
        let held = "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                    WHERE c.relname = 'tokens' AND l.mode = 'AccessExclusiveLock' AND l.granted";
        let deadline = Instant::now() + Duration::from_secs(10);
        while db.query(held).unwrap() != "1" {
            assert!(Instant::now() < deadline, "psql never took the lock");
            std::thread::sleep(Duration::from_millis(50));
        }
        TableLock(child)
    }
}

impl Drop for TableLock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_locked_postgres_table_stops_neither_probes_nor_reads_and_reads_time_out_typed() {
    if !support::postgres::available() {
        return;
    }
    let db = support::postgres::Database::new();
    let tmp = tempfile::tempdir().unwrap();
    let kit = warm_kit(&tmp);
    let url = db.url();
    let mut env = WARM_ENV.to_vec();
    env.push(("CLOUD_HARNESS_DATABASE_URL", url.as_str()));
    let s = scene(world_of(server_in(tmp, &[], &env)), &kit);
    let addr = s.w.server.addr;
    readyz_becomes(addr, 200);
    // The client's check is older than the cache's second: the next one asks the database.
    std::thread::sleep(Duration::from_millis(1200));

    let lock = TableLock::take(&db);
    let flood = in_background(addr, 16, |_| ("GET", "/api/v1/workspaces", made_up(), None));
    // A caller checked in the last minute keeps being served; the probes answer.
    reads_answer(&s, None);
    let body = readyz_becomes(addr, 200);
    names_nothing(&body, &s.w, &[&s.agent_ws, &s.operator_ws]);
    // A token never checked cannot be checked now: a typed, retryable answer, not a wait.
    let (status, v) = call(addr, "GET", "/api/v1/workspaces", &s.fresh, None);
    assert_eq!((status, v["code"].as_str()), (504, Some("TIMEOUT")), "{v}");
    assert_eq!(v["details"]["retryable"], true, "{v}");
    for f in flood {
        let (status, v) = f.join().unwrap();
        assert!(
            status == 401 || (status == 504 && v["code"] == "TIMEOUT"),
            "{status} {v}"
        );
    }
    // The CLI reading the locked table waits only its lock_timeout (here the URL's own, 1 s):
    // TIMEOUT, not INTERNAL.
    let short = format!("{url}&options=-c%20lock_timeout%3D1000");
    let out = Command::new(BIN)
        .args(["token", "list"])
        .env("CLOUD_HARNESS_HOME", s.w.home())
        .env("CLOUD_HARNESS_DATABASE_URL", &short)
        .output()
        .unwrap();
    let (code, text) = support::code_and_output(out);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("TIMEOUT") && text.contains("lock timeout"),
        "{text}"
    );

    // Let go, the token never checked works.
    drop(lock);
    let (status, v) = call(addr, "GET", "/api/v1/workspaces", &s.fresh, None);
    assert_eq!(status, 200, "{v}");
}

/// A signed-in browser session: its `Set-Cookie`, the cookie to send, its CSRF token.
fn sign_in(w: &World) -> (String, String, String) {
    let origin = format!("http://{}", w.server.addr);
    let (code, link) = w.cli(&["token", "login-url", "--url", &origin]);
    assert_eq!(code, 0, "{link}");
    let r = w.http.get(link.trim()).send().unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let set_cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    let me = json_of(
        w.http
            .get(w.url("/api/v1/whoami"))
            .header("Cookie", &cookie)
            .send()
            .unwrap(),
    );
    let csrf = me["csrfToken"].as_str().unwrap().to_owned();
    (set_cookie, cookie, csrf)
}

/// One request written by hand (so that any header may be missing); the whole answer.
fn by_hand(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn the_browser_session_writes_only_from_the_dashboard_s_own_origin_with_its_csrf_token() {
    let w = support::api::world();
    let addr = w.server.addr;
    let origin = format!("http://{addr}");
    let (set_cookie, cookie, csrf) = sign_in(&w);
    // The cookie: __Host- (Secure, this host alone, every path), HttpOnly, SameSite=Strict.
    let flags: Vec<&str> = set_cookie.split(';').map(str::trim).collect();
    assert!(flags[0].starts_with("__Host-ch_session="), "{set_cookie}");
    for flag in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(flags.contains(&flag), "{flag} missing: {set_cookie}");
    }
    assert!(!set_cookie.contains("Domain"), "{set_cookie}");

    let write = |origin: Option<&str>, csrf: Option<&str>, name: &str| {
        let mut r = w
            .http
            .post(w.url("/api/v1/tokens"))
            .header("Cookie", &cookie)
            .json_body(&json!({"name": name, "role": "client"}));
        if let Some(o) = origin {
            r = r.header("Origin", o);
        }
        if let Some(c) = csrf {
            r = r.header("X-CSRF-Token", c);
        }
        let r = r.send().unwrap();
        let status = r.status().as_u16();
        (status, json_of(r))
    };
    // A page on another loopback port (or the same server named otherwise) is another
    // origin: refused, with the right token and all.
    let other_port = format!("http://127.0.0.1:{}", addr.port() + 1);
    let other_name = format!("http://localhost:{}", addr.port());
    for o in [
        other_port.as_str(),
        &other_name,
        "https://127.0.0.1",
        "null",
    ] {
        let (status, v) = write(Some(o), Some(&csrf), "from-elsewhere");
        assert_eq!(
            (status, v["code"].as_str()),
            (403, Some("FORBIDDEN")),
            "{o}: {v}"
        );
    }
    // A CSRF token that differs in its last character, or none: refused.
    let mut wrong = csrf.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(write(Some(&origin), Some(&wrong), "mismatch").0, 403);
    assert_eq!(write(Some(&origin), None, "none").0, 403);
    assert_eq!(write(None, Some(&csrf), "no-origin").0, 403);
    let made = w.op("GET", "/api/v1/tokens", None).to_string();
    for name in ["from-elsewhere", "mismatch", "none", "no-origin"] {
        assert!(
            !made.contains(&format!("\"{name}\"")),
            "{name} was made: {made}"
        );
    }
    // From its own origin with its token: made.
    assert_eq!(
        write(Some(&origin), Some(&csrf), "from-the-dashboard").0,
        201
    );
    // A bearer client is no browser: another loopback port's Origin is taken as before.
    let (status, v) = w
        .http
        .post(w.url("/api/v1/tokens"))
        .bearer_auth(&w.operator)
        .header("Origin", &other_port)
        .json_body(&json!({"name": "by-bearer", "role": "client"}))
        .send()
        .map(|r| (r.status().as_u16(), r.text().unwrap()))
        .unwrap();
    assert_eq!(status, 201, "{v}");

    // A form posts its token as a field: a wrong one is refused before any handler runs, the
    // right one goes through.
    let form = |body: String| {
        w.http
            .post(w.url("/tokens"))
            .header("Cookie", &cookie)
            .header("Origin", &origin)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(
        form(format!("csrf={wrong}&name=form-forged&role=client")),
        403
    );
    assert_eq!(form(format!("csrf={csrf}&name=form-made&role=client")), 200);
    let made = w.op("GET", "/api/v1/tokens", None).to_string();
    assert!(
        !made.contains("form-forged") && made.contains("form-made"),
        "{made}"
    );

    // Signing out is a write like any other: without the token, or from elsewhere, refused
    // and the session lives on.
    let logout = |origin: &str, csrf: Option<&str>| {
        let mut r = w
            .http
            .post(w.url("/logout"))
            .header("Cookie", &cookie)
            .header("Origin", origin);
        if let Some(c) = csrf {
            r = r.header("X-CSRF-Token", c);
        }
        r.send().unwrap().status().as_u16()
    };
    let signed_in = || {
        w.http
            .get(w.url("/api/v1/whoami"))
            .header("Cookie", &cookie)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(logout(&origin, None), 403);
    assert_eq!(logout(&origin, Some(&wrong)), 403);
    assert_eq!(logout(&other_port, Some(&csrf)), 403);
    assert_eq!(signed_in(), 200);
    assert_eq!(logout(&origin, Some(&csrf)), 303);
    assert_eq!(signed_in(), 401);
}

#[test]
fn a_request_without_a_host_is_refused_whatever_it_carries() {
    let w = support::api::world();
    let addr = w.server.addr;
    let (_, cookie, csrf) = sign_in(&w);
    let body = json!({"name": "hostless", "role": "client"}).to_string();
    let requests = [
        "GET /healthz HTTP/1.0\r\n\r\n".to_owned(),
        format!(
            "GET /api/v1/whoami HTTP/1.0\r\nAuthorization: Bearer {}\r\n\r\n",
            w.operator
        ),
        format!(
            "POST /api/v1/tokens HTTP/1.0\r\nCookie: {cookie}\r\nX-CSRF-Token: {csrf}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    ];
    for request in &requests {
        let answer = by_hand(addr, request);
        assert!(
            answer.starts_with("HTTP/1.0 400") || answer.starts_with("HTTP/1.1 400"),
            "{answer}"
        );
        assert!(
            answer.contains("INVALID_ARGUMENT") && answer.contains("Host"),
            "{answer}"
        );
    }
    assert!(!w
        .op("GET", "/api/v1/tokens", None)
        .to_string()
        .contains("hostless"));
    // With one, the same probe answers.
    let answer = by_hand(addr, "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
}

#[test]
fn behind_a_proxy_a_browser_writes_from_the_public_origin_only() {
    let public = "https://harness.example.test";
    let w = world_of(server_in(
        tempfile::tempdir().unwrap(),
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_HTTP_PUBLIC_ORIGIN", public),
        ],
    ));
    let (_, cookie, csrf) = sign_in(&w);
    let write = |host: &str, origin: &str, name: &str| {
        w.http
            .post(w.url("/api/v1/tokens"))
            .header("Host", host)
            .header("Cookie", &cookie)
            .header("Origin", origin)
            .header("X-CSRF-Token", &csrf)
            .json_body(&json!({"name": name, "role": "client"}))
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    let direct = w.server.addr.to_string();
    // Reached directly, the server's own address is not where the dashboard is served from.
    assert_eq!(write(&direct, &format!("http://{direct}"), "direct"), 403);
    assert_eq!(
        write(
            "harness.example.test",
            "http://harness.example.test",
            "plain"
        ),
        403
    );
    // Through the proxy (which passes the Host on), from the public origin: taken.
    assert_eq!(write("harness.example.test", public, "proxied"), 201);
    // A public origin that is not one stops the server before it serves.
    let other = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0", "--no-mount"])
        .env("CLOUD_HARNESS_HOME", other.path())
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        .env(
            "CLOUD_HARNESS_HTTP_PUBLIC_ORIGIN",
            "https://harness.example.test/dashboard",
        )
        .output()
        .unwrap();
    let (code, text) = support::code_and_output(out);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("http.public_origin") && text.contains("INVALID_ARGUMENT"),
        "{text}"
    );
}

#[test]
fn probes_name_no_workspace_nor_path() {
    let tmp = tempfile::tempdir().unwrap();
    let kit = warm_kit(&tmp);
    let s = scene(world_of(server_in(tmp, &[], &WARM_ENV)), &kit);
    let addr = s.w.server.addr;
    let (status, health) = call(addr, "GET", "/healthz", "", None);
    assert_eq!((status, health), (200, Value::String("ok\n".into())));
    // (Two rounds of assessment: both workspaces are in it.)
    std::thread::sleep(cloud_harness::health::READY_EVERY * 2);
    let body = readyz_becomes(addr, 200);
    names_nothing(&body, &s.w, &[&s.agent_ws, &s.operator_ws]);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], true);
    let checks: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        ["store writable", "database usable", "workspace mounts"]
    );
    // A flood of probes is answered from the last assessment.
    let probes: Vec<_> = (0..64)
        .map(|_| std::thread::spawn(move || call(addr, "GET", "/readyz", "", None).0))
        .collect();
    for p in probes {
        assert_eq!(p.join().unwrap(), 200);
    }
}

#[test]
fn the_first_token_is_in_a_file_for_this_user_alone_not_in_the_log() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    // Something left where the file goes (a link to another file) is replaced, never written
    // through.
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::write(&elsewhere, "untouched").unwrap();
    std::os::unix::fs::symlink(&elsewhere, home.join("operator-token")).unwrap();
    // stderr is a pipe, as in a service's journal.
    let server = server_in(tmp, &[], &[("CLOUD_HARNESS_EXECUTOR", "none")]);
    let token = first_token(&home, &server.log);
    let log = server.log.lock().unwrap().clone();
    assert!(!log.contains(&token) && !log.contains("cht_"), "{log}");
    assert!(!log.contains("login?code="), "{log}");
    assert!(
        log.contains(&home.join("operator-token").display().to_string()),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched");
    let file = home.join("operator-token");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0], token);
    assert!(
        lines[1].starts_with(&format!("http://{}/login?code=", server.addr)),
        "{text}"
    );
    // The token is the operator's, and the link signs a browser in.
    let (status, me) = call(server.addr, "GET", "/api/v1/whoami", &token, None);
    assert_eq!(
        (status, me["role"].as_str()),
        (200, Some("operator")),
        "{me}"
    );
    let http = reqwest::blocking::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http.get(lines[1]).send().unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert!(r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .starts_with("__Host-"));
}

#[test]
fn on_a_terminal_the_first_start_shows_the_token_too() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    // `script` gives the server a terminal for its stderr (util-linux, in every Debian).
    let command = format!("exec {BIN} serve --http 127.0.0.1:0 --no-mount");
    let mut child = Command::new("script")
        .args(["-qefc", &command, "/dev/null"])
        .env("CLOUD_HARNESS_HOME", &home)
        .env("TOOLKIT_CACHE_ROOT", tmp.path().join("store"))
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        .env("CLOUD_HARNESS_STANDBY_HELPERS", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut shown = String::new();
    while !shown.contains("login?code=") {
        let Some(Ok(line)) = lines.next() else { break };
        shown.push_str(&line);
        shown.push('\n');
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(home.join("operator-token")).unwrap();
    let token = text.lines().next().unwrap();
    assert!(shown.contains(token), "{shown}");
    assert!(shown.contains(text.lines().nth(1).unwrap()), "{shown}");
}

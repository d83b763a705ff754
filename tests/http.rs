//! `serve --http` as a raw HTTP client sees it: connections the server must not keep (half-sent
//! request heads), a connection cap answered with 503, and `TCP_NODELAY` on accepted sockets.
//! Loopback only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    addr: SocketAddr,
    /// What the server logged so far.
    log: std::sync::Arc<std::sync::Mutex<String>>,
    tmp: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server(env: &[(&str, &str)]) -> Server {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
        .args(["serve", "--http", "127.0.0.1:0", "--no-mount"])
        .env("TOOLKIT_CACHE_ROOT", tmp.path().join("store"))
        .env("CLOUD_HARNESS_HOME", tmp.path().join("home"))
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve ended");
        if let Some(rest) = line.split("at http://").nth(1) {
            break rest.trim().trim_end_matches("/mcp").parse().unwrap();
        }
    };
    // Keep reading its log so it never blocks on a full pipe.
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let kept = log.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap_or(0) > 0 {
            kept.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
    Server {
        child,
        addr,
        log,
        tmp,
    }
}

/// A complete `tools/list` over the legacy protocol's first step: any answer will do.
fn request(addr: SocketAddr) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // A server that is full answers without reading: the write may fail.
    let _ = write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the peer closed `s` (EOF or reset) within `within`.
fn closed_by_peer(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // an error page before the close
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn half_sent_request_heads_are_closed_after_the_header_timeout() {
    let s = server(&[("CLOUD_HARNESS_HTTP_HEADER_TIMEOUT", "1")]);
    let mut slow: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut c = TcpStream::connect(s.addr).unwrap();
            c.write_all(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\n")
                .unwrap();
            c
        })
        .collect();
    // Normal requests are served meanwhile.
    assert!(request(s.addr).starts_with("HTTP/1.1 200"), "served");
    let started = Instant::now();
    for c in &mut slow {
        assert!(
            closed_by_peer(c, Duration::from_secs(10)),
            "a half-sent head was kept open"
        );
    }
    eprintln!("200 slow connections closed in {:?}", started.elapsed());
    assert!(request(s.addr).starts_with("HTTP/1.1 200"));
}

#[test]
fn connections_over_the_cap_get_503_with_retry_after() {
    let s = server(&[("CLOUD_HARNESS_HTTP_MAX_CONNECTIONS", "8")]);
    let held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(s.addr).unwrap())
        .collect();
    // The server takes the eight as they come; the ninth finds it full.
    std::thread::sleep(Duration::from_millis(300));
    let answer = request(s.addr);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("Retry-After: 1"), "{answer}");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !request(s.addr).starts_with("HTTP/1.1 200") {
        assert!(
            Instant::now() < deadline,
            "the freed connections were not reused"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's end of `client`, taken from the server process (`pidfd_getfd`, as root):
/// whether it has `TCP_NODELAY` set.
fn server_side_nodelay(pid: u32, client: &TcpStream) -> Option<bool> {
    use nix::libc;
    use std::os::fd::{FromRawFd, OwnedFd};
    let port = client.local_addr().unwrap().port();
    let server_port = client.peer_addr().unwrap().port();
    // The server's socket: its own port the server's, its peer's the client's (and a live
    // socket, not one in TIME_WAIT, whose inode is 0).
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port_of = |field: &str| u16::from_str_radix(field.rsplit(':').next()?, 16).ok();
    let inode = tcp.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let ours = port_of(f[1])? == server_port && port_of(f[2])? == port && f[9] != "0";
        ours.then(|| f[9].to_owned())
    })?;
    let wanted = format!("socket:[{inode}]");
    let fd: i32 = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == wanted))?
        .file_name()
        .to_str()?
        .parse()
        .ok()?;
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        assert!(pidfd >= 0, "pidfd_open");
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let theirs = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        );
        assert!(theirs >= 0, "pidfd_getfd");
        let theirs = OwnedFd::from_raw_fd(theirs as i32);
        nix::sys::socket::getsockopt(&theirs, nix::sys::socket::sockopt::TcpNoDelay).ok()
    }
}

#[test]
fn accepted_connections_have_tcp_nodelay() {
    if !nix::unistd::geteuid().is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("skipped: pidfd_getfd of another process needs root");
        return;
    }
    let s = server(&[]);
    let client = TcpStream::connect(s.addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let nodelay = loop {
        if let Some(v) = server_side_nodelay(s.child.id(), &client) {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the server's socket was not found"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(nodelay, "TCP_NODELAY is not set on the accepted socket");
}

/// One POST of `body` as JSON; the status line and the body.
fn post(addr: SocketAddr, body: &[u8]) -> (String, serde_json::Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

#[test]
fn malformed_messages_get_json_rpc_errors_with_the_right_codes() {
    let s = server(&[]);
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"x":"{}"}}}}"#,
        "a".repeat(17 << 20)
    );
    for (body, status, code) in [
        ("{not json".to_owned(), "400", -32700),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#.to_owned(), "400", -32600),
        (r#"{"jsonrpc":"2.0","id":1}"#.to_owned(), "400", -32600),
        (r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#.to_owned(), "400", -32600),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"skills_list","arguments":"x"}}"#.to_owned(),
            "200",
            -32602,
        ),
        (huge, "413", -32600),
    ] {
        let (line, answer) = post(s.addr, body.as_bytes());
        assert!(line.contains(status), "{}: {line} {answer}", &body[..body.len().min(80)]);
        assert_eq!(answer["error"]["code"], code, "{}: {answer}", &body[..body.len().min(80)]);
        assert_eq!(answer["jsonrpc"], "2.0");
    }
    // A well-formed request still reaches the server.
    assert!(request(s.addr).starts_with("HTTP/1.1 200"));
    // A client's mistakes are answered, not logged as the server's warnings: a session's
    // call of an unknown method gets -32601 and leaves no line of the SDK's in the log.
    let session = legacy_session(s.addr);
    let unknown = r#"{"jsonrpc":"2.0","id":8,"method":"no/such/method"}"#;
    let answer = raw(s.addr, unknown, &[("Mcp-Session-Id", &session)]);
    assert!(answer.contains("-32601"), "{answer}");
    std::thread::sleep(Duration::from_millis(200));
    let log = s.log.lock().unwrap().clone();
    assert!(!log.contains("rmcp"), "{log}");
    // A list that comes in one page has no cursor to continue from: -32602.
    let bogus = r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{"cursor":"bogus"}}"#;
    let answer = raw(s.addr, bogus, &[("Mcp-Session-Id", &session)]);
    assert!(answer.contains("-32602"), "{answer}");
}

/// A POST with extra headers; the whole answer as text.
fn raw(addr: SocketAddr, body: &str, headers: &[(&str, &str)]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    // An SSE answer stays open: one read of its event is enough.
    let mut buf = [0u8; 65536];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&out).contains("\"jsonrpc\"") {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A session of the 2025-11-25 protocol, initialized; its id.
fn legacy_session(addr: SocketAddr) -> String {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let answer = raw(addr, init, &[]);
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
        &[("Mcp-Session-Id", &session)],
    );
    session
}

/// The status line of `answer`.
fn status(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

#[test]
fn sessions_are_capped_per_client_and_in_all_and_idle_ones_expire() {
    let s = server(&[
        ("CLOUD_HARNESS_HTTP_MAX_SESSIONS_PER_CLIENT", "3"),
        ("CLOUD_HARNESS_HTTP_SESSION_IDLE", "2"),
    ]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let sessions: Vec<String> = (0..3).map(|_| legacy_session(s.addr)).collect();
    let refused = raw(s.addr, init, &[]);
    assert!(status(&refused).contains("429"), "{refused}");
    assert!(
        refused.contains("Retry-After: 5") || refused.contains("retry-after: 5"),
        "{refused}"
    );
    // The sessions still work; once idle they close, and new ones can start.
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    assert!(raw(s.addr, list, &[("Mcp-Session-Id", &sessions[0])]).contains("skills_list"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !status(&raw(s.addr, init, &[])).contains("200") {
        assert!(Instant::now() < deadline, "idle sessions never expired");
        std::thread::sleep(Duration::from_millis(250));
    }

    let s = server(&[("CLOUD_HARNESS_HTTP_MAX_SESSIONS", "2")]);
    legacy_session(s.addr);
    legacy_session(s.addr);
    let refused = raw(s.addr, init, &[]);
    assert!(status(&refused).contains("503"), "{refused}");
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A client looping on `initialize` cannot grow the server: past its share it is refused,
/// and the server's memory stays where it was.
#[test]
fn a_flood_of_initializes_leaves_the_server_s_memory_bounded() {
    let s = server(&[]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    // Warm up to the per-client share (100), then measure across 3,000 more.
    for _ in 0..150 {
        raw(s.addr, init, &[]);
    }
    let before = rss_kib(s.child.id());
    let mut refused = 0;
    for _ in 0..3000 {
        if status(&raw(s.addr, init, &[])).contains("429") {
            refused += 1;
        }
    }
    let after = rss_kib(s.child.id());
    eprintln!("RSS {before} KiB -> {after} KiB over 3,000 initializes ({refused} refused)");
    assert_eq!(refused, 3000);
    assert!(
        after < before + 20 * 1024,
        "RSS grew from {before} to {after} KiB"
    );
}

/// The JSON-RPC answer inside a raw HTTP answer (a JSON body or an SSE `data:` line).
fn answer_of(raw: &str) -> serde_json::Value {
    let body = raw.split_once("\r\n\r\n").map_or(raw, |(_, b)| b);
    body.lines()
        .map(|l| l.strip_prefix("data: ").unwrap_or(l))
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v.get("jsonrpc").is_some())
        })
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {raw}"))
}

/// The MCP Skills extension (SEP-2640) as a client sees it: the capability, `skills/list` and
/// `skills/get` entries whose manifests match what `resources/read` returns byte for byte,
/// `resources/list` and the template, and -32602 for what the server does not serve.
#[test]
fn the_skills_extension_lists_skills_whose_manifests_match_their_files() {
    use coreutils::sha256_hex;
    let s = server(&[]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let capabilities = answer_of(&raw(s.addr, init, &[]))["result"]["capabilities"].clone();
    assert!(
        capabilities["extensions"]["io.modelcontextprotocol/skills"].is_object(),
        "{capabilities}"
    );
    assert!(capabilities["resources"].is_object(), "{capabilities}");
    let session = legacy_session(s.addr);
    let call = |id: u32, method: &str, params: serde_json::Value| {
        let body =
            serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        answer_of(&raw(
            s.addr,
            &body.to_string(),
            &[("Mcp-Session-Id", &session)],
        ))
    };
    let opened = call(
        2,
        "tools/call",
        serde_json::json!({ "name": "workspace_open", "arguments": { "idempotencyKey": "skills-ext" } }),
    );
    let ws = opened["result"]["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();

    let listed = call(3, "skills/list", serde_json::json!({}));
    let skills = listed["result"]["skills"].as_array().unwrap().clone();
    let names: Vec<&str> = skills
        .iter()
        .map(|e| e["frontmatter"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cloud-harness-conflicts",
            "cloud-harness-skills",
            "cloud-harness-toolkits"
        ],
        "{listed}"
    );
    assert_eq!(listed["result"]["ttlMs"], 0);
    for entry in &skills {
        let name = entry["frontmatter"]["name"].as_str().unwrap();
        assert_eq!(entry["uri"], format!("skill://{ws}/{name}/SKILL.md"));
        assert_eq!(
            entry["frontmatter"]["license"], "Apache-2.0",
            "front matter as written"
        );
        // skills/get gives the same entry.
        let got = call(4, "skills/get", serde_json::json!({ "uri": entry["uri"] }));
        assert_eq!(&got["result"]["skill"], entry);
        for file in entry["resources"].as_array().unwrap() {
            let read = call(
                5,
                "resources/read",
                serde_json::json!({ "uri": file["uri"] }),
            );
            let text = read["result"]["contents"][0]["text"].as_str().unwrap();
            assert_eq!(text.len() as u64, file["size"].as_u64().unwrap(), "{file}");
            assert_eq!(
                format!("sha256:{}", sha256_hex(text.as_bytes())),
                file["digest"],
                "{file}"
            );
        }
    }
    let resources = call(6, "resources/list", serde_json::json!({}));
    let uris: Vec<&str> = resources["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert!(
        uris.contains(&format!("skill://{ws}/cloud-harness-skills/SKILL.md").as_str()),
        "{resources}"
    );
    let templates = call(7, "resources/templates/list", serde_json::json!({}));
    assert_eq!(
        templates["result"]["resourceTemplates"][0]["uriTemplate"],
        "skill://{workspace}/{skill}/{+path}"
    );
    // What is not served is -32602.
    for (method, uri) in [
        ("skills/get", format!("skill://{ws}/no-such-skill/SKILL.md")),
        (
            "skills/get",
            "skill://ws_nope/cloud-harness-skills/SKILL.md".to_owned(),
        ),
        (
            "resources/read",
            format!("skill://{ws}/cloud-harness-skills/missing.md"),
        ),
        ("resources/read", "file:///etc/passwd".to_owned()),
    ] {
        let refused = call(8, method, serde_json::json!({ "uri": uri }));
        assert_eq!(
            refused["error"]["code"], -32602,
            "{method} {uri}: {refused}"
        );
    }
}

/// SHA-256 by `sha256sum`, independent of the harness's own hashing.
mod coreutils {
    pub fn sha256_hex(bytes: &[u8]) -> String {
        use std::io::Write;
        let mut child = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_owned()
    }
}

/// A session that opened a workspace hears when a live tier changes what it serves:
/// `notifications/resources/list_changed` on its event stream, promptly.
#[test]
fn a_live_change_is_announced_to_the_session_bound_to_the_workspace() {
    let s = server(&[]);
    let session = legacy_session(s.addr);
    let open = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"workspace_open","arguments":{"idempotencyKey":"live"}}}"#;
    let opened = answer_of(&raw(s.addr, open, &[("Mcp-Session-Id", &session)]));
    let ws = opened["result"]["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    // The session's stream of server messages.
    let mut events = TcpStream::connect(s.addr).unwrap();
    write!(
        events,
        "GET /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n\r\n"
    )
    .unwrap();
    events
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // A skill appears in the working tree (staged, then renamed into place whole).
    let repo = s.tmp.path().join("home/workspaces").join(&ws).join("repo");
    let staged = repo.join("staged/fresh");
    std::fs::create_dir_all(&staged).unwrap();
    std::fs::write(
        staged.join("SKILL.md"),
        "---\nname: fresh\ndescription: New.\n---\n",
    )
    .unwrap();
    std::fs::create_dir_all(repo.join(".agents/skills")).unwrap();
    let changed = Instant::now();
    std::fs::rename(&staged, repo.join(".agents/skills/fresh")).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Ok(n) = events.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
        }
        if String::from_utf8_lossy(&seen).contains("notifications/resources/list_changed") {
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(2),
            "no change announced: {}",
            String::from_utf8_lossy(&seen)
        );
    }
    eprintln!("announced {:?} after the change", changed.elapsed());
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"skills/list"}"#;
    let listed = answer_of(&raw(s.addr, list, &[("Mcp-Session-Id", &session)]));
    assert!(
        listed
            .to_string()
            .contains(&format!("skill://{ws}/fresh/SKILL.md")),
        "{listed}"
    );
}

/// An engine with CVE-2024-29018 (DNS forwarded from internal networks) is said once, in the
/// log at start-up, and under `provisioning` in results, never among a call's own warnings.
#[test]
fn an_affected_docker_engine_is_named_once_at_start_up() {
    let version = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let Some(version) = version else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI starts a Docker engine"
        );
        eprintln!("skipped: no Docker engine");
        return;
    };
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let affected = major < 23; // the fixed releases are 23.0.11, 25.0.5 and 26.0.0 on
    let s = server(&[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let warned = loop {
        if s.log.lock().unwrap().contains("CVE-2024-29018") {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if major < 23 || major >= 26 {
        assert_eq!(
            warned,
            affected,
            "engine {version}: {}",
            s.log.lock().unwrap()
        );
    }
    let session = legacy_session(s.addr);
    let open = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"workspace_open","arguments":{"idempotencyKey":"cve"}}}"#;
    let opened = answer_of(&raw(s.addr, open, &[("Mcp-Session-Id", &session)]));
    let result = &opened["result"]["structuredContent"];
    assert!(
        !result["warnings"].to_string().contains("CVE-2024-29018"),
        "{result}"
    );
    assert_eq!(
        result["provisioning"]["warnings"]
            .to_string()
            .contains("CVE-2024-29018"),
        warned,
        "{result}"
    );
    // Said once: the log names it one time however many calls come.
    raw(s.addr, open, &[("Mcp-Session-Id", &session)]);
    assert!(s.log.lock().unwrap().matches("CVE-2024-29018").count() <= 1);
}

//! `serve --http` as a raw HTTP client sees it: connections the server must not keep (half-sent
//! request heads), a connection cap answered with 503, `TCP_NODELAY` on accepted sockets,
//! sessions capped and expiring, malformed messages answered with their JSON-RPC errors, and
//! what the log says. Loopback only.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};
use support::http::{answer_of, legacy_session, raw, request, server};

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

/// The status line of `answer`.
fn status(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

#[test]
fn sessions_are_capped_per_principal_and_in_all_and_idle_ones_expire() {
    let s = server(&[
        ("CLOUD_HARNESS_LIMIT_SESSIONS", "3"),
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
    if !(23..26).contains(&major) {
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

/// A quick call's event stream comes in one write: the head, the priming event, the answer
/// and the stream's end all arrive in the client's first read (rmcp's stream had them in two
/// writes, so a client was woken twice for every call). Asked 20 times: a server that wrote
/// twice would, almost every time, wake its client between the writes.
#[test]
fn a_quick_call_s_answer_comes_in_one_write() {
    let s = server(&[]);
    let session = legacy_session(s.addr);
    for id in 0..20 {
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#);
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            c,
            "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\nMcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let n = c.read(&mut buf).unwrap();
        let first = String::from_utf8_lossy(&buf[..n]);
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        assert!(first.contains("text/event-stream"), "{first}");
        assert!(first.contains("\nretry: "), "no priming event: {first}");
        assert!(
            first.contains(&format!(r#""id":{id},"result":{{"tools""#)),
            "the answer is not in the first read: {first}"
        );
        assert!(
            first.ends_with("\r\n0\r\n\r\n"),
            "the stream has not ended: {first}"
        );
    }
}

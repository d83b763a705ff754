//! A `serve --http` of its own for a test, and a raw HTTP client of the MCP endpoint: what
//! the SDKs hide (status lines, headers, the exact bytes) stays visible.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// What the server logged so far.
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    pub tmp: tempfile::TempDir,
    /// The PostgreSQL database it keeps its state in, when this test binary runs the control
    /// plane on PostgreSQL (else SQLite in its home).
    pub database: Option<super::postgres::Database>,
}

impl Server {
    /// The environment that points a CLI at this server's database.
    pub fn database_env(&self) -> Vec<(&'static str, String)> {
        self.database
            .iter()
            .map(|d| ("CLOUD_HARNESS_DATABASE_URL", d.url()))
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The killed server's unmount guard detaches its mounts and the workspaces folder's
        // bind, holding the home's serving lock until it is done; the home (with the bind's
        // recorded ID) must outlive that, or the bind is left for want of its record.
        let home = self.tmp.path().join("home");
        if home.join("serving.lock").exists() {
            let _ = cloud_harness_workspace::serving::lock(&home);
        }
    }
}

/// A server on loopback that checks no tokens (`--auth none`): these tests are about the MCP
/// endpoint's HTTP, `tests/api.rs` about who may call it.
pub fn server(env: &[(&str, &str)]) -> Server {
    server_in(tempfile::tempdir().unwrap(), &["--auth", "none"], env)
}

/// A server with these arguments, its store and home in `tmp` (`store`, `home`).
pub fn server_in(tmp: tempfile::TempDir, args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut all = vec!["--no-mount"];
    all.extend_from_slice(args);
    server_mounting(tmp, &all, env)
}

/// [`server_in`] whose workspaces are mounted (unless `args` say `--no-mount`).
pub fn server_mounting(tmp: tempfile::TempDir, args: &[&str], env: &[(&str, &str)]) -> Server {
    let named = env.iter().any(|(k, _)| *k == "CLOUD_HARNESS_DATABASE_URL");
    let database = (!named && super::postgres::selected() && super::postgres::available())
        .then(super::postgres::Database::new);
    let url = database.as_ref().map(|d| d.url());
    let mut all: Vec<(&str, &str)> = url
        .iter()
        .map(|u| ("CLOUD_HARNESS_DATABASE_URL", u.as_str()))
        .collect();
    all.extend_from_slice(env);
    let Running { child, addr, log } =
        start(tmp.path(), args, &all).unwrap_or_else(|log| panic!("serve ended: {log}"));
    Server {
        child,
        addr,
        log,
        tmp,
        database,
    }
}

/// A `serve --http` process, its address and what it logged so far.
pub struct Running {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

/// Starts `serve --http` on loopback with its store and home in `root` (`store`, `home`), as
/// [`server_mounting`] does; what it logged if it ended before it listened.
pub fn start(
    root: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<Running, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
        .args(["serve", "--http", "127.0.0.1:0"])
        .args(args)
        .env("TOOLKIT_CACHE_ROOT", root.join("store"))
        .env("CLOUD_HARNESS_HOME", root.join("home"))
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        // No helpers on standby unless a test asks: servers of tests that never fetch in a
        // container would otherwise each make a network and three containers at start-up.
        .env("CLOUD_HARNESS_STANDBY_HELPERS", "0")
        // A test machine's disk may be fuller than a runner's should be: only the tests of
        // that threshold set it.
        .env("CLOUD_HARNESS_MIN_FREE_MIB", "1")
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let (mut line, mut early) = (String::new(), String::new());
    let addr = loop {
        line.clear();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = child.wait();
            return Err(early);
        }
        early.push_str(&line);
        if let Some(rest) = line.split("at http://").nth(1) {
            break rest.trim().trim_end_matches("/mcp").parse().unwrap();
        }
    };
    // Keep reading its log so it never blocks on a full pipe (what came before the address
    // is in it too).
    let log = std::sync::Arc::new(std::sync::Mutex::new(early));
    let kept = log.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap_or(0) > 0 {
            kept.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
    Ok(Running { child, addr, log })
}

/// A complete `tools/list` over the legacy protocol's first step: any answer will do.
pub fn request(addr: SocketAddr) -> String {
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

/// A POST with extra headers; the whole answer as text.
pub fn raw(addr: SocketAddr, body: &str, headers: &[(&str, &str)]) -> String {
    raw_as(addr, "application/json", "2025-11-25", body, headers)
}

/// The same, with this `Content-Type` and `MCP-Protocol-Version`.
pub fn raw_as(
    addr: SocketAddr,
    content_type: &str,
    protocol: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: {content_type}\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: {protocol}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    // An SSE answer stays open: one read of its event is enough.
    let mut buf = [0u8; 65536];
    let started = std::time::Instant::now();
    let ended = loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break format!("the end of the stream after {:?}", started.elapsed()),
            Ok(n) => n,
            // A signal to this process (a child of it that ended) is not the end.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break format!("{e} after {:?}", started.elapsed()),
        };
        out.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&out).contains("\"jsonrpc\"") {
            return String::from_utf8_lossy(&out).into_owned();
        }
    };
    // Said where the answer is looked for, which fails with the answer's text.
    eprintln!("raw_as: no JSON-RPC message before {ended}");
    String::from_utf8_lossy(&out).into_owned()
}

/// A session of the 2025-11-25 protocol, initialized; its id.
pub fn legacy_session(addr: SocketAddr) -> String {
    legacy_session_with(addr, &[])
}

/// The same, every request with `headers` (an `Authorization`, say).
pub fn legacy_session_with(addr: SocketAddr, headers: &[(&str, &str)]) -> String {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let answer = raw(addr, init, headers);
    let session = answer
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session: {answer}"));
    let mut with_session = vec![("Mcp-Session-Id", session.as_str())];
    with_session.extend_from_slice(headers);
    raw(
        addr,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        &with_session,
    );
    session
}

/// The JSON-RPC answer inside a raw HTTP answer (a JSON body or an SSE `data:` line).
pub fn answer_of(raw: &str) -> serde_json::Value {
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

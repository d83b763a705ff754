//! The egress proxy against an attack table. The upstream is an echo server on loopback and
//! names resolve through a scripted resolver: nothing beyond this machine is ever contacted.

use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_provision::egress::{EgressPolicy, Resolve};
use cloud_harness_provision::proxy::{self, Refusals};
use std::collections::HashMap;
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Answers from a script: each call to a name takes its next answer (the last one repeats).
#[derive(Default)]
struct Scripted {
    answers: HashMap<String, Vec<Vec<IpAddr>>>,
    calls: Mutex<HashMap<String, usize>>,
}

impl Scripted {
    fn with(mut self, host: &str, answers: &[&[&str]]) -> Self {
        let parsed = answers
            .iter()
            .map(|a| a.iter().map(|ip| ip.parse().unwrap()).collect())
            .collect();
        self.answers.insert(host.to_owned(), parsed);
        self
    }

    fn calls(&self, host: &str) -> usize {
        *self.calls.lock().unwrap().get(host).unwrap_or(&0)
    }
}

impl Resolve for Scripted {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        _port: u16,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(async move {
            let n = {
                let mut calls = self.calls.lock().unwrap();
                let n = calls.entry(host.to_owned()).or_default();
                *n += 1;
                *n
            };
            match self.answers.get(host) {
                Some(list) => Ok(list[(n - 1).min(list.len() - 1)].clone()),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such name",
                )),
            }
        })
    }
}

/// A loopback echo server: answers each line with `echo:<line>`.
fn echo_server() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 {
                    let _ = stream.write_all(format!("echo:{line}").as_bytes());
                    line.clear();
                }
            });
        }
    });
    addr
}

/// Sends `request` to the proxy; returns the status and the proxy's reason, and the stream.
fn ask(proxy: SocketAddr, request: &str) -> (u16, String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let reason = head
        .lines()
        .find_map(|l| l.strip_prefix("X-Egress-Reason: "))
        .unwrap_or("")
        .to_owned();
    (status, reason, stream)
}

fn connect(target: &str) -> String {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
}

struct Proxy {
    addr: SocketAddr,
    resolver: Arc<Scripted>,
    _runtime: tokio::runtime::Runtime,
}

fn start(port: u16) -> Proxy {
    let hosts = HostPolicy::new(
        &format!(
            "allowed.test:{port}, *.suffix.test:{port}, metadata.test:{port}, mixed.test:{port}, rebind.test:{port}, \
             rebind-ok.test:{port}, pinned.test:{port}, allowed.test, nxdomain.test:{port}"
        ),
        "",
    )
    .unwrap();
    // Only the echo server's own address is opened; everything else special stays shut.
    let policy = EgressPolicy::new(hosts, "127.0.0.1/32", "pinned.test=127.0.0.1").unwrap();
    let resolver = Arc::new(
        Scripted::default()
            .with("allowed.test", &[&["127.0.0.1"]])
            .with("a.suffix.test", &[&["127.0.0.1"]])
            .with("deep.a.suffix.test", &[&["127.0.0.1"]])
            .with("metadata.test", &[&["169.254.169.254"]])
            .with("mixed.test", &[&["93.184.216.34", "10.0.0.5"]])
            .with("rebind.test", &[&["10.1.1.1"], &["127.0.0.1"]])
            .with("rebind-ok.test", &[&["127.0.0.1"], &["169.254.169.254"]]),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let r: Arc<dyn Resolve> = resolver.clone();
    runtime.spawn(proxy::serve(
        listener,
        Arc::new(policy),
        r,
        Refusals::default(),
        proxy::AT_ONCE,
    ));
    Proxy {
        addr,
        resolver,
        _runtime: runtime,
    }
}

#[test]
fn the_attack_table_is_refused_with_reasons_and_allowed_hosts_pass() {
    let upstream = echo_server();
    let port = upstream.port();
    let p = start(port);
    let t = |host: &str| format!("{host}:{port}");
    let refused: Vec<(String, u16, &str)> = vec![
        // Loopback in every IPv4 spelling.
        (connect(&t("127.0.0.1")), 403, "loopback"),
        (connect(&t("2130706433")), 403, "loopback"),
        (connect(&t("017700000001")), 403, "loopback"),
        (connect(&t("0x7f000001")), 403, "loopback"),
        (connect(&t("0x7f.0.0.1")), 403, "loopback"),
        (connect(&t("0177.0.0.1")), 403, "loopback"),
        (connect(&t("127.1")), 403, "loopback"),
        (connect(&t("127.0.1")), 403, "loopback"),
        // The metadata address in every spelling.
        (connect(&t("169.254.169.254")), 403, "link-local"),
        (connect(&t("2852039166")), 403, "link-local"),
        (connect(&t("0251.0376.0251.0376")), 403, "link-local"),
        (connect(&t("0xa9fea9fe")), 403, "link-local"),
        (connect(&t("0xa9.0xfe.0xa9.0xfe")), 403, "link-local"),
        (connect(&t("169.254.43518")), 403, "link-local"),
        // IPv6 forms.
        (connect(&t("[::1]")), 403, "loopback ::1"),
        (connect(&t("[::ffff:127.0.0.1]")), 403, "IPv4-mapped"),
        (connect(&t("[::ffff:169.254.169.254]")), 403, "IPv4-mapped"),
        (connect(&t("[::ffff:a9fe:a9fe]")), 403, "IPv4-mapped"),
        (connect(&t("[::127.0.0.1]")), 403, "IPv4-compatible"),
        (connect(&t("[64:ff9b::a9fe:a9fe]")), 403, "NAT64"),
        (connect(&t("[64:ff9b:1::1]")), 403, "NAT64"),
        (connect(&t("[2002:a9fe:a9fe::1]")), 403, "6to4"),
        (connect(&t("[2001::1]")), 403, "Teredo"),
        (connect(&t("[fc00::1]")), 403, "unique local"),
        (connect(&t("[fe80::1]")), 403, "link-local fe80"),
        (connect(&t("[::]")), 403, "unspecified"),
        // The rest of the special-purpose IPv4 ranges.
        (connect(&t("10.0.0.1")), 403, "RFC 1918"),
        (connect(&t("172.16.0.1")), 403, "RFC 1918"),
        (connect(&t("192.168.1.1")), 403, "RFC 1918"),
        (connect(&t("100.64.0.1")), 403, "CGNAT"),
        (connect(&t("0.0.0.0")), 403, "0.0.0.0/8"),
        (connect(&t("198.18.0.1")), 403, "benchmarking"),
        (connect(&t("240.0.0.1")), 403, "reserved"),
        (connect(&t("224.0.0.1")), 403, "multicast"),
        (connect(&t("8.8.8.8")), 403, "not on the allowlist"),
        // Names that resolve where they must not.
        (
            connect(&t("metadata.test")),
            403,
            "169.254.169.254: link-local",
        ),
        (connect(&t("mixed.test")), 403, "10.0.0.5: private"),
        (connect(&t("rebind.test")), 403, "10.1.1.1: private"),
        // Ports, authorities, names.
        (connect("allowed.test:22"), 403, "not on the allowlist"),
        (
            connect(&format!("allowed.test@evil.test:{port}")),
            403,
            "without credentials",
        ),
        (connect(&t("evil.test")), 403, "not on the allowlist"),
        (connect(&t("EVIL.TEST.")), 403, "evil.test"),
        (
            connect(&t("allowed.test.evil.test")),
            403,
            "not on the allowlist",
        ),
        (connect(&t("allowed.test..")), 400, "not a host name"),
        (
            connect(&t("\u{430}llowed.test")),
            403,
            "not on the allowlist",
        ),
        (connect(&t("suffix.test")), 403, "not on the allowlist"),
        (connect("allowed.test"), 400, "host:port"),
        (connect(&t("nxdomain.test")), 502, "resolving failed"),
        // Not CONNECT at all.
        (
            format!("GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
            405,
            "only CONNECT",
        ),
        (
            format!("POST http://allowed.test:{port}/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            405,
            "only CONNECT",
        ),
    ];
    for (request, status, reason) in &refused {
        let (got, why, _) = ask(p.addr, request);
        assert_eq!(got, *status, "{request:?}: {why}");
        assert!(
            why.contains(reason),
            "{request:?}: the reason {why:?} should say {reason:?}"
        );
    }
    assert!(refused.len() >= 40, "{} cases", refused.len());
    assert_eq!(
        p.resolver.calls("rebind.test"),
        1,
        "a name is resolved once"
    );
    assert_eq!(
        p.resolver.calls("127.0.0.1") + p.resolver.calls("evil.test"),
        0,
        "refused names are not resolved"
    );

    // Allowed hosts still pass, and the bytes flow both ways.
    for target in [
        t("allowed.test"),
        t("ALLOWED.TEST"),
        t("allowed.test."),
        t("a.suffix.test"),
        t("deep.a.suffix.test"),
        t("pinned.test"),
        t("rebind-ok.test"),
    ] {
        let (status, why, mut stream) = ask(p.addr, &connect(&target));
        assert_eq!(status, 200, "{target}: {why}");
        stream.write_all(b"ping\n").unwrap();
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        assert_eq!(line, "echo:ping\n", "{target}");
    }
    // The pinned name never reached the resolver; the rebinding one was asked once and its
    // second (metadata) answer never used: the echo above came from the checked address.
    assert_eq!(p.resolver.calls("pinned.test"), 0);
    assert_eq!(p.resolver.calls("rebind-ok.test"), 1);
}

#[test]
fn the_proxy_command_logs_one_line_per_decision() {
    let upstream = echo_server();
    let port = upstream.port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
        .args(["proxy", "--listen", "127.0.0.1:0"])
        .env("ALLOWED_GIT_HOSTS", format!("git.test:{port}"))
        .env("CLOUD_HARNESS_RESOLVE", "git.test=127.0.0.1")
        .env("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.1/32")
        .env("RUST_LOG", "egress=info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr: SocketAddr = loop {
        let line = lines.next().unwrap().unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.trim().parse().unwrap();
        }
    };
    let (status, _, mut stream) = ask(addr, &connect(&format!("git.test:{port}")));
    assert_eq!(status, 200);
    stream.write_all(b"hello\n").unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    assert_eq!(reply, "echo:hello\n");
    let (status, why, _) = ask(addr, &connect("169.254.169.254:443"));
    assert_eq!(status, 403, "{why}");
    let _ = child.kill();
    let _ = child.wait();
    let log: Vec<String> = lines.map_while(Result::ok).collect();
    let allow = log
        .iter()
        .find(|l| l.contains("verdict=\"allow\"") || l.contains("verdict=allow"))
        .expect("an allow line");
    assert!(
        allow.contains("git.test") && allow.contains("127.0.0.1"),
        "{allow}"
    );
    let refuse = log
        .iter()
        .find(|l| l.contains("refuse"))
        .expect("a refuse line");
    assert!(
        refuse.contains("169.254.169.254") && refuse.contains("reason"),
        "{refuse}"
    );
}

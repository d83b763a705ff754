//! The egress proxy: the one way out for fetches. It judges each request head
//! (`egress::decide`), dials exactly the address it checked, so a DNS answer that changes
//! between check and connect gains nothing, and relays. Every decision is one structured log
//! line, and each refusal is remembered so a failed fetch can say why.

use crate::egress::{decide, Decision, EgressPolicy, Resolve, SystemResolver, Verdict};
use cloud_harness_error::{Error, Result};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAX_HEAD: usize = 8 << 10;
const DIAL_TIMEOUT: Duration = Duration::from_secs(20);

fn log(d: &Decision) {
    let addrs: Vec<String> = d.addresses.iter().map(ToString::to_string).collect();
    cloud_harness_control::metrics::egress(match d.verdict {
        Verdict::Allow(_) => "allow",
        Verdict::Refuse(..) => "refuse",
    });
    match &d.verdict {
        Verdict::Allow(to) => {
            tracing::info!(target: "egress", host = %d.host, port = d.port, addresses = ?addrs, verdict = "allow", reason = %format!("dialling {to}"))
        }
        Verdict::Refuse(status, why) => {
            tracing::warn!(target: "egress", host = %d.host, port = d.port, addresses = ?addrs, verdict = "refuse", status, reason = %why)
        }
    }
}

async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut byte = [0u8; 1];
    while buf.len() < MAX_HEAD {
        if stream.read(&mut byte).await? == 0 {
            return Ok(None);
        }
        buf.push(byte[0]);
        if buf.ends_with(b"\r\n\r\n") || buf.ends_with(b"\n\n") {
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// The latest refusal per host, so a failed fetch can say why.
/// Why the proxy last turned a host away: a refusal by policy (403, 400, 405) or an outage on
/// the way (502: resolving or dialling failed; 504: dialling timed out), and when.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: u16,
    pub reason: String,
    pub at: std::time::Instant,
}

impl Refusal {
    /// An outage a client should retry, as opposed to a refusal by policy.
    pub(crate) fn is_outage(&self) -> bool {
        matches!(self.status, 502 | 504)
    }
}

pub type Refusals = Arc<std::sync::Mutex<HashMap<String, Refusal>>>;

fn remember(refusals: &Refusals, host: &str, port: u16, status: u16, why: &str) {
    let refusal = Refusal {
        status,
        reason: format!("{host}:{port}: {why}"),
        at: std::time::Instant::now(),
    };
    let mut table = refusals.lock().expect("refusals lock");
    // Bounded: a client naming many hosts cannot grow it without end.
    if table.len() >= 1024 {
        table.clear();
    }
    table.insert(host.to_owned(), refusal);
}

async fn handle(
    mut client: TcpStream,
    policy: Arc<EgressPolicy>,
    resolver: Arc<dyn Resolve>,
    refusals: Refusals,
) {
    let Ok(Some(head)) = tokio::time::timeout(Duration::from_secs(30), read_head(&mut client))
        .await
        .unwrap_or(Ok(None))
    else {
        return;
    };
    let decision = decide(&policy, resolver.as_ref(), &head).await;
    log(&decision);
    let target = match decision.verdict {
        Verdict::Allow(to) => to,
        Verdict::Refuse(status, why) => {
            remember(&refusals, &decision.host, decision.port, status, &why);
            let text = match status {
                400 => "Bad Request",
                403 => "Forbidden",
                405 => "Method Not Allowed",
                _ => "Bad Gateway",
            };
            let body = format!("{why}\n");
            let reply = format!(
                "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nX-Egress-Reason: {}\r\nConnection: close\r\n\r\n{body}",
                body.len(),
                why.replace(['\r', '\n'], " ")
            );
            let _ = client.write_all(reply.as_bytes()).await;
            return;
        }
    };
    let upstream = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(target: "egress", host = %decision.host, to = %target, error = %e, "dial failed");
            let why = format!("dialling {target} failed: {e}");
            remember(&refusals, &decision.host, decision.port, 502, &why);
            let _ = client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n")
                .await;
            return;
        }
        Err(_) => {
            let why = format!("dialling {target} timed out");
            remember(&refusals, &decision.host, decision.port, 504, &why);
            let _ = client
                .write_all(b"HTTP/1.1 504 Gateway Timeout\r\nConnection: close\r\n\r\n")
                .await;
            return;
        }
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let (mut client, mut upstream) = (client, upstream);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// Connections a proxy serves at once, unless told fewer: more wait in the listener's
/// backlog.
pub const AT_ONCE: usize = 1024;

/// Serves until the listener fails, `at_once` connections at a time.
pub async fn serve(
    listener: TcpListener,
    policy: Arc<EgressPolicy>,
    resolver: Arc<dyn Resolve>,
    refusals: Refusals,
    at_once: usize,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(at_once));
    // Connections end with the server: dropping this future (an executor's proxy whose
    // sandbox is gone) aborts them.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                let (policy, resolver, refusals) =
                    (policy.clone(), resolver.clone(), refusals.clone());
                connections.spawn(async move {
                    handle(stream, policy, resolver, refusals).await;
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "proxy accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A proxy on a loopback port of its own, in a thread of its own, for in-process fetches.
pub(crate) struct EmbeddedProxy {
    pub addr: SocketAddr,
    refusals: Refusals,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl EmbeddedProxy {
    pub fn start(policy: EgressPolicy) -> Result<EmbeddedProxy> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| Error::internal(format!("egress proxy: {e}")))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| Error::internal(e.to_string()))?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| Error::internal(e.to_string()))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let refusals = Refusals::default();
        let seen = refusals.clone();
        std::thread::Builder::new()
            .name("egress-proxy".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(std_listener).expect("a listener");
                    tokio::select! {
                        _ = serve(listener, Arc::new(policy), Arc::new(SystemResolver), seen, AT_ONCE) => {}
                        _ = stopped => {}
                    }
                });
            })
            .map_err(|e| Error::internal(format!("egress proxy thread: {e}")))?;
        Ok(EmbeddedProxy {
            addr,
            refusals,
            stop: Some(stop),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Why the proxy last refused `host`, if it did.
    pub fn refusal(&self, host: &str) -> Option<Refusal> {
        self.refusals
            .lock()
            .expect("refusals lock")
            .get(host)
            .cloned()
    }
}

impl Drop for EmbeddedProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

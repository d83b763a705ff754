//! A bubblewrap sandbox's way out, with `network: egress`, the same as a Docker executor's:
//! only through the egress proxy, with the executor's allowlist. The sandbox keeps its own
//! network namespace with only a loopback and no route; the harness listens on
//! `127.0.0.1:3128` inside that namespace (a socket made by a thread that entered it) and
//! serves the listener with the proxy, in the harness's own namespace. A run reaches the
//! proxy and nothing else.

use cloud_harness_error::{Error, Result};
use cloud_harness_provision::egress::{EgressPolicy, SystemResolver};
use std::sync::Arc;
use std::time::Duration;

/// The proxy's address inside a sandbox.
pub const PROXY_URL: &str = "http://127.0.0.1:3128";
const LISTEN: &str = "127.0.0.1:3128";

/// Connections a sandbox's proxy serves at once (more wait in its backlog): one workspace's
/// runs hold no more of the harness's descriptors than this.
const AT_ONCE: usize = 64;

/// How long the sandbox's loopback may take to come up (bubblewrap sets it up in the child).
const LOOPBACK_UP: Duration = Duration::from_secs(5);

/// A listener on the proxy's address in the network namespace of host pid `pid`.
pub fn listen_in(pid: u32) -> Result<std::net::TcpListener> {
    let failed = |what: &str, e: std::io::Error| {
        Error::internal(format!("the sandbox's egress proxy: {what}: {e}"))
    };
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| failed("its network namespace", e))?;
    // A sandbox gone and its pid reused by a process of the host's namespace: never listen
    // there.
    let inode = |m: std::io::Result<std::fs::Metadata>| {
        use std::os::unix::fs::MetadataExt;
        m.map(|m| (m.dev(), m.ino()))
    };
    if inode(ns.metadata()).ok() == inode(std::fs::metadata("/proc/self/ns/net")).ok() {
        return Err(Error::internal(
            "the sandbox's egress proxy: its process is in the harness's own network namespace",
        ));
    }
    // A thread of its own enters the namespace (a namespace is per thread) and ends there.
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| failed("entering its network namespace", e.into()))?;
            let started = std::time::Instant::now();
            loop {
                match std::net::TcpListener::bind(LISTEN) {
                    Ok(listener) => return Ok(listener),
                    // Its loopback (and 127.0.0.1 with it) is not up yet.
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AddrNotAvailable
                            && started.elapsed() < LOOPBACK_UP =>
                    {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => return Err(failed("listening on 127.0.0.1:3128", e)),
                }
            }
        })
        .join()
        .map_err(|_| Error::internal("the sandbox's egress proxy: its thread failed"))?
    })
}

/// Serves `listener` with the proxy and `policy`, on the links' runtime, until aborted.
pub fn serve(
    listener: std::net::TcpListener,
    policy: Arc<EgressPolicy>,
) -> Result<tokio::task::JoinHandle<()>> {
    let _inside = super::link::runtime().enter();
    listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
        .map(|listener| {
            tokio::spawn(cloud_harness_provision::proxy::serve(
                listener,
                policy,
                Arc::new(SystemResolver),
                Default::default(),
                AT_ONCE,
            ))
        })
        .map_err(|e| Error::internal(format!("the sandbox's egress proxy: {e}")))
}

//! Accepting HTTP connections for `serve --http`: what a server facing untrusted clients needs
//! and `axum::serve` does not give. Every connection gets `TCP_NODELAY` (small answers on a
//! reused connection otherwise wait for a delayed ACK), a request head must arrive within the
//! header timeout (a slowloris connection is closed), and at most a fixed number are open at
//! once: one over the cap is answered 503 with `Retry-After` and closed, so file descriptors
//! stay bounded.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Connections open at once.
pub(crate) const MAX_CONNECTIONS: usize = 1024;
/// How long a client may take to send a request head (also an idle keep-alive connection's
/// wait for its next request).
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
        }
    }
}

impl Limits {
    /// The defaults, `CLOUD_HARNESS_HTTP_MAX_CONNECTIONS` and
    /// `CLOUD_HARNESS_HTTP_HEADER_TIMEOUT` (seconds) overriding them.
    pub fn from_env() -> cloud_harness_error::Result<Limits> {
        use cloud_harness_control::config::env_number;
        let d = Limits::default();
        let max = env_number(
            "CLOUD_HARNESS_HTTP_MAX_CONNECTIONS",
            d.max_connections as u64,
        )?;
        let secs = env_number(
            "CLOUD_HARNESS_HTTP_HEADER_TIMEOUT",
            d.header_timeout.as_secs(),
        )?;
        Ok(Limits {
            max_connections: (max as usize).max(1),
            header_timeout: Duration::from_secs(secs.max(1)),
        })
    }
}

const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// How long requests in flight may take to finish once the server is asked to stop.
pub(crate) const DRAIN: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `stop`; then lets open requests finish, for at most
/// [`DRAIN`] (a slow script run is then cut short by the shutdown that follows).
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, stop: CancellationToken) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let tasks = tokio_util::task::TaskTracker::new();
    loop {
        let (mut tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tasks.spawn(async move {
                let _ = tcp.write_all(BUSY).await;
                let _ = tcp.shutdown().await;
                // Take what the client sent (briefly), so the close is not a reset that
                // could lose the answer on its way.
                let mut sink = [0u8; 4096];
                let drain = async { while let Ok(1..) = tcp.read(&mut sink).await {} };
                let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
            });
            continue;
        };
        let _ = tcp.set_nodelay(true);
        // Each request knows its client's address (per-client caps use it).
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let mut router = router.clone();
            async move { tower_service::Service::call(&mut router, request).await }
        });
        let stop = stop.clone();
        tasks.spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(permit);
        });
    }
    tasks.close();
    if tokio::time::timeout(DRAIN, tasks.wait()).await.is_err() {
        tracing::warn!(
            seconds = DRAIN.as_secs(),
            "requests still in flight after the drain; stopping them"
        );
    }
}

//! `cloud-harness proxy`: the egress proxy as a process of its own (the harness runs it as
//! `provisioning-proxy:3128` for helper containers).

use clap::Args;
use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_error::{Error, Result};
use cloud_harness_provision::egress::{EgressPolicy, SystemResolver};
use cloud_harness_provision::proxy;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:3128", value_name = "ADDR")]
    pub listen: SocketAddr,
}

/// Serves until SIGTERM or SIGINT. The policy comes from `ALLOWED_GIT_HOSTS`,
/// `CLOUD_HARNESS_ALLOW_CIDRS` and `CLOUD_HARNESS_RESOLVE`.
pub fn run(args: &ProxyArgs) -> Result<u8> {
    let policy = Arc::new(EgressPolicy::from_env(HostPolicy::from_env()?)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::internal(format!("starting the runtime: {e}")))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| Error::internal(format!("binding {}: {e}", args.listen)))?;
        let bound = listener.local_addr().map_err(|e| Error::internal(e.to_string()))?;
        eprintln!("cloud-harness: egress proxy listening on {bound}");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| Error::internal(e.to_string()))?;
        tokio::select! {
            _ = proxy::serve(listener, policy, Arc::new(SystemResolver), proxy::Refusals::default(), proxy::AT_ONCE) => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        Ok(0)
    })
}

//! The provisioning network and its egress proxy, kept warm: made on a process's first fetch
//! in a helper container (one pair per egress policy), checked before every later fetch, and
//! shared by them, so a fetch pays for its own fresh, hardened helper and nothing else. The
//! pair is removed when the last handle to it goes (the process's end); one left by a process
//! that died is removed by the next process to look, on the same machine.
//!
//! A long-lived process also keeps fresh helpers on standby on the warm network (`standby`),
//! removed before it.
//!
//! What sharing changes: helpers of concurrent fetches of one process sit on the same internal
//! network (and helpers on standby, waiting for their job). Each can reach the proxy, as before, and the other helpers, which listen on
//! nothing and run with every capability dropped; nothing else is reachable.

use crate::containers::{isolated_network_options, start_proxy};
use crate::engine::{block_on, connect, docker_error, remove_container};
use crate::ownership::labels;
use crate::standby::{self, Standby};
use bollard::models::NetworkCreateRequest;
use bollard::query_parameters::{InspectContainerOptions, InspectNetworkOptions};
use bollard::Docker;
use cloud_harness_error::{Code, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A warm network and the proxy on it.
#[derive(Clone, Debug)]
pub(crate) struct Pair {
    pub network: String,
    pub proxy: String,
    pub proxy_ip: String,
}

/// The pairs of this process, by egress policy (the proxy's environment), and the helpers on
/// standby on their networks.
#[derive(Default)]
pub(crate) struct Warm {
    pairs: tokio::sync::Mutex<HashMap<Vec<String>, Pair>>,
    pub(crate) standby: Arc<Standby>,
    /// Released (the server is stopping): no pair is made any more.
    closed: AtomicBool,
}

/// How long a release waits for a pair being made (the start-up warm-up, a fetch's first) to
/// be done, so that it is removed too rather than left behind by the process's end.
const RELEASE_WAIT: Duration = Duration::from_secs(20);

impl Warm {
    /// The pair for `policy`, made now if there is none or the one there no longer answers.
    pub(crate) async fn take(
        &self,
        docker: &Docker,
        image: &str,
        policy: Vec<String>,
    ) -> Result<Pair> {
        let mut pairs = self.pairs.lock().await;
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::new(
                Code::Upstream,
                "the server is stopping: no provisioning network is made any more",
            ));
        }
        if let Some(pair) = pairs.get(&policy) {
            if healthy(docker, pair).await {
                return Ok(pair.clone());
            }
            tracing::warn!(proxy = %pair.proxy, "the warm egress proxy stopped answering; making a new one");
            for helper in self.standby.on_network(&pair.network) {
                remove_container(docker, &helper).await;
            }
            remove(docker, pair).await;
            pairs.remove(&policy);
        }
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let pair = Pair {
            network: format!("cloud-harness-prov-{id}"),
            proxy: format!("cloud-harness-proxy-{id}"),
            proxy_ip: String::new(),
        };
        // Known before it is made: a fetch cancelled meanwhile (its time is up) leaves a
        // half-made pair that the next take, a release or the end of the process removes.
        pairs.insert(policy.clone(), pair.clone());
        match make(docker, image, &pair, policy.clone()).await {
            Ok(ip) => {
                let pair = Pair {
                    proxy_ip: ip,
                    ..pair
                };
                pairs.insert(policy, pair.clone());
                Ok(pair)
            }
            Err(e) => {
                remove(docker, &pair).await;
                pairs.remove(&policy);
                Err(e)
            }
        }
    }
}

async fn make(docker: &Docker, image: &str, pair: &Pair, env: Vec<String>) -> Result<String> {
    docker
        .create_network(NetworkCreateRequest {
            name: pair.network.clone(),
            driver: Some("bridge".into()),
            internal: Some(true),
            options: Some(isolated_network_options()),
            labels: Some(labels(true)),
            ..Default::default()
        })
        .await
        .map_err(|e| docker_error("creating the internal network", e))?;
    // The proxy: the only member of the internal network that can reach out.
    start_proxy(
        docker,
        image,
        &pair.proxy,
        &pair.network,
        "provisioning-proxy",
        env,
        labels(true),
    )
    .await
}

/// The pair was made whole, the proxy runs and the network is there.
async fn healthy(docker: &Docker, pair: &Pair) -> bool {
    if pair.proxy_ip.is_empty() {
        return false;
    }
    let running = docker
        .inspect_container(&pair.proxy, None::<InspectContainerOptions>)
        .await
        .ok()
        .and_then(|c| c.state.and_then(|s| s.running))
        .unwrap_or(false);
    running
        && docker
            .inspect_network(&pair.network, None::<InspectNetworkOptions>)
            .await
            .is_ok()
}

async fn remove(docker: &Docker, pair: &Pair) {
    remove_container(docker, &pair.proxy).await;
    if let Err(e) = docker.remove_network(&pair.network).await {
        if !e.to_string().contains("No such network") && !e.to_string().contains("not found") {
            tracing::warn!(network = %pair.network, error = %e, "removing the network failed");
        }
    }
}

impl Warm {
    /// Removes the pairs now and makes no more (a server's shutdown: fetches still running
    /// then may hold handles for a while). A pair being made is waited for (at most
    /// [`RELEASE_WAIT`]) and removed with the others.
    pub(crate) fn release(&self) {
        self.closed.store(true, Ordering::SeqCst);
        standby::remove_now(self.standby.drain());
        // Polled rather than awaited: callers may be on a runtime's thread or on none.
        let deadline = Instant::now() + RELEASE_WAIT;
        loop {
            if let Ok(mut pairs) = self.pairs.try_lock() {
                remove_all(std::mem::take(&mut *pairs).into_values().collect());
                return;
            }
            if Instant::now() > deadline {
                tracing::warn!("a provisioning network still being made at shutdown is left to the next start's sweep");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        // The helpers on standby first: a network is not removed while a container is on it.
        standby::remove_now(self.standby.drain());
        remove_all(std::mem::take(self.pairs.get_mut()).into_values().collect());
    }
}

fn remove_all(pairs: Vec<Pair>) {
    if pairs.is_empty() {
        return;
    }
    let removed = block_on(async move {
        let docker = connect().await?;
        for pair in &pairs {
            remove(&docker, pair).await;
        }
        Ok(())
    });
    if let Err(e) = removed {
        tracing::warn!(error = %e, "cannot remove the warm provisioning network and proxy");
    }
}

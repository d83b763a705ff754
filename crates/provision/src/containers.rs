//! What every container of provisioning shares: the hardening of their host settings, and the
//! egress proxy container (the one way out of an internal network, for helpers and for
//! executors with egress).

use crate::engine::docker_error;
use bollard::models::{ContainerCreateBody, EndpointSettings, HostConfig, NetworkConnectRequest};
use bollard::query_parameters::CreateContainerOptions;
use bollard::Docker;
use cloud_harness_error::{Code, Error, Result};
use futures_util::StreamExt;
use std::collections::HashMap;

pub(crate) const PROXY_PORT: u16 = 3128;

pub(crate) async fn start(docker: &Docker, name: &str, what: &str) -> Result<(), Error> {
    docker
        .start_container(
            name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(|e| docker_error(what, e))
}

pub(crate) fn hardened(network_mode: &str, memory: i64) -> HostConfig {
    HostConfig {
        network_mode: Some(network_mode.to_owned()),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        readonly_rootfs: Some(true),
        memory: Some(memory),
        pids_limit: Some(128),
        ..Default::default()
    }
}

/// Options of an internal network whose members reach only each other: the host gets no
/// address on it, so its own services are out of reach too.
pub fn isolated_network_options() -> HashMap<String, String> {
    let mut options = HashMap::new();
    options.insert(
        "com.docker.network.bridge.inhibit_ipv4".to_owned(),
        "true".to_owned(),
    );
    options
}

/// Starts an egress proxy container from `image` on the default bridge (its way out) and on
/// the internal `network` as `alias`; its address there.
pub async fn start_proxy(
    docker: &Docker,
    image: &str,
    name: &str,
    network: &str,
    alias: &str,
    env: Vec<String>,
    labels: HashMap<String, String>,
) -> Result<String> {
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.to_owned()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(image.to_owned()),
                cmd: Some(vec![
                    "/cloud-harness".into(),
                    "proxy".into(),
                    "--listen".into(),
                    format!("0.0.0.0:{PROXY_PORT}"),
                ]),
                env: Some(env),
                user: Some("65534:65534".into()),
                labels: Some(labels),
                host_config: Some(hardened("bridge", 256 << 20)),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| docker_error("creating the proxy container", e))?;
    docker
        .connect_network(
            network,
            NetworkConnectRequest {
                container: name.to_owned(),
                endpoint_config: Some(EndpointSettings {
                    aliases: Some(vec![alias.to_owned()]),
                    ..Default::default()
                }),
            },
        )
        .await
        .map_err(|e| docker_error("attaching the proxy to the internal network", e))?;
    start(docker, name, "starting the proxy").await?;
    wait_listening(docker, name).await?;
    let inspect = docker
        .inspect_container(
            name,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .map_err(|e| docker_error("inspecting the proxy", e))?;
    inspect
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|n| n.get(network).and_then(|e| e.ip_address.clone()))
        .filter(|ip| !ip.is_empty())
        .ok_or_else(|| Error::internal("the proxy has no address on the internal network"))
}

/// Waits until the proxy container says it listens (it prints so once bound).
async fn wait_listening(docker: &Docker, proxy: &str) -> Result<()> {
    for _ in 0..200 {
        let text = logs_text(docker, proxy).await;
        if text.contains("listening on") {
            return Ok(());
        }
        if let Some(error) = text.lines().find(|l| l.starts_with("error: ")) {
            return Err(Error::new(
                Code::Upstream,
                format!("the egress proxy container failed: {error}"),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    Err(Error::new(
        Code::Upstream,
        "the egress proxy container did not start",
    ))
}

/// The reason of the proxy container's last refusal of `host` since `since` (Unix seconds),
/// from its log: the proxy may serve other fetches too, whose refusals are not this one's.
pub(crate) async fn proxy_refusal(
    docker: &Docker,
    proxy: &str,
    since: i64,
    host: &str,
) -> Option<String> {
    let options = bollard::query_parameters::LogsOptions {
        stdout: true,
        stderr: true,
        since: i32::try_from(since).unwrap_or(0),
        ..Default::default()
    };
    let text = logs_with(docker, proxy, options).await;
    let wanted = format!("host={host} ");
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("refuse") && l.contains(&wanted))?;
    Some(
        line.split("reason=")
            .nth(1)
            .unwrap_or(line)
            .trim()
            .to_owned(),
    )
}

/// A container's log so far, stdout and stderr together.
async fn logs_text(docker: &Docker, container: &str) -> String {
    let options = bollard::query_parameters::LogsOptions {
        stdout: true,
        stderr: true,
        ..Default::default()
    };
    logs_with(docker, container, options).await
}

async fn logs_with(
    docker: &Docker,
    container: &str,
    options: bollard::query_parameters::LogsOptions,
) -> String {
    let mut logs = docker.logs(container, Some(options));
    let mut text = String::new();
    while let Some(Ok(chunk)) = logs.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
    }
    text
}

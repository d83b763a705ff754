//! The docker executor: one long-lived container per workspace, created when it opens and
//! removed when it closes, whose init is the run agent. No new privileges, a read-only root,
//! pid and memory limits, and no network (or, with `network: egress`, an internal network
//! whose only way out is an egress proxy container). The agent is root with only the
//! capabilities it needs to start runs as the executor's non-root user (setuid, setgid,
//! setpcap, kill); a run keeps none. The agent listens on a socket in a folder of the
//! workspace's that only root may enter (`<workspace>/agent`, `/run/cloud-harness/socket`).
//!
//! Without a registry, the image is made here: an empty root of mount points and identity
//! files, into which the host's userland is bound read-only. An operator's own image
//! (`CLOUD_HARNESS_EXECUTOR_IMAGE`) replaces both; the agent, bound in from the host, needs
//! its C library (glibc and libssl 3, as Debian 12 has them).

use super::bwrap::AGENT;
use super::link::Link;
use super::userland::{self, Entry};
use super::{Network, Places, Settings, Spec, ROOT, WORKSPACE};
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{CreateContainerOptions, RemoveContainerOptions};
use bollard::Docker;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::engine::{
    connect, docker_error, ensure_image, remove_container, RootFs,
};
use cloud_harness_store::cas::Digest;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

pub(crate) const LABEL: &str = "io.cloud-harness.executor";
/// The workspace folder on the host, so an operator (or a test) can tell whose it is.
pub(crate) const DIR_LABEL: &str = "io.cloud-harness.workspace-dir";
const EGRESS_ALIAS: &str = "egress-proxy";
/// The agent's socket folder inside, and the socket's name in it.
const SOCKET_DIR: &str = "/run/cloud-harness/socket";
const SOCKET: &str = "agent.sock";
/// How long a started container's agent may take to listen.
const AGENT_START: Duration = Duration::from_secs(15);
pub(crate) const EGRESS_PROXY_URL: &str = "http://egress-proxy:3128";

/// The egress network and proxy of an executor with `network: egress`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    pub network: String,
    pub proxy: String,
}

/// What an egress proxy container runs: the helper image and the policy's environment.
pub struct EgressProxy {
    pub image: String,
    pub env: Vec<String>,
}

pub struct Made {
    pub container: String,
    pub egress: Option<Egress>,
}

/// The default image's root: mount points, and the identity files of `uid`.
fn rootfs(uid: u32, gid: u32) -> Result<Vec<u8>> {
    let mut tar = RootFs::default();
    let mut dirs = vec![
        "etc",
        "proc",
        "dev",
        "sys",
        "workspace",
        "opt/cloud-harness",
        "run/cloud-harness/socket",
    ];
    // Docker binds its init at /sbin/docker-init, which must not lead into the read-only /usr.
    dirs.push("sbin");
    for entry in userland::entries() {
        match entry {
            Entry::Symlink(path, target) if *path != "/sbin" && !path.starts_with("/etc/") => {
                tar.symlink(path, target)?
            }
            Entry::Bind(path) if *path != "/sbin" && !path.starts_with("/etc/") => {
                dirs.push(path.trim_start_matches('/'))
            }
            _ => {}
        }
    }
    for dir in dirs {
        tar.dir(dir, 0o755)?;
    }
    tar.dir("tmp", 0o1777)?;
    for (name, text) in userland::identity(uid, gid) {
        tar.file(&format!("etc/{name}"), text.as_bytes(), 0o644)?;
    }
    tar.finish()
}

fn container_name(workspace: &str) -> String {
    format!("cloud-harness-exec-{workspace}")
}

/// Creates and starts the container of a new workspace. Nothing is left behind on failure.
pub fn create(
    settings: &Settings,
    places: &Places,
    workspace: &str,
    agent: &Path,
    egress_proxy: impl FnOnce() -> Result<EgressProxy>,
) -> Result<Made> {
    let proxy = match settings.network {
        Network::Egress => Some(egress_proxy()?),
        Network::None => None,
    };
    let settings = settings.clone();
    let places = places.clone();
    let workspace = workspace.to_owned();
    let agent = agent.to_owned();
    socket_dir(&places.agent)?;
    cloud_harness_provision::engine::block_on(async move {
        let docker = connect().await?;
        let made = make(&docker, &settings, &places, &workspace, &agent, proxy).await;
        if made.is_err() {
            remove_container(&docker, &container_name(&workspace)).await;
            remove_egress(&docker, &egress_names(&workspace)).await;
        }
        made
    })
}

fn egress_names(workspace: &str) -> Egress {
    Egress {
        network: format!("cloud-harness-exec-net-{workspace}"),
        proxy: format!("cloud-harness-exec-proxy-{workspace}"),
    }
}

async fn make(
    docker: &Docker,
    settings: &Settings,
    places: &Places,
    workspace: &str,
    agent: &Path,
    proxy: Option<EgressProxy>,
) -> Result<Made> {
    let image = match &settings.image {
        Some(image) => {
            docker.inspect_image(image).await.map_err(|e| {
                Error::new(
                    Code::NotFound,
                    format!("CLOUD_HARNESS_EXECUTOR_IMAGE {image:?} is not in the Docker engine (no registry is used: load it first): {e}"),
                )
            })?;
            image.clone()
        }
        None => {
            let body = rootfs(settings.uid, settings.gid)?;
            let name = format!("cloud-harness-executor:{}", &Digest::of(&body).hex()[..16]);
            ensure_image(docker, &name, || Ok(body)).await?;
            name
        }
    };
    let mut labels = HashMap::new();
    labels.insert(LABEL.to_owned(), workspace.to_owned());
    if let Some(dir) = places.repo.parent() {
        labels.insert(DIR_LABEL.to_owned(), dir.display().to_string());
    }

    let mut binds = Vec::new();
    if settings.image.is_none() {
        for entry in userland::entries() {
            if let Entry::Bind(path) = entry {
                binds.push(format!("{path}:{path}:ro"));
            }
        }
    }
    binds.push(format!("{}:{WORKSPACE}:rw", places.repo.display()));
    binds.push(format!("{}:{AGENT}:ro", agent.display()));
    binds.push(format!("{}:{SOCKET_DIR}:rw", places.agent.display()));
    // Slave propagation: the FUSE mounts a restarted server makes show through.
    binds.push(format!("{}:{ROOT}:ro,rslave", places.mounts.display()));

    let mut network_mode = "none".to_owned();
    let mut extra_hosts = None;
    let mut egress = None;
    if let Some(proxy) = proxy {
        let names = egress_names(workspace);
        // Internal (no way out but the proxy), and no address of the host's on it.
        docker
            .create_network(NetworkCreateRequest {
                name: names.network.clone(),
                driver: Some("bridge".into()),
                internal: Some(true),
                options: Some(cloud_harness_provision::containers::isolated_network_options()),
                labels: Some(labels.clone()),
                ..Default::default()
            })
            .await
            .map_err(|e| docker_error("creating the executor's internal network", e))?;
        egress = Some(names.clone());
        let ip = cloud_harness_provision::containers::start_proxy(
            docker,
            &proxy.image,
            &names.proxy,
            &names.network,
            EGRESS_ALIAS,
            proxy.env,
            labels.clone(),
        )
        .await?;
        network_mode = names.network.clone();
        extra_hosts = Some(vec![format!("{EGRESS_ALIAS}:{ip}")]);
    }

    let mut tmpfs = HashMap::new();
    tmpfs.insert(
        "/tmp".to_owned(),
        "rw,nosuid,nodev,size=1g,mode=1777".to_owned(),
    );
    let limits = super::executor_limits();
    let host = HostConfig {
        binds: Some(binds),
        network_mode: Some(network_mode),
        extra_hosts,
        dns: egress.as_ref().map(|_| vec!["127.0.0.1".to_owned()]),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(
            ["SETUID", "SETGID", "SETPCAP", "KILL"]
                .map(String::from)
                .to_vec(),
        ),
        security_opt: Some(vec!["no-new-privileges".into()]),
        readonly_rootfs: Some(true),
        memory: Some(limits.memory as i64),
        // No swap beyond it (Docker would allow as much again).
        memory_swap: Some(limits.memory as i64),
        pids_limit: Some(limits.processes as i64),
        init: Some(false),
        tmpfs: Some(tmpfs),
        ..Default::default()
    };
    let name = container_name(workspace);
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(image),
                entrypoint: Some(vec![AGENT.into()]),
                cmd: Some(vec![
                    crate::agent::COMMAND.into(),
                    "--listen".into(),
                    format!("{SOCKET_DIR}/{SOCKET}"),
                ]),
                env: Some(
                    crate::agent::ENV
                        .iter()
                        .map(|(name, value)| format!("{name}={value}"))
                        .collect(),
                ),
                user: Some("0:0".into()),
                working_dir: Some(WORKSPACE.into()),
                hostname: Some("executor".into()),
                labels: Some(labels),
                host_config: Some(host),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| docker_error("creating the executor container", e))?;
    docker
        .start_container(
            &name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(|e| docker_error("starting the executor container", e))?;
    Ok(Made {
        container: created.id,
        egress,
    })
}

async fn remove_egress(docker: &Docker, egress: &Egress) {
    remove_container(docker, &egress.proxy).await;
    let _ = docker.remove_network(&egress.network).await;
}

/// Removes every container and network labelled as the workspace at `dir`'s (a workspace
/// whose open was cut short has no record to name them).
pub fn remove_by_dir(dir: &std::path::Path) -> Result<()> {
    let label = format!("{DIR_LABEL}={}", dir.display());
    cloud_harness_provision::engine::block_on(async move {
        let docker = connect().await?;
        cloud_harness_provision::engine::remove_labelled(&docker, &label, |_| true).await
    })
}

/// Removes the container (killing whatever runs in it) and its egress network.
pub async fn remove(spec: &Spec) -> Result<()> {
    let docker = connect().await?;
    if let Some(id) = &spec.id {
        match docker
            .remove_container(
                id,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if e.to_string().contains("No such container") => {}
            Err(e) => return Err(docker_error("removing the executor container", e)),
        }
    }
    if let Some(egress) = &spec.egress {
        remove_egress(&docker, egress).await;
    }
    Ok(())
}

fn gone(container: &str, workspace: &str) -> Error {
    Error::new(
        Code::Upstream,
        format!(
            "the executor of workspace {workspace} is gone: the Docker engine has no container {}; close the workspace and open it again",
            &container[..container.len().min(12)]
        ),
    )
    .with_details(serde_json::json!({ "workspace": workspace, "container": container }))
}

/// Makes the agent's socket folder on the host: root's only, so runs cannot enter it.
fn socket_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::io(dir, e))
}

/// Connects to the socket in `dir` through `/proc/self/fd`, so a long home's path does not
/// pass the 108 bytes a socket address holds.
pub(crate) fn dial(dir: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    use std::os::fd::AsRawFd;
    let folder = std::fs::File::open(dir)?;
    std::os::unix::net::UnixStream::connect(format!(
        "/proc/self/fd/{}/{SOCKET}",
        folder.as_raw_fd()
    ))
}

/// Links to the agent of the workspace's container: started again when it stopped (after a
/// reboot, say), waited for while it starts; a missing container is gone.
pub async fn link(container: &str, workspace: &str, places: &Places) -> Result<Link> {
    if let Ok(stream) = dial(&places.agent) {
        return linked(stream);
    }
    let docker = connect().await?;
    let started = Instant::now();
    loop {
        // Started again when it is not running. An agent killed a moment ago can leave its
        // container still reported running until the engine has seen it end: looked at
        // again while its socket does not answer.
        start_if_stopped(&docker, container, workspace).await?;
        let looked = Instant::now();
        while looked.elapsed() < LOOK_AGAIN {
            match dial(&places.agent) {
                Ok(stream) => return linked(stream),
                Err(e) if started.elapsed() > AGENT_START => {
                    return Err(Error::new(
                        Code::Upstream,
                        format!(
                            "the run agent of workspace {workspace}'s executor does not answer ({e}); close the workspace and open it again"
                        ),
                    ))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

/// How long a container the engine says is running is given to answer before it is looked
/// at again.
const LOOK_AGAIN: Duration = Duration::from_millis(500);

/// Starts the workspace's container unless the engine says it is running; a missing one is
/// gone.
async fn start_if_stopped(docker: &Docker, container: &str, workspace: &str) -> Result<()> {
    let running = match docker
        .inspect_container(
            container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
    {
        Ok(c) => c.state.and_then(|s| s.running).unwrap_or(false),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => return Err(gone(container, workspace)),
        Err(e) => return Err(docker_error("looking at the executor container", e)),
    };
    if !running {
        docker
            .start_container(
                container,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .map_err(|e| docker_error("starting the stopped executor container", e))?;
    }
    Ok(())
}

/// A link over a socket connected to a container's agent, whose runs report on the
/// container's memory (found from the agent's host pid, which the socket knows).
fn linked(stream: std::os::unix::net::UnixStream) -> Result<Link> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let memory = getsockopt(&stream, PeerCredentials)
        .ok()
        .and_then(|c| u32::try_from(c.pid()).ok())
        .and_then(super::cgroup::Memory::of_process);
    Ok(Link::new(stream, None)?.of_container(memory))
}

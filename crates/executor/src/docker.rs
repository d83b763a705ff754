//! The docker executor: one long-lived container per workspace, created when it opens and
//! removed when it closes. Every capability dropped, no new privileges, a read-only root, a
//! non-root user, pid and memory limits, and no network (or, with `network: egress`, an
//! internal network whose only way out is an egress proxy container).
//!
//! Without a registry, the image is made here: an empty root of mount points and identity
//! files, into which the host's userland is bound read-only. An operator's own image
//! (`CLOUD_HARNESS_EXECUTOR_IMAGE`) replaces both; it needs `sleep`.

use super::process::{kill_group, Exit, Process, Stream};
use super::userland::{self, Entry};
use super::{Network, Places, Settings, Spec, ROOT, WORKSPACE};
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{CreateContainerOptions, RemoveContainerOptions};
use bollard::Docker;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::engine::{
    connect, docker_error, ensure_image, remove_container, RootFs,
};
use cloud_harness_store::cas::Digest;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Notify};

pub(crate) const LABEL: &str = "io.cloud-harness.executor";
/// The workspace folder on the host, so an operator (or a test) can tell whose it is.
pub(crate) const DIR_LABEL: &str = "io.cloud-harness.workspace-dir";
const MEMORY: i64 = 2 << 30;
const PIDS: i64 = 1024;
const EGRESS_ALIAS: &str = "egress-proxy";
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

/// The run limits as the container's ulimits, which every process `docker exec` starts
/// inherits.
fn ulimits(limits: super::rlimits::RunLimits) -> Vec<bollard::models::ResourcesUlimits> {
    let ulimit = |name: &str, value: u64| bollard::models::ResourcesUlimits {
        name: Some(name.to_owned()),
        soft: Some(value.min(i64::MAX as u64) as i64),
        hard: Some(value.min(i64::MAX as u64) as i64),
    };
    vec![
        ulimit("cpu", limits.cpu_seconds),
        ulimit("data", limits.memory),
    ]
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
    egress_proxy: impl FnOnce() -> Result<EgressProxy>,
) -> Result<Made> {
    let proxy = match settings.network {
        Network::Egress => Some(egress_proxy()?),
        Network::None => None,
    };
    let settings = settings.clone();
    let places = places.clone();
    let workspace = workspace.to_owned();
    cloud_harness_provision::engine::block_on(async move {
        let docker = connect().await?;
        let made = make(&docker, &settings, &places, &workspace, proxy).await;
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
    let host = HostConfig {
        binds: Some(binds),
        network_mode: Some(network_mode),
        extra_hosts,
        dns: egress.as_ref().map(|_| vec!["127.0.0.1".to_owned()]),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        readonly_rootfs: Some(true),
        memory: Some(MEMORY),
        pids_limit: Some(PIDS),
        // Each process's CPU time and memory, as bubblewrap's runs get them (`[limits]`).
        ulimits: Some(ulimits(super::rlimits::RunLimits::current())),
        init: Some(true),
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
                cmd: Some(vec!["sleep".into(), "infinity".into()]),
                user: Some(format!("{}:{}", settings.uid, settings.gid)),
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

/// Starts `argv` in the container; the exec's input is left open when `stdin` is asked for.
/// A stopped container (after a reboot, say) is started again first; a missing one is gone.
async fn start(
    docker: &Docker,
    container: &str,
    workspace: &str,
    spec: &Spec,
    argv: &[String],
    env: &[(String, String)],
    stdin: bool,
) -> Result<(String, StartExecResults)> {
    let options = CreateExecOptions {
        cmd: Some(argv.to_vec()),
        env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        user: Some(format!("{}:{}", spec.uid, spec.gid)),
        working_dir: Some(WORKSPACE.to_owned()),
        attach_stdin: Some(stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    };
    let status = |e: &bollard::errors::Error| match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => *status_code,
        _ => 0,
    };
    let exec = match docker.create_exec(container, options.clone()).await {
        Ok(exec) => exec,
        Err(e) if status(&e) == 409 => {
            docker
                .start_container(
                    container,
                    None::<bollard::query_parameters::StartContainerOptions>,
                )
                .await
                .map_err(|e| docker_error("starting the stopped executor container", e))?;
            docker
                .create_exec(container, options)
                .await
                .map_err(|e| docker_error("starting a command in the executor", e))?
        }
        Err(e) if status(&e) == 404 => return Err(gone(container, workspace)),
        Err(e) => return Err(docker_error("starting a command in the executor", e)),
    };
    let started = docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: None,
            }),
        )
        .await
        .map_err(|e| docker_error("starting a command in the executor", e))?;
    Ok((exec.id, started))
}

/// The exec's process on this machine, once it runs (runc makes it a session leader, so its
/// process group is everything it started that did not leave it).
async fn host_pid(docker: &Docker, exec: &str) -> i32 {
    for _ in 0..100 {
        if let Ok(i) = docker.inspect_exec(exec).await {
            match i.pid {
                Some(pid) if pid > 0 => return pid as i32,
                _ if i.running == Some(false) => return 0,
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    0
}

/// Waits for the exec's own process to end: when its output closes, or (if something it
/// started keeps the output open) when the engine says it stopped.
async fn wait_exit(docker: &Docker, exec: &str, closed: &Notify) -> Exit {
    let mut output_closed = false;
    loop {
        let poll = if output_closed {
            Duration::from_millis(5)
        } else {
            Duration::from_millis(250)
        };
        tokio::select! {
            _ = closed.notified(), if !output_closed => output_closed = true,
            _ = tokio::time::sleep(poll) => {}
        }
        match docker.inspect_exec(exec).await {
            Ok(i) if i.running == Some(false) => {
                let code = i.exit_code.map(|c| c as i32);
                // A command killed by a signal reports 128 + the signal, as a shell does.
                let signal = code.filter(|c| *c > 128 && *c < 160).map(|c| c - 128);
                return Exit { code, signal };
            }
            Ok(_) => {}
            Err(_) => return Exit::default(),
        }
    }
}

/// Starts `argv` in the container with piped output (for `skills_run`).
pub async fn spawn(
    container: &str,
    workspace: &str,
    spec: &Spec,
    argv: &[String],
    env: &[(String, String)],
) -> Result<Process> {
    let docker = connect().await?;
    let (exec, started) = start(&docker, container, workspace, spec, argv, env, false).await?;
    let StartExecResults::Attached { mut output, .. } = started else {
        return Err(Error::internal("the exec did not attach"));
    };
    let pid = host_pid(&docker, &exec).await;
    let (tx, rx) = mpsc::channel(16);
    let closed = Arc::new(Notify::new());
    {
        let closed = closed.clone();
        tokio::spawn(async move {
            while let Some(Ok(item)) = output.next().await {
                let sent = match item {
                    bollard::container::LogOutput::StdOut { message } => {
                        tx.send((Stream::Stdout, message.to_vec())).await
                    }
                    bollard::container::LogOutput::StdErr { message } => {
                        tx.send((Stream::Stderr, message.to_vec())).await
                    }
                    _ => Ok(()),
                };
                if sent.is_err() {
                    break;
                }
            }
            closed.notify_one();
        });
    }
    let exit = Box::pin(async move { wait_exit(&docker, &exec, &closed).await });
    Ok(Process {
        output: rx,
        exit,
        kill: Box::new(move || kill_group(pid)),
    })
}

/// Runs `argv` in the container with this process's standard streams; its exit status.
pub async fn run_attached(
    container: &str,
    workspace: &str,
    spec: &Spec,
    argv: &[String],
    env: &[(String, String)],
) -> Result<i32> {
    let docker = connect().await?;
    let (exec, started) = start(&docker, container, workspace, spec, argv, env, true).await?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = started
    else {
        return Err(Error::internal("the exec did not attach"));
    };
    let feed = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let _ = tokio::io::copy(&mut stdin, &mut input).await;
        let _ = input.shutdown().await;
    });
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    while let Some(item) = output.next().await {
        match item {
            Ok(bollard::container::LogOutput::StdOut { message }) => {
                let _ = stdout.write_all(&message).await;
                let _ = stdout.flush().await;
            }
            Ok(bollard::container::LogOutput::StdErr { message }) => {
                let _ = stderr.write_all(&message).await;
                let _ = stderr.flush().await;
            }
            Ok(_) => {}
            Err(e) => return Err(docker_error("reading the command's output", e)),
        }
    }
    feed.abort();
    let closed = Notify::new();
    closed.notify_one();
    let exit = wait_exit(&docker, &exec, &closed).await;
    Ok(exit.code.unwrap_or(125))
}

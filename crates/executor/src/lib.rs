//! Executors: where a workspace's commands run, never on the host. Every workspace has one,
//! with one layout whatever the backend:
//!
//! | executor path                     | host side                          | access     |
//! |-----------------------------------|------------------------------------|------------|
//! | `/workspace`                      | `<workspace>/repo`                 | read-write |
//! | `/opt/cloud-harness/skills`       | `<workspace>/mounts/skills` (FUSE) | read-only  |
//! | `/opt/cloud-harness/owner-skills` | `<workspace>/mounts/owner-skills`  | read-only  |
//! | `/opt/cloud-harness/.by-digest/H` | approved skill copies, by digest   | read-only  |
//!
//! `/opt/cloud-harness` is a read-only, slave-propagated bind of `<workspace>/mounts`, itself
//! a shared mount, so the FUSE mounts a restarted server makes show through. The rest is the
//! executor's own read-only root (the host's userland bound read-only) and a private `/tmp`.
//! The harness's state (its home, the store, operator decisions) is never inside.
//!
//! Backends: `docker` (one long-lived container per workspace), `bwrap` (one bubblewrap
//! sandbox per workspace, made at its first run) and `host` (development only: commands run
//! on the host). In both sandboxes a run agent (`agent`, this project's binary in its
//! `executor-agent` mode) is pid 1 and starts every command; the harness hands it runs over a
//! Unix socket (`wire`, `link`).
//!
//! The crate owns where and how a command runs; it knows nothing of MCP, HTTP or the control
//! plane's tables. From provisioning it takes the Docker engine (`engine`, one client for
//! helpers and executors) and the egress proxy on the provisioning network, a Docker
//! executor's one way out.

pub mod agent;
mod bwrap;
pub mod cgroup;
pub mod docker;
mod egress;
mod event;
pub mod launch_mounts;
pub mod launcher;
mod link;
mod process;
mod rlimits;
mod run_stream;
pub mod runner;
mod settings;
pub(crate) mod userland;
mod wire;

use cloud_harness_error::{Code, Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use process::{Exit, Process};
pub use rlimits::RunLimits;
pub use settings::{Choice, Kind, Network, Settings};

pub(crate) const WORKSPACE: &str = "/workspace";
/// Where workspace-scope toolkits are materialized, inside the working tree.
pub const WORKSPACE_SKILLS: &str = ".cloud-harness/skills";
pub(crate) const ROOT: &str = "/opt/cloud-harness";
pub const SKILLS: &str = "/opt/cloud-harness/skills";
pub const OWNER_SKILLS: &str = "/opt/cloud-harness/owner-skills";
/// Copies of approved skills, named by digest: the only place scripts run from.
pub const BY_DIGEST: &str = ".by-digest";
const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Processes the executor's user may have at once (RLIMIT_NPROC), where nothing bounds the
/// executor as a whole (a bubblewrap sandbox allowed to run without a cgroup).
const NPROC: u64 = 1024;
/// Processes a whole executor may have at once (a container's pids limit, a sandbox's
/// cgroup).
pub(crate) const PROCESSES: u64 = 1024;

/// What a whole executor may hold: `[limits] run_memory` of memory for its runs together
/// (each run's processes are also bounded by it one by one), and [`PROCESSES`].
pub(crate) fn executor_limits() -> cgroup::Limits {
    cgroup::Limits {
        memory: cloud_harness_control::limits::quotas().limits.run_memory,
        processes: PROCESSES,
    }
}

/// The error for a run when no executor exists, saying what to install.
pub fn missing() -> Error {
    Error::new(
        Code::Forbidden,
        "this workspace has no executor, and scripts never run on the host: install bubblewrap (Debian: apt-get install bubblewrap) or start a Docker engine, then open the workspace again (CLOUD_HARNESS_EXECUTOR=host runs on the host, for development only)",
    )
}

/// What a workspace's record keeps of its executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub kind: Kind,
    /// The container, for docker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The egress network and proxy container, for docker with `network: egress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<docker::Egress>,
    pub network: Network,
    pub uid: u32,
    pub gid: u32,
}

/// The host folders of a workspace that its executor shows.
#[derive(Debug, Clone)]
pub struct Places {
    /// The working tree: `/workspace`.
    pub repo: PathBuf,
    /// What `/opt/cloud-harness` shows: the two skills mounts and the approved copies.
    pub mounts: PathBuf,
    /// The executor's own `/etc/passwd` and `/etc/group`.
    pub etc: PathBuf,
    /// The folder of a container's agent socket (root's only).
    pub agent: PathBuf,
}

impl Places {
    pub fn of(workspace_dir: &Path) -> Places {
        Places {
            repo: workspace_dir.join("repo"),
            mounts: workspace_dir.join("mounts"),
            etc: workspace_dir.join("etc"),
            agent: workspace_dir.join("agent"),
        }
    }
}

/// A command to run in an executor.
#[derive(Debug, Clone)]
pub struct Command {
    pub argv: Vec<String>,
    /// Besides the executor's own (`PATH`, `HOME`, `LANG`, the layout's paths).
    pub env: Vec<(String, String)>,
    /// Resource limits of the command's processes, if any.
    pub limits: Option<RunLimits>,
}

/// A workspace's executor.
pub struct Executor {
    pub spec: Spec,
    places: Places,
    workspace: String,
    /// The link to the sandbox's run agent, made at the first run and again after the agent
    /// went away.
    link: tokio::sync::Mutex<Option<Arc<link::Link>>>,
    /// What a bubblewrap sandbox with `network: egress` may reach, through the proxy the
    /// harness serves in it.
    egress: Option<Arc<cloud_harness_provision::egress::EgressPolicy>>,
}

/// The binary the run agent is: `CLOUD_HARNESS_EXECUTOR_AGENT`, else this program when it is
/// `cloud-harness`, else a `cloud-harness` beside it or one folder up (a test's or a
/// benchmark's binary sits in `target/*/deps`). Where the server is not the `cloud-harness`
/// binary, it also starts bubblewrap (`executor-launch`, on the host).
pub fn agent_binary() -> Result<PathBuf> {
    if let Some(path) = settings::env("CLOUD_HARNESS_EXECUTOR_AGENT") {
        return Ok(PathBuf::from(path));
    }
    let me = std::env::current_exe().map_err(|e| Error::internal(format!("this program: {e}")))?;
    if me.file_name().is_some_and(|n| n == "cloud-harness") {
        return Ok(me);
    }
    let dir = me.parent().unwrap_or(Path::new("/"));
    [dir.join("cloud-harness"), dir.join("../cloud-harness")]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::new(
                Code::NotFound,
                "the executor's run agent is the cloud-harness binary, and none was found beside this program: set CLOUD_HARNESS_EXECUTOR_AGENT to its path",
            )
        })
}

impl Executor {
    /// Makes the executor of a new workspace (for docker: its container, started).
    pub fn create(
        settings: &Settings,
        kind: Kind,
        places: &Places,
        workspace: &str,
        egress_proxy: impl FnOnce() -> Result<docker::EgressProxy>,
    ) -> Result<Executor> {
        userland::write_identity(&places.etc, settings.uid, settings.gid)?;
        let mut spec = Spec {
            kind,
            id: None,
            egress: None,
            network: settings.network,
            uid: settings.uid,
            gid: settings.gid,
        };
        if kind == Kind::Docker {
            let agent = agent_binary()?;
            let made = docker::create(settings, places, workspace, &agent, egress_proxy)?;
            spec.id = Some(made.container);
            spec.egress = made.egress;
        }
        Ok(Executor::attach(spec, places.clone(), workspace))
    }

    /// The executor a record names (after a restart, or for `cloud-harness exec`).
    pub fn attach(spec: Spec, places: Places, workspace: &str) -> Executor {
        Executor {
            spec,
            places,
            workspace: workspace.to_owned(),
            link: tokio::sync::Mutex::new(None),
            egress: None,
        }
    }

    /// The executor, its bubblewrap sandbox reaching out through a proxy with `policy` when
    /// its network is `egress` (a Docker executor's proxy is a container of its own).
    pub fn with_egress(
        mut self,
        policy: cloud_harness_provision::egress::EgressPolicy,
    ) -> Executor {
        if self.spec.kind == Kind::Bwrap && self.spec.network == Network::Egress {
            self.egress = Some(Arc::new(policy));
        }
        self
    }

    pub fn kind(&self) -> Kind {
        self.spec.kind
    }

    /// The executor's paths for the layout's places (host paths for `host`).
    pub fn paths(&self) -> Paths {
        match self.spec.kind {
            Kind::Host => Paths {
                workspace: self.places.repo.display().to_string(),
                root: self.places.mounts.display().to_string(),
            },
            _ => Paths {
                workspace: WORKSPACE.to_owned(),
                root: ROOT.to_owned(),
            },
        }
    }

    /// What `workspace_open` reports.
    pub fn describe(&self) -> Value {
        let paths = self.paths();
        json!({
            "kind": self.spec.kind,
            "id": self.spec.id,
            "network": self.spec.network,
            "user": { "uid": self.spec.uid, "gid": self.spec.gid },
            "paths": {
                "workspace": paths.workspace,
                "workspaceSkills": format!("{}/{WORKSPACE_SKILLS}", paths.workspace),
                "skills": paths.skills(),
                "ownerSkills": paths.owner_skills(),
            },
        })
    }

    /// The environment every command gets, before its own.
    fn base_env(&self) -> Vec<(String, String)> {
        let paths = self.paths();
        let mut env = vec![
            ("PATH".to_owned(), SAFE_PATH.to_owned()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            (
                "HOME".to_owned(),
                match self.spec.kind {
                    Kind::Host => paths.workspace.clone(),
                    _ => "/tmp".to_owned(),
                },
            ),
            ("CLOUD_HARNESS_WORKSPACE".to_owned(), self.workspace.clone()),
            ("CLOUD_HARNESS_SKILLS".to_owned(), paths.skills()),
            (
                "CLOUD_HARNESS_OWNER_SKILLS".to_owned(),
                paths.owner_skills(),
            ),
        ];
        if self.spec.network == Network::Egress {
            let proxy = match self.spec.kind {
                Kind::Bwrap => egress::PROXY_URL.to_owned(),
                _ => docker::EGRESS_PROXY_URL.to_owned(),
            };
            for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
                env.push((name.to_owned(), proxy.clone()));
            }
        }
        env
    }

    fn full_env(&self, command: &Command) -> Vec<(String, String)> {
        let mut env = self.base_env();
        env.extend(command.env.iter().cloned());
        env
    }

    /// Starts `command` with piped output (for `skills_run`).
    pub async fn spawn(&self, command: &Command) -> Result<Process> {
        let env = self.full_env(command);
        match self.spec.kind {
            Kind::Host => {
                process::spawn_local(&command.argv, Some(&self.places.repo), &env, command.limits)
            }
            _ => Ok(self.start(self.run_start(command, env, false)).await?.0),
        }
    }

    fn run_start(&self, command: &Command, env: Vec<(String, String)>, stdin: bool) -> wire::Start {
        wire::Start {
            argv: command.argv.clone(),
            env,
            cwd: WORKSPACE.to_owned(),
            uid: self.spec.uid,
            gid: self.spec.gid,
            limits: wire::Limits {
                cpu_seconds: command.limits.map(|l| l.cpu_seconds),
                memory: command.limits.map(|l| l.memory),
                processes: NPROC,
            },
            stdin,
        }
    }

    /// Hands a run to the sandbox's agent: once more to a new agent when the one linked to
    /// went away, then the error.
    async fn start(&self, start: wire::Start) -> Result<(Process, u32, Arc<link::Link>)> {
        let mut retried = false;
        loop {
            let link = self.link().await?;
            let mut start = start.clone();
            // An executor bounded as a whole (a container, a sandbox's cgroup) bounds its
            // processes itself: the uid's RLIMIT_NPROC, which every workspace of that uid
            // shares, is left as it is (one workspace's runs cannot use up another's).
            if link.bounded() {
                start.limits.processes = u64::MAX;
            }
            match link.spawn(start).await {
                Ok((process, run)) => return Ok((process, run, link)),
                Err(e) if !retried && !link.alive() => {
                    tracing::warn!(workspace = %self.workspace, error = %e, "the executor's run agent went away; starting it again");
                    retried = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The link to the agent, made (the sandbox built, or the container started) if there
    /// is none or it went away.
    async fn link(&self) -> Result<Arc<link::Link>> {
        let mut current = self.link.lock().await;
        if let Some(link) = current.as_ref().filter(|l| l.alive()) {
            return Ok(link.clone());
        }
        *current = None;
        let link = match self.spec.kind {
            // Started from the links' runtime thread: bubblewrap's `--die-with-parent` follows
            // the thread that started it (its launcher), which must outlive the sandbox.
            Kind::Bwrap => {
                let (places, agent) = (self.places.clone(), agent_binary()?);
                let group = cgroup::availability().group(executor_limits())?;
                let egress = match self.spec.network {
                    Network::Egress => Some(self.egress.clone().ok_or_else(|| {
                        Error::internal("a bubblewrap executor with egress has no proxy policy")
                    })?),
                    Network::None => None,
                };
                link::runtime()
                    .spawn(async move { bwrap::start(&places, &agent, group, egress).await })
                    .await
                    .map_err(|e| Error::internal(format!("starting the sandbox: {e}")))??
            }
            Kind::Docker => docker::link(self.container()?, &self.workspace, &self.places).await?,
            Kind::Host => return Err(Error::internal("the host executor has no agent")),
        };
        let link = Arc::new(link);
        *current = Some(link.clone());
        Ok(link)
    }

    /// Runs `argv` with this process's standard input, output and error; its exit status.
    /// Not from inside a runtime.
    pub fn run_attached(&self, argv: &[String]) -> Result<i32> {
        let command = Command {
            argv: argv.to_vec(),
            env: Vec::new(),
            limits: None,
        };
        let env = self.full_env(&command);
        if self.spec.kind == Kind::Host {
            return process::run_inherited(argv, Some(&self.places.repo), &env);
        }
        let start = self.run_start(&command, env, true);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::internal(format!("a runtime: {e}")))?;
        runtime.block_on(async move {
            let (mut process, _, _link) = self.start(start).await?;
            // Standard input, read on a thread of its own, goes to the run until its end.
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
            std::thread::spawn(move || {
                use std::io::Read;
                let mut stdin = std::io::stdin();
                let mut buf = vec![0u8; 32 << 10];
                loop {
                    let n = stdin.read(&mut buf).unwrap_or(0);
                    if tx.blocking_send(buf[..n].to_vec()).is_err() || n == 0 {
                        return;
                    }
                }
            });
            if let Some(mut input) = process.take_input() {
                tokio::spawn(async move {
                    while let Some(bytes) = rx.recv().await {
                        let end = bytes.is_empty();
                        if input.send(bytes).await.is_err() || end {
                            return;
                        }
                    }
                });
            }
            use std::io::Write;
            let write = |stream: process::Stream, bytes: &[u8]| {
                let _ = match stream {
                    process::Stream::Stdout => {
                        let mut out = std::io::stdout();
                        out.write_all(bytes).and_then(|_| out.flush())
                    }
                    process::Stream::Stderr => std::io::stderr().write_all(bytes),
                };
            };
            let mut exit = None;
            let mut open = true;
            while let Some(event) = process.next().await {
                match event {
                    process::Event::Output(stream, bytes) => write(stream, &bytes),
                    process::Event::Closed => open = false,
                    process::Event::Exited(status) => {
                        exit = Some(status);
                        break;
                    }
                }
            }
            let exit = exit.unwrap_or_default();
            if exit.lost {
                return Err(link::lost("during the command"));
            }
            // What it left holding its output is not waited for long.
            if open {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
                    while let Some(process::Event::Output(stream, bytes)) = process.next().await {
                        write(stream, &bytes);
                    }
                })
                .await;
            }
            Ok(exit.code.unwrap_or_else(|| 128 + exit.signal.unwrap_or(0)))
        })
    }

    /// Whether a Docker executor's agent answers at its socket within `wait` (a spare's,
    /// before it is handed out). Other backends make their sandbox at the first run.
    pub fn answers(&self, wait: std::time::Duration) -> bool {
        if self.spec.kind != Kind::Docker {
            return true;
        }
        let started = std::time::Instant::now();
        loop {
            if docker::dial(&self.places.agent).is_ok() {
                return true;
            }
            if started.elapsed() >= wait {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    fn container(&self) -> Result<&str> {
        self.spec
            .id
            .as_deref()
            .ok_or_else(|| Error::internal("a docker executor without a container"))
    }

    /// Lets go of what the executor holds while its workspace is idle: a bubblewrap sandbox
    /// (and what it runs) goes, made again at the next run; a Docker container stays.
    pub fn idle(&self) {
        if self.spec.kind == Kind::Bwrap {
            if let Ok(mut link) = self.link.try_lock() {
                link.take();
            }
        }
    }

    /// Removes the executor (its container and network, or its sandbox); whatever runs in it
    /// is killed.
    pub fn remove(&self) -> Result<()> {
        // A bubblewrap sandbox is killed with its link.
        if let Ok(mut link) = self.link.try_lock() {
            link.take();
        }
        if self.spec.kind == Kind::Docker {
            let spec = self.spec.clone();
            cloud_harness_provision::engine::block_on(async move { docker::remove(&spec).await })?;
        }
        Ok(())
    }
}

/// An executor's paths, as a model is given them.
pub struct Paths {
    pub workspace: String,
    pub root: String,
}

impl Paths {
    pub fn skills(&self) -> String {
        format!("{}/skills", self.root)
    }

    pub fn owner_skills(&self) -> String {
        format!("{}/owner-skills", self.root)
    }

    /// The folder holding the approved copy of a skill.
    pub fn by_digest(&self, hex: &str) -> String {
        format!("{}/{BY_DIGEST}/{hex}", self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_the_executors_except_on_the_host() {
        let places = Places::of(Path::new("/srv/home/workspaces/ws_1"));
        let spec = |kind| Spec {
            kind,
            id: None,
            egress: None,
            network: Network::None,
            uid: 10001,
            gid: 10001,
        };
        let bwrap = Executor::attach(spec(Kind::Bwrap), places.clone(), "ws_1");
        assert_eq!(bwrap.paths().workspace, "/workspace");
        assert_eq!(bwrap.paths().skills(), "/opt/cloud-harness/skills");
        assert_eq!(
            bwrap.paths().by_digest("ab"),
            "/opt/cloud-harness/.by-digest/ab"
        );
        let host = Executor::attach(spec(Kind::Host), places, "ws_1");
        assert_eq!(host.paths().workspace, "/srv/home/workspaces/ws_1/repo");
        assert_eq!(
            host.paths().owner_skills(),
            "/srv/home/workspaces/ws_1/mounts/owner-skills"
        );
    }
}

//! Helper containers: each fetch runs in a container of its own, on an internal Docker network
//! whose only other member is the egress proxy (`provisioning-proxy:3128`); the network and
//! the proxy are kept warm between fetches (`warm`), the helper is fresh for each fetch: made
//! for it, or made before it and kept on standby (`standby`). A helper gets its job on standard
//! input ([`Job`]).
//!
//! The helper image is built here, without any registry: a root file system holding the
//! `cloud-harness` binary, the shared libraries it needs and the CA bundle, imported into the
//! engine. The helper runs with every capability dropped, no new privileges, a read-only root,
//! a tmpfs work folder, memory, pid and time limits, and no DNS of its own (the proxy's name is
//! in its hosts file). It hands back git objects only — a pack on its standard output — which
//! the host indexes itself (object ids recomputed from the bytes) before staging: a tree the
//! container wrote is never trusted. A fetch's helper serves that fetch alone and is removed
//! on success, failure and timeout.

use crate::containers::proxy_refusal;
use crate::egress::EgressPolicy;
use crate::engine::{
    self, block_on, connect, docker_error, ensure_image, remove_container, RootFs,
};
use crate::fetch::{Fetched, Transport};
use crate::ownership;
pub use crate::pack::{index_pack, index_pack_from, PACK_MAGIC};
use crate::staging::Limits;
use crate::standby::{self, Shape};
use crate::warm::{Pair, Warm};
use bollard::query_parameters::{AttachContainerOptions, WaitContainerOptions};
use bollard::Docker;
use cloud_harness_control::toolkit::Revision;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::Digest;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Docker engine releases before these forward DNS queries from internal networks
/// (CVE-2024-29018).
fn dns_forwarding_fixed(version: &str) -> bool {
    let parts: Vec<u32> = version
        .split(['.', '-', '+', '~'])
        .take(3)
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    let (major, minor, patch) = (
        parts.first().copied().unwrap_or(0),
        parts.get(1).copied().unwrap_or(0),
        parts.get(2).copied().unwrap_or(0),
    );
    match major {
        0..=22 => false,
        23 => (minor, patch) >= (0, 11),
        24 => false,
        25 => (minor, patch) >= (0, 5),
        _ => true,
    }
}

/// A helper's one job, the line of JSON it reads on standard input.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Job {
    pub url: String,
    /// [`Revision::to_arg`].
    pub revision: String,
    /// The fetch's time and byte ceilings (`CLOUD_HARNESS_FETCH_TIMEOUT`, `…_MAX_BYTES`).
    pub max_seconds: u64,
    pub max_bytes: u64,
    /// PEM certificates to trust besides the image's (`CLOUD_HARNESS_EXTRA_CA`).
    #[serde(default)]
    pub extra_ca: Option<String>,
}

/// A Docker engine to run helpers in.
#[derive(Clone)]
pub struct Sandbox {
    /// The `cloud-harness` binary the helper image holds.
    helper_binary: PathBuf,
    image: OnceLock<String>,
    /// The provisioning network and proxy, shared by every clone of this sandbox.
    warm: Arc<Warm>,
    pub engine_version: String,
    pub warnings: Vec<String>,
}

impl Sandbox {
    /// The engine, if one answers (and `CLOUD_HARNESS_CONTAINERS` is not `off`).
    pub fn detect(helper_binary: PathBuf) -> Option<Sandbox> {
        if std::env::var("CLOUD_HARNESS_CONTAINERS").is_ok_and(|v| v == "off") {
            return None;
        }
        let version = engine::version()?;
        let mut warnings = Vec::new();
        if !dns_forwarding_fixed(&version) {
            let w = format!(
                "Docker engine {version} forwards DNS queries from internal networks to the host's resolvers (CVE-2024-29018; fixed in 26.0.0, 25.0.5 and 23.0.11); helpers are also given no DNS of their own, but upgrade the engine"
            );
            tracing::warn!("{w}");
            warnings.push(w);
        }
        if let Err(e) = ownership::sweep_orphans() {
            tracing::warn!(error = %e, "cannot look for provisioning networks that dead processes left");
        }
        Some(Sandbox {
            helper_binary,
            image: OnceLock::new(),
            warm: Arc::default(),
            engine_version: version,
            warnings,
        })
    }

    /// Fetches `revision` of `url` in a helper container; the objects land in a bare repository
    /// at `dir`, indexed by the host.
    #[allow(clippy::too_many_arguments)]
    pub fn fetch(
        &self,
        url: &str,
        revision: &Revision,
        transport: &Transport,
        egress: &EgressPolicy,
        limits: Limits,
        deadline: Instant,
        dir: &Path,
    ) -> Result<Fetched> {
        // The helper's output goes to disk (capped), never all into memory.
        let pack = dir.with_extension("pack");
        let fetched = self
            .fetch_with_env(
                url,
                revision,
                transport,
                egress,
                limits,
                deadline,
                Vec::new(),
                &pack,
            )
            .and_then(|()| {
                let file = std::fs::File::open(&pack).map_err(|e| Error::io(&pack, e))?;
                index_pack_from(std::io::BufReader::new(file), dir, limits)
            });
        let _ = std::fs::remove_file(&pack);
        fetched
    }

    /// Removes the warm provisioning network and proxy, and the helpers on standby, now (see
    /// `warm`).
    pub fn release(&self) {
        self.warm.release();
    }

    /// Helpers ready on standby now.
    pub fn on_standby(&self) -> usize {
        self.warm.standby.ready()
    }

    /// Keeps `helpers` fresh helpers on standby from now on (0: none), and makes the warm
    /// network and proxy for `egress` and the first of them now, in the background: a server's
    /// first fetch then waits for neither.
    pub fn keep_warm(&self, helpers: usize, egress: &EgressPolicy, limits: Limits) {
        self.warm.standby.set_target(helpers);
        let (sandbox, policy) = (self.clone(), egress.proxy_env());
        std::thread::spawn(move || {
            let warm = sandbox.warm.clone();
            let made = sandbox.helper_image().and_then(|image| {
                block_on(async move {
                    let pair = warm.take(&connect().await?, &image, policy).await?;
                    Ok(shape(&image, &pair, limits))
                })
            });
            match made {
                Ok(shape) => sandbox.warm.standby.refill(&shape),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot make the provisioning network ready ahead of a fetch")
                }
            }
        });
    }

    /// The helper image's name, `cloud-harness-helper:<digest of the binary>`; the binary
    /// cannot change under a running process, so it is hashed once.
    fn image_name(&self) -> Result<String> {
        if let Some(name) = self.image.get() {
            return Ok(name.clone());
        }
        let path = &self.helper_binary;
        let mut exe = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let (digest, _) =
            Digest::of_stream(&mut exe, &mut std::io::sink()).map_err(|e| Error::io(path, e))?;
        let name = format!("cloud-harness-helper:{}", &digest.hex()[..16]);
        Ok(self.image.get_or_init(|| name).clone())
    }

    /// The helper image, imported into the engine if it is not there yet (egress proxies of
    /// executors run it too).
    pub fn helper_image(&self) -> Result<String> {
        let name = self.image_name()?;
        let binary = self.helper_binary.clone();
        let imported = name.clone();
        block_on(async move {
            let docker = connect().await?;
            ensure_image(&docker, &imported, || rootfs(&binary)).await
        })?;
        Ok(name)
    }

    /// Runs the helper with extra environment (tests use it to take the proxy away), its
    /// output written to the file `out`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn fetch_with_env(
        &self,
        url: &str,
        revision: &Revision,
        transport: &Transport,
        egress: &EgressPolicy,
        limits: Limits,
        deadline: Instant,
        env: Vec<String>,
        out: &Path,
    ) -> Result<()> {
        let run = Run {
            helper_binary: self.helper_binary.clone(),
            warm: self.warm.clone(),
            image: self.image_name()?,
            url: url.to_owned(),
            revision: revision.clone(),
            extra_ca: transport.extra_ca.clone(),
            egress: egress.clone(),
            limits,
            deadline,
            env_overrides: env,
            out: out.to_path_buf(),
        };
        block_on(run.execute())
    }
}

struct Run {
    helper_binary: PathBuf,
    warm: Arc<Warm>,
    image: String,
    url: String,
    revision: Revision,
    extra_ca: Option<Vec<u8>>,
    egress: EgressPolicy,
    limits: Limits,
    deadline: Instant,
    env_overrides: Vec<String>,
    /// Where the helper's output (the pack) is written.
    out: PathBuf,
}

/// The helper image's root file system: the binary, its shared libraries, CA certificates.
fn rootfs(binary: &Path) -> Result<Vec<u8>> {
    let mut tar = RootFs::default();
    let exe = std::fs::read(binary).map_err(|e| Error::io(binary, e))?;
    tar.file("cloud-harness", &exe, 0o755)?;
    let ldd = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| Error::internal(format!("ldd: {e}")))?;
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = line
            .split("=>")
            .last()
            .unwrap_or("")
            .trim()
            .split(' ')
            .next()
            .unwrap_or("");
        if path.starts_with('/') {
            let bytes = std::fs::read(path).map_err(|e| Error::io(Path::new(path), e))?;
            tar.file(path, &bytes, 0o755)?;
        }
    }
    for ca in ["/etc/ssl/certs/ca-certificates.crt"] {
        if let Ok(bytes) = std::fs::read(ca) {
            tar.file(ca, &bytes, 0o644)?;
        }
    }
    tar.file(
        "/etc/passwd",
        b"nobody:x:65534:65534:nobody:/work:/sbin/nologin\n",
        0o644,
    )?;
    tar.file("/etc/group", b"nogroup:x:65534:\n", 0o644)?;
    tar.file("/etc/hosts", b"127.0.0.1 localhost\n", 0o644)?;
    for dir in ["tmp", "work"] {
        tar.dir(dir, 0o1777)?;
    }
    tar.finish()
}

/// The shape of a helper for a fetch with `limits` on `pair`.
fn shape(image: &str, pair: &Pair, limits: Limits) -> Shape {
    Shape {
        image: image.to_owned(),
        network: pair.network.clone(),
        proxy_ip: pair.proxy_ip.clone(),
        work_kb: (limits.max_bytes * 3 / 1024).max(65536),
    }
}

impl Run {
    async fn execute(self) -> Result<()> {
        let docker = connect().await?;
        ensure_image(&docker, &self.image, || rootfs(&self.helper_binary)).await?;
        let standby = self.warm.standby.clone();
        // Helpers with an environment of their own (tests) are never on standby.
        let plain = self.env_overrides.is_empty();
        let (mut helper, mut shaped) = (None, None);
        standby.begin();
        let outcome = tokio::time::timeout(
            self.deadline.saturating_duration_since(Instant::now()),
            async {
                let pair = self
                    .warm
                    .take(&docker, &self.image, self.egress.proxy_env())
                    .await?;
                let shape = shape(&self.image, &pair, self.limits);
                shaped = Some(shape.clone());
                let taken = match plain {
                    true => standby.take(&docker, &shape).await,
                    false => None,
                };
                let fresh = taken.is_none();
                let name = taken.unwrap_or_else(standby::name);
                helper = Some(name.clone());
                standby.serving(&name);
                if fresh {
                    standby::make(&docker, &name, &shape, &self.env_overrides).await?;
                }
                self.inside(&docker, &pair, &name).await
            },
        )
        .await;
        // Whatever happened: the helper is not left behind, and another takes its place.
        if let Some(helper) = &helper {
            remove_container(&docker, helper).await;
        }
        standby.end(helper.as_deref(), shaped.as_ref().filter(|_| plain));
        match outcome {
            Ok(result) => result,
            Err(_) => Err(Error::new(
                Code::Timeout,
                format!(
                    "fetching {} in a helper container took longer than {} s",
                    self.url, self.limits.max_seconds
                ),
            )),
        }
    }

    /// Gives the running helper its job and takes its pack.
    async fn inside(&self, docker: &Docker, pair: &Pair, helper: &str) -> Result<()> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let job = Job {
            url: self.url.clone(),
            revision: self.revision.to_arg(),
            max_seconds: self.limits.max_seconds,
            max_bytes: self.limits.max_bytes,
            extra_ca: self
                .extra_ca
                .as_ref()
                .map(|pem| String::from_utf8_lossy(pem).into_owned()),
        };
        let mut line = serde_json::to_vec(&job).map_err(|e| Error::internal(e.to_string()))?;
        line.push(b'\n');
        let mut attached = docker
            .attach_container(
                helper,
                Some(AttachContainerOptions {
                    stream: true,
                    stdin: true,
                    stdout: true,
                    stderr: true,
                    logs: true,
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| docker_error("attaching to the helper", e))?;
        {
            use tokio::io::AsyncWriteExt;
            let input = &mut attached.input;
            input
                .write_all(&line)
                .await
                .and(input.shutdown().await)
                .map_err(|e| Error::internal(format!("giving the helper its job: {e}")))?;
        }
        let cap = self.limits.max_bytes.saturating_mul(2);
        // A runtime of its own on a thread of its own (see `block_on`): plain writes are fine.
        let mut stdout = std::io::BufWriter::new(
            std::fs::File::create(&self.out).map_err(|e| Error::io(&self.out, e))?,
        );
        let (mut written, mut stderr) = (0u64, Vec::new());
        let mut output = attached.output;
        while let Some(item) = output.next().await {
            match item {
                Ok(bollard::container::LogOutput::StdOut { message }) => {
                    written += message.len() as u64;
                    if written > cap {
                        return Err(Error::too_large(format!(
                            "the helper sent more than {cap} bytes for {}",
                            self.url
                        )));
                    }
                    use std::io::Write;
                    stdout
                        .write_all(&message)
                        .map_err(|e| Error::io(&self.out, e))?;
                }
                Ok(bollard::container::LogOutput::StdErr { message }) => {
                    if stderr.len() < 64 << 10 {
                        stderr.extend_from_slice(&message);
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(docker_error("reading the helper's output", e)),
            }
        }
        let mut wait = docker.wait_container(helper, None::<WaitContainerOptions>);
        let code = match wait.next().await {
            Some(Ok(r)) => r.status_code,
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
            Some(Err(e)) => return Err(docker_error("waiting for the helper", e)),
            None => -1,
        };
        if code != 0 {
            let text = String::from_utf8_lossy(&stderr);
            let last = text
                .lines()
                .rev()
                .find(|l| l.starts_with("error: "))
                .or_else(|| text.lines().rev().find(|l| !l.trim().is_empty()))
                .unwrap_or("no output");
            // The helper prints `error: CODE: message` like every cloud-harness command.
            let code = last
                .strip_prefix("error: ")
                .and_then(|rest| rest.split_once(':'))
                .and_then(|(name, _)| Code::parse(name))
                .unwrap_or(Code::Upstream);
            // The proxy says why it refused this fetch's host, if it did meanwhile.
            let host = url::Url::parse(&self.url)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
                .unwrap_or_default();
            let refusal = proxy_refusal(docker, &pair.proxy, started, &host).await;
            if let Some(refusal) = refusal {
                return Err(Error::new(
                    Code::Forbidden,
                    format!("the egress proxy refused: {refusal}"),
                )
                .with_details(serde_json::json!({ "url": self.url, "helper": last })));
            }
            return Err(Error::new(
                code,
                format!(
                    "the helper container failed (exit {code}): {last}",
                    code = code.as_str()
                ),
            ));
        }
        use std::io::Write;
        stdout.flush().map_err(|e| Error::io(&self.out, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::dns_forwarding_fixed;

    #[test]
    fn engines_without_the_dns_fix_are_known() {
        for old in ["20.10.24+dfsg1", "23.0.10", "24.0.9", "25.0.4"] {
            assert!(!dns_forwarding_fixed(old), "{old}");
        }
        for new in ["23.0.11", "25.0.5", "26.0.0", "27.3.1", "28.2.2"] {
            assert!(dns_forwarding_fixed(new), "{new}");
        }
    }
}

//! The Docker engine, as helper containers and executors both use it: connecting, running
//! async engine calls from synchronous code, errors, and importing an image from a root file
//! system without any registry.

use bollard::query_parameters::CreateImageOptions;
use bollard::Docker;
use cloud_harness_error::{Code, Error, Result};
use futures_util::StreamExt;

pub fn docker_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Code::Upstream, format!("docker: {what}: {e}"))
}

/// Runs `work` on a thread of its own with a runtime of its own (callers may be inside a
/// runtime already).
pub fn block_on<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::internal(format!("a runtime for docker: {e}")))?
            .block_on(work)
    })
    .join()
    .unwrap_or_else(|_| Err(Error::internal("the docker thread panicked")))
}

/// Removes a container, killing whatever runs in it; one that is gone already is fine.
pub async fn remove_container(docker: &Docker, name: &str) {
    let _ = docker
        .remove_container(
            name,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
}

/// Labels of a container or network, as the engine lists them.
pub type Labels = std::collections::HashMap<String, String>;

/// Removes every container, then every network, carrying the label filter `label`
/// (`key` or `key=value`) whose labels `pick` accepts.
pub async fn remove_labelled(
    docker: &Docker,
    label: &str,
    pick: impl Fn(Option<&Labels>) -> bool,
) -> Result<()> {
    let filters = std::collections::HashMap::from([("label".to_owned(), vec![label.to_owned()])]);
    let containers = docker
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(filters.clone()),
            ..Default::default()
        }))
        .await
        .map_err(|e| docker_error("listing containers", e))?;
    for c in containers.into_iter().filter(|c| pick(c.labels.as_ref())) {
        if let Some(id) = c.id {
            remove_container(docker, &id).await;
        }
    }
    let networks = docker
        .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
            filters: Some(filters),
        }))
        .await
        .map_err(|e| docker_error("listing networks", e))?;
    for n in networks.into_iter().filter(|n| pick(n.labels.as_ref())) {
        if let Some(name) = n.name {
            let _ = docker.remove_network(&name).await;
        }
    }
    Ok(())
}

pub async fn connect() -> Result<Docker> {
    let docker = Docker::connect_with_local_defaults().map_err(|e| docker_error("connect", e))?;
    docker
        .negotiate_version()
        .await
        .map_err(|e| docker_error("negotiate", e))
}

/// The engine's version, if an engine answers.
pub fn version() -> Option<String> {
    block_on(async {
        let docker = connect().await?;
        let v = docker
            .version()
            .await
            .map_err(|e| docker_error("version", e))?;
        Ok(v.version.unwrap_or_default())
    })
    .ok()
}

/// The image `name` (`repository:tag`), imported from the tar archive `rootfs()` makes unless
/// the engine has it already.
pub async fn ensure_image(
    docker: &Docker,
    name: &str,
    rootfs: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<()> {
    if docker.inspect_image(name).await.is_ok() {
        return Ok(());
    }
    let body = rootfs()?;
    let (repo, tag) = name.split_once(':').expect("image names carry a tag");
    let options = CreateImageOptions {
        from_src: Some("-".into()),
        repo: Some(repo.into()),
        tag: Some(tag.into()),
        ..Default::default()
    };
    let mut stream =
        docker.create_image(Some(options), Some(bollard::body_full(body.into())), None);
    while let Some(item) = stream.next().await {
        item.map_err(|e| docker_error(&format!("importing the image {name}"), e))?;
    }
    Ok(())
}

/// A tar archive being built as an image's root file system.
pub struct RootFs(tar::Builder<Vec<u8>>);

impl Default for RootFs {
    fn default() -> Self {
        RootFs(tar::Builder::new(Vec::new()))
    }
}

impl RootFs {
    pub fn file(&mut self, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(mode);
        header.set_cksum();
        self.0
            .append_data(&mut header, path.trim_start_matches('/'), bytes)
            .map_err(|e| Error::internal(format!("image root file system: {e}")))
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(mode);
        header.set_size(0);
        header.set_cksum();
        self.0
            .append_data(&mut header, path.trim_start_matches('/'), std::io::empty())
            .map_err(|e| Error::internal(format!("image root file system: {e}")))
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        header.set_cksum();
        self.0
            .append_link(&mut header, path.trim_start_matches('/'), target)
            .map_err(|e| Error::internal(format!("image root file system: {e}")))
    }

    pub fn finish(self) -> Result<Vec<u8>> {
        self.0
            .into_inner()
            .map_err(|e| Error::internal(format!("image root file system: {e}")))
    }
}

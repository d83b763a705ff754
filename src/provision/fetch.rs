//! Fetching one commit with gix: depth 1, into a scratch bare repository without a work tree,
//! over HTTPS (an extra CA and a proxy as configured). SHA-1 and SHA-256 repositories both work:
//! the scratch repository adopts the remote's object format.

use crate::toolkit::Revision;
use cloud_harness_fs::{Code, Error, Result};
use gix::remote::fetch::Shallow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How to reach git hosts.
#[derive(Debug, Clone, Default)]
pub struct Transport {
    /// PEM certificates trusted besides the system roots (`CLOUD_HARNESS_EXTRA_CA`).
    pub extra_ca: Option<Vec<u8>>,
    /// `HTTPS_PROXY`.
    pub proxy: Option<String>,
}

impl Transport {
    pub fn from_env() -> Result<Transport> {
        let proxy = ["HTTPS_PROXY", "https_proxy"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
        // Helper containers get the certificates themselves, not a path.
        if let Some(pem) = std::env::var("CLOUD_HARNESS_EXTRA_CA_PEM")
            .ok()
            .filter(|v| !v.is_empty())
        {
            return Ok(Transport {
                extra_ca: Some(pem.into_bytes()),
                proxy,
            });
        }
        let extra_ca = match std::env::var_os("CLOUD_HARNESS_EXTRA_CA").filter(|v| !v.is_empty()) {
            Some(path) => {
                let pem = std::fs::read(&path).map_err(|e| Error::io(Path::new(&path), e))?;
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                    Error::invalid(format!(
                        "CLOUD_HARNESS_EXTRA_CA: {}: {e}",
                        Path::new(&path).display()
                    ))
                })?;
                Some(pem)
            }
            None => None,
        };
        Ok(Transport { extra_ca, proxy })
    }

    fn configure(
        &self,
        builder: reqwest::blocking::ClientBuilder,
    ) -> gix::Result<reqwest::blocking::ClientBuilder> {
        let mut builder = builder;
        if let Some(pem) = &self.extra_ca {
            for cert in
                reqwest::Certificate::from_pem_bundle(pem).map_err(gix::error::Error::from_error)?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        builder = match &self.proxy {
            Some(p) => builder
                .proxy(reqwest::Proxy::https(p.as_str()).map_err(gix::error::Error::from_error)?),
            None => builder.no_proxy(),
        };
        Ok(builder)
    }
}

/// A fetched commit in a scratch repository (removed with the directory it lives in).
pub struct Fetched {
    pub repo: gix::Repository,
    pub commit: gix::ObjectId,
}

fn upstream(url: &str, e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    // The server's "not our ref" and friends: the commit is not there.
    let missing = [
        "not our ref",
        "not found",
        "could not find",
        "couldn't find",
    ]
    .iter()
    .any(|m| text.to_lowercase().contains(m));
    let code = if missing {
        Code::NotFound
    } else {
        Code::Upstream
    };
    Error::new(code, format!("fetching {url}: {text}"))
        .with_details(serde_json::json!({ "url": url }))
}

/// Runs `work` with an interrupt flag that is raised at `deadline`; an interrupted run is a
/// TIMEOUT error.
fn with_deadline<T>(
    url: &str,
    deadline: Instant,
    work: impl FnOnce(&AtomicBool) -> Result<T>,
) -> Result<T> {
    let interrupt = Arc::new(AtomicBool::new(false));
    let (done, wait) = channel::<()>();
    let timer = {
        let interrupt = interrupt.clone();
        std::thread::spawn(move || {
            if let Err(RecvTimeoutError::Timeout) =
                wait.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                interrupt.store(true, Ordering::SeqCst);
            }
        })
    };
    let result = work(&interrupt);
    drop(done);
    let _ = timer.join();
    match result {
        Err(_) if interrupt.load(Ordering::SeqCst) => Err(Error::new(
            Code::Timeout,
            format!("fetching {url} took longer than the time allowed"),
        )),
        other => other,
    }
}

/// A clone of one commit, depth 1, with the remote's object format and our transport.
fn prepare(
    url: &str,
    revision: &Revision,
    transport: &Transport,
    dir: &Path,
    kind: gix::create::Kind,
) -> Result<gix::clone::PrepareFetch> {
    let transport = transport.clone();
    let prepare = gix::clone::PrepareFetch::new(
        url,
        dir,
        kind,
        gix::create::Options::default(),
        // No user or system git configuration: nothing may rewrite URLs or add helpers.
        gix::open::Options::isolated(),
    )
    .map_err(|e| upstream(url, e))?
    .with_shallow(Shallow::DepthAtRemote(1.try_into().expect("1 is not zero")))
    .configure_connection(move |conn| {
        let remote_url = conn
            .remote()
            .url(gix::remote::Direction::Fetch)
            .map(|u| u.to_bstring())
            .unwrap_or_default();
        let mut options = conn
            .remote()
            .repo()
            .transport_options(gix::bstr::BStr::new(&remote_url), None)?
            .unwrap_or_else(|| {
                Box::new(gix::protocol::transport::client::blocking_io::http::Options::default())
            });
        if let Some(http) =
            options.downcast_mut::<gix::protocol::transport::client::blocking_io::http::Options>()
        {
            let transport = transport.clone();
            http.backend = Some(Arc::new(Mutex::new(
                gix::protocol::transport::client::blocking_io::http::reqwest::Options {
                    configure_client: Some(Box::new(move |b| transport.configure(b))),
                    configure_request: None,
                },
            )));
        }
        conn.set_transport_options(options);
        Ok(())
    });
    match revision {
        Revision::Commit(hex) => prepare.with_revision(Some(hex.as_str())),
        Revision::Tag(tag) => prepare.with_ref_name(Some(format!("refs/tags/{tag}").as_str())),
        Revision::DefaultHead => Ok(prepare),
    }
    .map_err(|e| upstream(url, e))
}

/// The commit `revision` names, from what the remote advertised.
fn fetched_commit(
    url: &str,
    revision: &Revision,
    refs: &gix::remote::fetch::RefMap,
) -> Result<gix::ObjectId> {
    let wanted = |name: &str| {
        refs.remote_refs.iter().find_map(|r| {
            let (full, target, peeled) = r.unpack();
            (full == name).then(|| peeled.or(target).map(|id| id.to_owned()))?
        })
    };
    match revision {
        Revision::Commit(hex) => {
            gix::ObjectId::from_hex(hex.as_bytes()).map_err(|e| upstream(url, e))
        }
        Revision::Tag(tag) => wanted(&format!("refs/tags/{tag}"))
            .ok_or_else(|| Error::not_found(format!("tag {tag:?} is not in {url}"))),
        Revision::DefaultHead => wanted("HEAD")
            .ok_or_else(|| Error::new(Code::Upstream, format!("{url} has no default branch head"))),
    }
}

/// Fetches `revision` of `url` into `dir` (which must not exist), a bare repository, giving
/// up at `deadline`.
pub fn fetch(
    url: &str,
    revision: &Revision,
    transport: &Transport,
    dir: &Path,
    deadline: Instant,
) -> Result<Fetched> {
    with_deadline(url, deadline, |interrupt| {
        let (repo, outcome) = prepare(url, revision, transport, dir, gix::create::Kind::Bare)?
            .fetch_only(gix::progress::Discard, interrupt)
            .map_err(|e| upstream(url, e))?;
        let commit = fetched_commit(url, revision, &outcome.ref_map)?;
        // The fetched commit must be there (a server may answer without it).
        repo.find_commit(commit)
            .map_err(|e| upstream(url, format!("commit {commit}: {e}")))?;
        Ok(Fetched { repo, commit })
    })
}

/// Clones `revision` of `url` into `dir` with a checked-out working tree (a project
/// repository), depth 1; returns the commit.
pub fn clone_worktree(
    url: &str,
    revision: &Revision,
    transport: &Transport,
    dir: &Path,
    deadline: Instant,
) -> Result<gix::ObjectId> {
    with_deadline(url, deadline, |interrupt| {
        let mut prepare = prepare(
            url,
            revision,
            transport,
            dir,
            gix::create::Kind::WithWorktree,
        )?;
        let (mut checkout, outcome) = prepare
            .fetch_then_checkout(gix::progress::Discard, interrupt)
            .map_err(|e| upstream(url, e))?;
        let commit = fetched_commit(url, revision, &outcome.ref_map)?;
        checkout
            .main_worktree(gix::progress::Discard, interrupt)
            .map_err(|e| upstream(url, format!("checking out: {e}")))?;
        Ok(commit)
    })
}

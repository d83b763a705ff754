//! Fetching one commit with gix: depth 1, into a scratch bare repository without a work tree,
//! over HTTPS (an extra CA and a proxy as configured). SHA-1 and SHA-256 repositories both work:
//! the scratch repository adopts the remote's object format. A download is watched as it
//! lands: past its byte ceiling or its deadline it is interrupted, and a project's checkout is
//! measured (files and bytes, from the tree) before anything is written.

use super::observe::Observer;
use cloud_harness_control::toolkit::Revision;
use cloud_harness_error::{Code, Error, Result};
use gix::remote::fetch::Shallow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a running download's size is looked at.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// Ceilings for a project repository's clone (`CLOUD_HARNESS_PROJECT_MAX_BYTES`,
/// `…_MAX_FILES`): the download and the checked-out tree each stay under `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloneLimits {
    pub max_bytes: u64,
    pub max_files: u64,
}

impl Default for CloneLimits {
    fn default() -> Self {
        CloneLimits {
            max_bytes: 2 << 30,
            max_files: 200_000,
        }
    }
}

impl CloneLimits {
    pub fn from_env() -> Result<CloneLimits> {
        let d = CloneLimits::default();
        Ok(CloneLimits {
            max_bytes: cloud_harness_control::config::env_number(
                "CLOUD_HARNESS_PROJECT_MAX_BYTES",
                d.max_bytes,
            )?,
            max_files: cloud_harness_control::config::env_number(
                "CLOUD_HARNESS_PROJECT_MAX_FILES",
                d.max_files,
            )?,
        })
    }
}

/// What a download may not pass: the bytes under `pack_dir`, named by `setting` in the error;
/// and the largest object it may decode (`gitoxide.objects.allocLimit`), so that a small,
/// highly compressed object cannot make the fetch allocate more than that (`object_setting`
/// completes "larger than the limit of N bytes …").
pub struct Ceiling<'a> {
    pub max_bytes: u64,
    pub setting: &'a str,
    pub max_object: u64,
    pub object_setting: &'a str,
}

/// How to reach git hosts.
#[derive(Debug, Clone, Default)]
pub struct Transport {
    /// PEM certificates trusted besides the system roots (`CLOUD_HARNESS_EXTRA_CA`).
    pub extra_ca: Option<Vec<u8>>,
    /// `HTTPS_PROXY`.
    pub proxy: Option<String>,
    /// The longest any one request may take, its answer read whole (none: as long as the
    /// caller's deadline lets it).
    pub timeout: Option<Duration>,
}

impl Transport {
    /// `HTTPS_PROXY` (or `https_proxy`), when set.
    pub fn proxy_from_env() -> Option<String> {
        ["HTTPS_PROXY", "https_proxy"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    pub fn from_env() -> Result<Transport> {
        let proxy = Transport::proxy_from_env();
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
        Ok(Transport {
            extra_ca,
            proxy,
            timeout: None,
        })
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
        if let Some(timeout) = self.timeout {
            builder = builder.timeout(timeout);
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
    /// The branches and tags the remote listed to this fetch (a fetch of a commit by id
    /// asks for every ref); none where a helper container fetched.
    pub advertised: Option<crate::reach::Advertised>,
}

/// A fetch into `dir` that failed: one whose local disk failed (full, over quota, failing)
/// names that and `dir`; one that met an object larger than `ceiling.max_object` is
/// TOO_LARGE; anything else [`upstream`].
pub(crate) fn failed(
    url: &str,
    dir: &Path,
    e: &(dyn std::error::Error + 'static),
    ceiling: &Ceiling<'_>,
) -> Error {
    failed_here(url, dir, e, ceiling).unwrap_or_else(|| upstream(url, e))
}

/// Of a fetch's failures, those that are not the remote's answer cut short: this machine's
/// disk, or an object past `ceiling.max_object`.
pub(crate) fn failed_here(
    url: &str,
    dir: &Path,
    e: &(dyn std::error::Error + 'static),
    ceiling: &Ceiling<'_>,
) -> Option<Error> {
    if let Some(local) = local_disk(dir, e) {
        return Some(local);
    }
    past_alloc_limit(e).then(|| {
        object_too_large(
            &format!("fetching {url}"),
            ceiling.max_object,
            ceiling.object_setting,
        )
        .with_details(serde_json::json!({ "url": url, "limit": ceiling.max_object }))
    })
}

/// The failure of this machine's disk among `e` and its sources, as the error of `dir`: the
/// remote is not to blame for a full disk. (Some of gix's errors keep only the text of the
/// I/O error they wrap: the text is read too.)
fn local_disk(dir: &Path, e: &(dyn std::error::Error + 'static)) -> Option<Error> {
    use nix::libc::{EDQUOT, EIO, ENOSPC};
    let mut cause = Some(e);
    while let Some(err) = cause {
        let code = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .filter(|c| [ENOSPC, EDQUOT, EIO].contains(c))
            .or_else(|| {
                let text = err.to_string();
                [
                    (ENOSPC, "(os error 28)"),
                    (EDQUOT, "(os error 122)"),
                    (EIO, "(os error 5)"),
                ]
                .into_iter()
                .find(|(_, t)| text.contains(t))
                .map(|(c, _)| c)
            });
        if let Some(code) = code {
            return Some(Error::io(dir, std::io::Error::from_raw_os_error(code)));
        }
        cause = err.source();
    }
    None
}

/// Whether gix refused to unpack an object past its allocation limit
/// (`gitoxide.objects.allocLimit`): it says so only deep in its chain of causes.
pub(crate) fn past_alloc_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.to_string().contains("too large to fit in memory") {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The refusal of an object past `limit` bytes (`setting` says which limit), met while
/// `doing`.
pub(crate) fn object_too_large(doing: &str, limit: u64, setting: &str) -> Error {
    Error::too_large(format!(
        "{doing}: an object is larger than the limit of {limit} bytes {setting}; it was not unpacked"
    ))
    .with_details(serde_json::json!({ "limit": limit }))
}

pub(crate) fn upstream(url: &str, e: impl std::fmt::Display) -> Error {
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
        .with_details(serde_json::json!({ "url": url, "retryable": code == Code::Upstream }))
}

/// The bytes of the files directly in `dir` (a pack directory: the pack being received is a
/// temporary file there).
fn bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn too_large(url: &str, seen: u64, ceiling: &Ceiling<'_>) -> Error {
    let max = ceiling.max_bytes;
    Error::too_large(format!(
        "fetching {url}: the download passed {max} bytes ({seen} received; {})",
        ceiling.setting
    ))
    .with_details(serde_json::json!({ "url": url, "limit": max }))
}

/// A download faster than the watcher's look is measured once it is there (and before the
/// scratch repository that holds it is dropped).
fn check_download(url: &str, pack_dir: &Path, ceiling: &Ceiling<'_>) -> Result<()> {
    let seen = bytes_in(pack_dir);
    match seen > ceiling.max_bytes {
        true => Err(too_large(url, seen, ceiling)),
        false => Ok(()),
    }
}

/// The bytes of the packs a fetch into the bare repository `repo` wrote.
pub(crate) fn pack_bytes(repo: &Path) -> u64 {
    bytes_in(&repo.join("objects/pack"))
}

/// Runs `work` with an interrupt flag that is raised at `deadline` (a TIMEOUT error), when
/// the bytes under `pack_dir` pass the ceiling (TOO_LARGE), or when `observer` is cancelled
/// (CANCELLED); the bytes so far go to `observer`, added to what it had (an acquisition's
/// fetch, then its provenance check, count as one).
pub(crate) fn watched<T>(
    url: &str,
    deadline: Instant,
    pack_dir: PathBuf,
    ceiling: &Ceiling<'_>,
    observer: &Observer,
    work: impl FnOnce(&AtomicBool) -> Result<T>,
) -> Result<T> {
    let interrupt = AtomicBool::new(false);
    let (done, wait) = channel::<()>();
    let max_bytes = ceiling.max_bytes;
    let before = observer.bytes();
    let (interrupt, pack_dir) = (&interrupt, &pack_dir);
    let (result, over) = std::thread::scope(|s| {
        let watcher = s.spawn(move || loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match wait.recv_timeout(left.min(WATCH_EVERY)) {
                Err(RecvTimeoutError::Timeout) if left.is_zero() || observer.is_cancelled() => {
                    interrupt.store(true, Ordering::SeqCst);
                    return None;
                }
                Err(RecvTimeoutError::Timeout) => {
                    let seen = bytes_in(pack_dir);
                    observer.set_bytes(before.saturating_add(seen));
                    if seen > max_bytes {
                        interrupt.store(true, Ordering::SeqCst);
                        return Some(seen);
                    }
                }
                _ => return None,
            }
        });
        let result = work(interrupt);
        drop(done);
        (result, watcher.join().ok().flatten())
    });
    match (result, over) {
        (Err(_), Some(seen)) => Err(too_large(url, seen, ceiling)),
        (Err(_), None) if observer.is_cancelled() => Err(Error::new(
            Code::Cancelled,
            format!("fetching {url} was cancelled"),
        )),
        (Err(_), None) if interrupt.load(Ordering::SeqCst) => Err(Error::new(
            Code::Timeout,
            format!("fetching {url} took longer than the time allowed"),
        )
        .with_details(serde_json::json!({ "url": url, "retryable": true }))),
        (other, _) => other,
    }
}

/// Folders a checkout may nest: no path can be longer than 4,096 bytes (PATH_MAX), so a tree
/// nested deeper than this could never be written out.
const MAX_CHECKOUT_DEPTH: usize = 2048;

/// Refuses a checkout of `commit` with more files or bytes than `limits`, or folders nested
/// deeper than [`MAX_CHECKOUT_DEPTH`], before any is written. The trees are read one at a time
/// from a stack of their ids (a hostile tree of 100,000 levels costs neither call stack nor
/// a path per level).
fn check_checkout(
    url: &str,
    repo: &gix::Repository,
    commit: gix::ObjectId,
    limits: CloneLimits,
) -> Result<()> {
    let bad = |e: &dyn std::fmt::Display| upstream(url, format!("commit {commit}: {e}"));
    let root = repo
        .find_commit(commit)
        .map_err(|e| bad(&e))?
        .tree_id()
        .map_err(|e| bad(&e))?
        .detach();
    let too_large = |what: String| {
        Error::too_large(format!("{url} at {commit} {what}"))
            .with_details(serde_json::json!({ "url": url }))
    };
    let (mut files, mut folders, mut bytes) = (0u64, 0u64, 0u64);
    let mut pending = vec![(root, 0usize)];
    while let Some((id, depth)) = pending.pop() {
        let tree = repo
            .find_tree(id)
            .map_err(|e| upstream(url, format!("reading the tree of {commit}: {e}")))?;
        for entry in tree.iter() {
            let entry =
                entry.map_err(|e| upstream(url, format!("reading the tree of {commit}: {e}")))?;
            let mode = entry.mode();
            if mode.is_tree() {
                folders += 1;
                if folders > limits.max_files {
                    return Err(too_large(format!(
                        "holds more than {} folders (CLOUD_HARNESS_PROJECT_MAX_FILES)",
                        limits.max_files
                    )));
                }
                if depth + 1 > MAX_CHECKOUT_DEPTH {
                    return Err(too_large(format!(
                        "nests folders deeper than {MAX_CHECKOUT_DEPTH} levels, more than a checkout can hold"
                    )));
                }
                pending.push((entry.oid().to_owned(), depth + 1));
                continue;
            }
            files += 1;
            if !mode.is_commit() {
                let header = repo
                    .find_header(entry.oid())
                    .map_err(|e| upstream(url, format!("object {}: {e}", entry.oid())))?;
                bytes = bytes.saturating_add(header.size());
            }
            if files > limits.max_files || bytes > limits.max_bytes {
                return Err(too_large(format!(
                    "holds more than {} files or {} bytes (CLOUD_HARNESS_PROJECT_MAX_FILES, CLOUD_HARNESS_PROJECT_MAX_BYTES)",
                    limits.max_files, limits.max_bytes
                )));
            }
        }
    }
    Ok(())
}

/// Makes `conn` reach its remote through `transport` (our proxy, CA and timeouts).
pub(crate) fn use_transport<T>(
    conn: &mut gix::remote::Connection<'_, '_, '_, T>,
    transport: &Transport,
) -> std::result::Result<(), gix::Error>
where
    T: gix::protocol::transport::client::blocking_io::Transport,
{
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
}

/// The commit the remote's default branch head is at, asking for its refs only (no objects).
pub fn remote_head(url: &str, transport: &Transport) -> Result<gix::ObjectId> {
    let dir = tempfile::tempdir().map_err(|e| Error::internal(e.to_string()))?;
    let repo = gix::ThreadSafeRepository::init_opts(
        dir.path(),
        gix::create::Kind::Bare,
        gix::create::Options::default(),
        gix::open::Options::isolated(),
    )
    .map_err(|e| upstream(url, e))?
    .to_thread_local();
    let remote = repo
        .remote_at(url)
        .map_err(|e| upstream(url, e))?
        .with_refspecs(
            Some("+HEAD:refs/remotes/origin/HEAD"),
            gix::remote::Direction::Fetch,
        )
        .map_err(|e| upstream(url, e))?;
    let mut conn = remote
        .connect(gix::remote::Direction::Fetch)
        .map_err(|e| upstream(url, e))?;
    use_transport(&mut conn, transport).map_err(|e| upstream(url, e))?;
    let (refs, _) = conn
        .ref_map(gix::progress::Discard, Default::default())
        .map_err(|e| upstream(url, e))?;
    fetched_commit(url, &Revision::DefaultHead, &refs)
}

/// A clone of one commit, depth 1, with the remote's object format and our transport; no
/// object larger than `max_object` bytes is decoded (indexing the pack or reading it after).
fn prepare(
    url: &str,
    revision: &Revision,
    transport: &Transport,
    dir: &Path,
    kind: gix::create::Kind,
    max_object: u64,
) -> Result<gix::clone::PrepareFetch> {
    let transport = transport.clone();
    let prepare = gix::clone::PrepareFetch::new(
        url,
        dir,
        kind,
        gix::create::Options::default(),
        // No user or system git configuration: nothing may rewrite URLs or add helpers.
        gix::open::Options::isolated()
            .config_overrides([format!("gitoxide.objects.allocLimit={max_object}")]),
    )
    .map_err(|e| upstream(url, e))?
    .with_shallow(Shallow::DepthAtRemote(1.try_into().expect("1 is not zero")))
    .configure_connection(move |conn| use_transport(conn, &transport));
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
/// up at `deadline` or past the ceiling.
pub fn fetch(
    url: &str,
    revision: &Revision,
    transport: &Transport,
    dir: &Path,
    deadline: Instant,
    ceiling: &Ceiling<'_>,
    observer: &Observer,
) -> Result<Fetched> {
    let pack_dir = dir.join("objects/pack");
    watched(
        url,
        deadline,
        pack_dir.clone(),
        ceiling,
        observer,
        |interrupt| {
            let (repo, outcome) = prepare(
                url,
                revision,
                transport,
                dir,
                gix::create::Kind::Bare,
                ceiling.max_object,
            )?
            .fetch_only(gix::progress::Discard, interrupt)
            .map_err(|e| failed(url, dir, &e, ceiling))?;
            check_download(url, &pack_dir, ceiling)?;
            let commit = fetched_commit(url, revision, &outcome.ref_map)?;
            // The fetched commit must be there (a server may answer without it).
            repo.find_commit(commit)
                .map_err(|e| upstream(url, format!("commit {commit}: {e}")))?;
            let advertised = Some(crate::reach::Advertised::of(&outcome.ref_map));
            Ok(Fetched {
                repo,
                commit,
                advertised,
            })
        },
    )
}

/// Clones `revision` of `url` into `dir` with a checked-out working tree (a project
/// repository), depth 1, within `limits`; returns the commit.
pub fn clone_worktree(
    url: &str,
    revision: &Revision,
    transport: &Transport,
    dir: &Path,
    deadline: Instant,
    limits: CloneLimits,
) -> Result<gix::ObjectId> {
    let ceiling = Ceiling {
        max_bytes: limits.max_bytes,
        setting: "CLOUD_HARNESS_PROJECT_MAX_BYTES",
        max_object: limits.max_bytes,
        object_setting: "of the whole checkout (CLOUD_HARNESS_PROJECT_MAX_BYTES)",
    };
    let pack_dir = dir.join(".git/objects/pack");
    let observer = Observer::default();
    watched(
        url,
        deadline,
        pack_dir.clone(),
        &ceiling,
        &observer,
        |interrupt| {
            let mut prepare = prepare(
                url,
                revision,
                transport,
                dir,
                gix::create::Kind::WithWorktree,
                ceiling.max_object,
            )?;
            let (mut checkout, outcome) = prepare
                .fetch_then_checkout(gix::progress::Discard, interrupt)
                .map_err(|e| failed(url, dir, &e, &ceiling))?;
            check_download(url, &pack_dir, &ceiling)?;
            let commit = fetched_commit(url, revision, &outcome.ref_map)?;
            check_checkout(url, checkout.repo(), commit, limits)?;
            checkout
                .main_worktree(gix::progress::Discard, interrupt)
                .map_err(|e| {
                    local_disk(dir, &e)
                        .unwrap_or_else(|| upstream(url, format!("checking out: {e}")))
                })?;
            Ok(commit)
        },
    )
}

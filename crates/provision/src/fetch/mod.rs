//! Fetching one commit with gix: depth 1, into a scratch bare repository without a work tree,
//! over HTTPS (an extra CA and a proxy as configured). SHA-1 and SHA-256 repositories both work:
//! the scratch repository adopts the remote's object format. A download is watched as it
//! lands: past its byte ceiling or its deadline it is interrupted, and a project's checkout is
//! measured (files and bytes, from the tree) before anything is written.

mod checkout;
mod failure;
mod transport;
mod watch;

pub use checkout::CloneLimits;
pub(crate) use failure::{failed, failed_here, object_too_large, past_alloc_limit, upstream};
pub(crate) use transport::use_transport;
pub use transport::Transport;
pub use watch::Ceiling;
pub(crate) use watch::{pack_bytes, watched};

use crate::observe::Observer;
use checkout::check_checkout;
use cloud_harness_control::toolkit::Revision;
use cloud_harness_error::{Code, Error, Result};
use failure::local_disk;
use gix::remote::fetch::Shallow;
use std::path::Path;
use std::time::Instant;
use watch::check_download;

/// A fetched commit in a scratch repository (removed with the directory it lives in).
pub struct Fetched {
    pub repo: gix::Repository,
    pub commit: gix::ObjectId,
    /// The branches and tags the remote listed to this fetch (a fetch of a commit by id
    /// asks for every ref); none where a helper container fetched.
    pub advertised: Option<Advertised>,
}

/// What a remote listed to a connection: each ref with the commit it names (a tag peeled),
/// and the branch its `HEAD` names.
#[derive(Debug, Clone, Default)]
pub struct Advertised {
    pub refs: Vec<(String, gix::ObjectId)>,
    pub head: Option<String>,
}

impl Advertised {
    pub fn of(refs: &gix::remote::fetch::RefMap) -> Advertised {
        Advertised {
            refs: refs
                .remote_refs
                .iter()
                .filter_map(|r| {
                    let (name, target, peeled) = r.unpack();
                    Some((name.to_string(), peeled.or(target)?.to_owned()))
                })
                .collect(),
            head: refs.remote_refs.iter().find_map(|r| match r {
                gix::protocol::handshake::Ref::Symbolic {
                    full_ref_name,
                    target,
                    ..
                } if full_ref_name == "HEAD" => Some(target.to_string()),
                _ => None,
            }),
        }
    }
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
            // A fetch by id lists every ref (a tag or the head lists only its own).
            let advertised =
                matches!(revision, Revision::Commit(_)).then(|| Advertised::of(&outcome.ref_map));
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

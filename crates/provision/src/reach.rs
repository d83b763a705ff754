//! Whether a pinned commit belongs to its repository: reachable from a branch or a tag the
//! repository advertises. The large hosts serve a commit by its id through the parent's URL
//! when it was only ever pushed to a fork (an "imposter commit"): a pin names bytes, not who
//! published them. Checked at acquisition and recorded with the bundle (`BundleRecord::reach`),
//! so a warm start reads the record and asks nothing.
//!
//! How, with the git protocol alone (the same for every host; no host API is asked): the
//! advertised branches and tags first, where one at the commit settles it with nothing
//! fetched; otherwise the history of every branch and tag back to a day before the commit's
//! own date (`deepen-since`), received into a scratch repository under the fetch's ceiling and
//! deadline and walked from the tips; then once more back to 30 days before, for clocks that
//! disagree. A commit dated long ago by whoever made it makes that history large: the ceiling
//! refuses it (TOO_LARGE) rather than fetching the world.

use crate::fetch::{self, Ceiling, Transport};
use crate::observe::Observer;
use cloud_harness_error::{Code, Error, Result};
use gix::remote::fetch::Shallow;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

/// How far before the commit's own date its history is looked at, one fetch each.
const MARGINS: [i64; 2] = [86_400, 30 * 86_400];

/// Commits walked at most in one attempt (the ceiling bounds them first on any real host).
const MAX_WALK: usize = 2_000_000;

/// Refs named in a refusal (all are counted).
const NAMED: usize = 20;

/// How a commit was found to belong to its repository, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum How {
    /// It was asked for by a ref (a tag, the default branch): the repository named it.
    Requested,
    /// A branch or tag is at it.
    Advertised,
    /// It is in the history of a branch or tag.
    History,
    /// No branch or tag reaches it.
    NotFound,
}

/// The result of a check, kept with the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reach {
    pub reachable: bool,
    pub how: How,
    /// The branch or tag that reaches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Branches and tags looked at.
    pub refs: usize,
    /// When none reaches it: the first of them by name (branches first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tried: Vec<String>,
    /// The commit's committer date (seconds since the Unix epoch): where a new check starts.
    pub committed_at: i64,
    /// When it was checked (seconds since the Unix epoch).
    pub checked_at: u64,
}

impl Reach {
    /// A commit the repository's own ref `via` named when it was fetched.
    pub fn requested(via: &str, committed_at: i64) -> Reach {
        Reach {
            reachable: true,
            how: How::Requested,
            via: Some(via.to_owned()),
            refs: 1,
            tried: Vec::new(),
            committed_at,
            checked_at: now(),
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The refusal of `commit` of `url`, which `reach` found no branch or tag reaches.
pub fn not_in_repository(url: &str, commit: &str, reach: &Reach) -> Error {
    let (named, total) = (&reach.tried, reach.refs);
    let more = match total.saturating_sub(named.len()) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let refs = match named.is_empty() {
        true => "it advertises no branch or tag".to_owned(),
        false => format!("refs tried: {}{more}", named.join(", ")),
    };
    Error::new(
        Code::CommitNotInRepository,
        format!(
            "commit {commit} is not reachable from any branch or tag of {url} ({refs}); a commit pushed only to a fork is served by its id all the same. An operator can allow it for one registry entry (`cloud-harness registry allow-unreachable`)"
        ),
    )
    .with_details(serde_json::json!({
        "url": url,
        "commit": commit,
        "refs": named,
        "refsTried": total,
    }))
}

/// A branch or tag and the commit it is at (a tag peeled).
struct Tip {
    name: String,
    id: gix::ObjectId,
}

/// Whether `commit` (of `object_hash`, committed at `committed_at`) is reachable from a
/// branch or tag of `url`, found in scratch repositories under `scratch`. A download past
/// `ceiling` or `deadline` is that error: nothing was established.
#[allow(clippy::too_many_arguments)]
pub fn check(
    url: &str,
    commit: gix::ObjectId,
    object_hash: gix::hash::Kind,
    committed_at: i64,
    transport: &Transport,
    scratch: &Path,
    deadline: Instant,
    ceiling: &Ceiling<'_>,
    observer: &Observer,
) -> Result<Reach> {
    let mut tried = Vec::new();
    for (attempt, margin) in MARGINS.iter().enumerate() {
        let dir = tempfile::Builder::new()
            .prefix("reach-")
            .tempdir_in(scratch)
            .map_err(|e| Error::io(scratch, e))?;
        let cutoff = committed_at.saturating_sub(*margin);
        let found = fetch::watched(
            url,
            deadline,
            dir.path().join("objects/pack"),
            ceiling,
            observer,
            |interrupt| {
                attempt_once(
                    url,
                    (commit, object_hash),
                    cutoff,
                    attempt == 0,
                    transport,
                    dir.path(),
                    ceiling,
                    interrupt,
                )
            },
        )?;
        match found {
            Found::Yes { how, via, refs } => {
                return Ok(Reach {
                    reachable: true,
                    how,
                    via: Some(via),
                    refs,
                    tried: Vec::new(),
                    committed_at,
                    checked_at: now(),
                })
            }
            Found::No(names) => tried = names,
        }
    }
    Ok(Reach {
        reachable: false,
        how: How::NotFound,
        via: None,
        refs: tried.len(),
        tried: tried.into_iter().take(NAMED).collect(),
        committed_at,
        checked_at: now(),
    })
}

enum Found {
    Yes {
        how: How,
        via: String,
        refs: usize,
    },
    /// Not reached from these refs.
    No(Vec<String>),
}

/// One connection: the refs, and unless one is at the commit (looked for when `look_at_tips`),
/// the history since `cutoff` walked from them.
#[allow(clippy::too_many_arguments)]
fn attempt_once(
    url: &str,
    (commit, object_hash): (gix::ObjectId, gix::hash::Kind),
    cutoff: i64,
    look_at_tips: bool,
    transport: &Transport,
    dir: &Path,
    ceiling: &Ceiling<'_>,
    interrupt: &std::sync::atomic::AtomicBool,
) -> Result<Found> {
    let up = |e: &dyn std::fmt::Display| fetch::upstream(url, e);
    let repo = gix::ThreadSafeRepository::init_opts(
        dir,
        gix::create::Kind::Bare,
        gix::create::Options {
            object_hash: Some(object_hash),
            ..Default::default()
        },
        gix::open::Options::isolated().config_overrides([format!(
            "gitoxide.objects.allocLimit={}",
            ceiling.max_object
        )]),
    )
    .map_err(|e| up(&e))?
    .to_thread_local();
    let remote = repo
        .remote_at(url)
        .map_err(|e| up(&e))?
        .with_fetch_tags(gix::remote::fetch::Tags::None)
        .with_refspecs(
            ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"],
            gix::remote::Direction::Fetch,
        )
        .map_err(|e| up(&e))?;
    let mut conn = remote
        .connect(gix::remote::Direction::Fetch)
        .map_err(|e| up(&e))?;
    fetch::use_transport(&mut conn, transport).map_err(|e| up(&e))?;
    let prepare = conn
        .prepare_fetch(gix::progress::Discard, Default::default())
        .map_err(|e| up(&e))?;
    let tips = tips(prepare.ref_map());
    let names = || tips.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    if look_at_tips {
        if let Some(tip) = tips.iter().find(|t| t.id == commit) {
            return Ok(Found::Yes {
                how: How::Advertised,
                via: tip.name.clone(),
                refs: tips.len(),
            });
        }
    }
    if tips.is_empty() {
        return Ok(Found::No(Vec::new()));
    }
    if prepare.ref_map().object_hash != object_hash {
        return Err(Error::new(
            Code::Upstream,
            format!("{url} changed its object format since the commit was fetched"),
        ));
    }
    prepare
        .with_shallow(Shallow::Since {
            cutoff: gix::date::Time::new(cutoff, 0),
        })
        .receive(gix::progress::Discard, interrupt)
        .map_err(|e| fetch::failed(url, dir, &e, ceiling))?;
    Ok(match walk(&repo, &tips, commit)? {
        Some(via) => Found::Yes {
            how: How::History,
            via,
            refs: tips.len(),
        },
        None => Found::No(names()),
    })
}

/// The branches, then the tags, the remote advertised, each at the commit it names.
fn tips(refs: &gix::remote::fetch::RefMap) -> Vec<Tip> {
    let mut tips: Vec<Tip> = refs
        .remote_refs
        .iter()
        .filter_map(|r| {
            let (name, target, peeled) = r.unpack();
            let id = peeled.or(target)?.to_owned();
            let name = name.to_string();
            (name.starts_with("refs/heads/") || name.starts_with("refs/tags/"))
                .then_some(Tip { name, id })
        })
        .collect();
    tips.sort_by_key(|t| !t.name.starts_with("refs/heads/"));
    tips
}

/// The first tip whose history (as far as it was received) holds `commit`; every commit is
/// visited once however many tips share it.
fn walk(repo: &gix::Repository, tips: &[Tip], commit: gix::ObjectId) -> Result<Option<String>> {
    let mut seen = HashSet::new();
    for tip in tips {
        let mut pending = vec![tip.id];
        while let Some(id) = pending.pop() {
            if !seen.insert(id) {
                continue;
            }
            if id == commit {
                return Ok(Some(tip.name.clone()));
            }
            if seen.len() > MAX_WALK {
                return Err(Error::too_large(format!(
                    "the history looked at for commit {commit} holds more than {MAX_WALK} commits"
                )));
            }
            // Past the shallow boundary a parent is not there: that path ends.
            if let Ok(c) = repo.find_commit(id) {
                pending.extend(c.parent_ids().map(|p| p.detach()));
            }
        }
    }
    Ok(None)
}

//! Whether a pinned commit belongs to its repository: reachable from a branch or a tag the
//! repository advertises. The large hosts serve a commit by its id through the parent's URL
//! when it was only ever pushed to a fork (an "imposter commit"): a pin names bytes, not who
//! published them. Checked at acquisition and recorded with the bundle (`BundleRecord::reach`),
//! so a warm start reads the record and asks nothing.
//!
//! How, with the git protocol alone (the same for every host; no host API is asked): the
//! advertised branches and tags first, where one at the commit settles it with nothing
//! fetched; otherwise the default branch's history back to a day before the commit's own
//! date (`deepen-since`), received into a scratch repository under the fetch's ceiling and
//! deadline and walked from its tip; then every branch's and tag's back to 30 days before.
//! A commit dated long ago by whoever made it, or old tags (`deepen-since` bounds only tips
//! newer than the date), make that history large: the ceiling refuses it (TOO_LARGE) rather
//! than fetching the world.

use crate::fetch::{self, Advertised, Ceiling, Transport};
use crate::observe::Observer;
use cloud_harness_error::{Code, Error, Result};
use gix::remote::fetch::Shallow;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// How far before the commit's own date (or now, if that is later) its history is looked at:
/// the default branch's, then every branch's and tag's.
const MARGINS: [i64; 2] = [86_400, 30 * 86_400];

/// Commits walked at most in one attempt (the ceiling bounds them first on any real host).
const MAX_WALK: usize = 2_000_000;

/// Refs named in a refusal (all are counted), and the longest name shown.
const NAMED: usize = 20;
const NAME_SHOWN: usize = 200;

/// Branches a host makes of commits it has not merged (GitHub's merge queue): not the
/// repository's publishing.
const NOT_PUBLISHED: [&str; 1] = ["refs/heads/gh-readonly-queue/"];

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
    /// The check did not finish (the error says why); served only where an entry allows it.
    Unknown,
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

    /// A check that did not finish.
    pub fn unknown(committed_at: i64) -> Reach {
        Reach {
            reachable: false,
            how: How::Unknown,
            via: None,
            refs: 0,
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

/// A ref name as a message shows it: bounded, without control characters.
fn shown(name: &str) -> String {
    name.chars()
        .take(NAME_SHOWN)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A branch or tag and the commit it is at (a tag peeled).
struct Tip {
    name: String,
    id: gix::ObjectId,
}

/// Where the history looked at starts: every branch and tag, or the default branch alone.
#[derive(Clone, Copy, PartialEq)]
enum Tips {
    All,
    DefaultBranch,
}

/// What a check is about, and what it may spend.
struct Job<'a> {
    url: &'a str,
    commit: gix::ObjectId,
    object_hash: gix::hash::Kind,
    transport: &'a Transport,
    ceiling: &'a Ceiling<'a>,
}

/// Whether `commit` (of `object_hash`, committed at `committed_at`) is reachable from a
/// branch or tag of `url`, found in scratch repositories under `scratch`: the advertised refs
/// (those the commit's own fetch was given, if it listed branches, else asked for);
/// then the default branch's history since a day before the commit (where most pins are);
/// then every branch's and tag's since 30 days before. git's `deepen-since` bounds only the
/// tips newer than the date (an old tag brings its whole history), so the last step can be
/// large: past `ceiling` or `deadline` it is that error, and nothing was established.
#[allow(clippy::too_many_arguments)]
pub fn check(
    url: &str,
    commit: gix::ObjectId,
    object_hash: gix::hash::Kind,
    committed_at: i64,
    advertised: Option<Advertised>,
    transport: &Transport,
    scratch: &Path,
    deadline: Instant,
    ceiling: &Ceiling<'_>,
    observer: &Observer,
) -> Result<Reach> {
    let found = |how, via: &str, refs| Reach {
        reachable: true,
        how,
        via: Some(shown(via)),
        refs,
        tried: Vec::new(),
        committed_at,
        checked_at: now(),
    };
    let context = |e: Error| {
        let message = format!(
            "checking that commit {commit} is reachable from a branch or tag of {url}: {}",
            e.message
        );
        Error { message, ..e }
    };
    let run = |tips: Tips, margin: Option<i64>| {
        // Each read of an answer waits at most what is left (reqwest bounds every read, not a
        // whole answer); the watcher interrupts what it can at the deadline.
        let transport = Transport {
            timeout: Some(deadline.saturating_duration_since(Instant::now())),
            ..transport.clone()
        };
        let job = Job {
            url,
            commit,
            object_hash,
            transport: &transport,
            ceiling,
        };
        let dir = tempfile::Builder::new()
            .prefix("reach-")
            .tempdir_in(scratch)
            .map_err(|e| Error::io(scratch, e))?;
        // A commit dated ahead of this clock is looked for from now (its tips are not newer);
        // git reads a date before 1970 as none at all.
        let cutoff = margin.map(|m| committed_at.min(now() as i64).saturating_sub(m).max(1));
        fetch::watched(
            url,
            deadline,
            dir.path().join("objects/pack"),
            ceiling,
            observer,
            |interrupt| look(&job, dir.path(), tips, cutoff, interrupt),
        )
        .map_err(context)
    };
    // The refs alone: a branch or tag at the commit.
    let advertised = match advertised.filter(|a| !published(a, Tips::All).is_empty()) {
        Some(a) => a,
        None => run(Tips::All, None)?.advertised,
    };
    let tips = published(&advertised, Tips::All);
    let names: Vec<String> = tips.iter().map(|t| t.name.clone()).collect();
    if let Some(tip) = tips.iter().find(|t| t.id == commit) {
        return Ok(found(How::Advertised, &tip.name, names.len()));
    }
    if !names.is_empty() {
        if let Some(branch) = &advertised.head {
            if run(Tips::DefaultBranch, Some(MARGINS[0]))?.via.is_some() {
                return Ok(found(How::History, branch, names.len()));
            }
        }
        if let Some(via) = run(Tips::All, Some(MARGINS[1]))?.via {
            return Ok(found(How::History, &via, names.len()));
        }
    }
    Ok(Reach {
        reachable: false,
        how: How::NotFound,
        via: None,
        refs: names.len(),
        tried: names.iter().take(NAMED).map(|n| shown(n)).collect(),
        committed_at,
        checked_at: now(),
    })
}

/// What one connection found: the refs, those of them looked from, and (when history was
/// fetched) the one whose history holds the commit.
struct Looked {
    advertised: Advertised,
    tips: Vec<Tip>,
    via: Option<String>,
}

/// One connection: the refs `tips` names, and with a `cutoff` their history since then,
/// received and walked.
fn look(
    job: &Job<'_>,
    dir: &Path,
    tips: Tips,
    cutoff: Option<i64>,
    interrupt: &AtomicBool,
) -> Result<Looked> {
    let url = job.url;
    let up = |e: &dyn std::fmt::Display| fetch::upstream(url, e);
    let repo = gix::ThreadSafeRepository::init_opts(
        dir,
        gix::create::Kind::Bare,
        gix::create::Options {
            object_hash: Some(job.object_hash),
            ..Default::default()
        },
        gix::open::Options::isolated().config_overrides([format!(
            "gitoxide.objects.allocLimit={}",
            job.ceiling.max_object
        )]),
    )
    .map_err(|e| up(&e))?
    .to_thread_local();
    let specs: &[&str] = match tips {
        Tips::All => &[
            "+HEAD:refs/remotes/origin/HEAD",
            "+refs/heads/*:refs/heads/*",
            "+refs/tags/*:refs/tags/*",
        ],
        Tips::DefaultBranch => &["+HEAD:refs/remotes/origin/HEAD"],
    };
    let remote = repo
        .remote_at(url)
        .map_err(|e| up(&e))?
        .with_fetch_tags(gix::remote::fetch::Tags::None)
        .with_refspecs(specs.iter().copied(), gix::remote::Direction::Fetch)
        .map_err(|e| up(&e))?;
    let mut conn = remote
        .connect(gix::remote::Direction::Fetch)
        .map_err(|e| up(&e))?;
    fetch::use_transport(&mut conn, job.transport).map_err(|e| up(&e))?;
    let prepare = conn
        .prepare_fetch(gix::progress::Discard, Default::default())
        .map_err(|e| up(&e))?;
    let refs = prepare.ref_map();
    let advertised = Advertised::of(refs);
    let mut found = Looked {
        tips: published(&advertised, tips),
        advertised,
        via: None,
    };
    let Some(cutoff) = cutoff.filter(|_| !found.tips.is_empty()) else {
        return Ok(found);
    };
    if refs.object_hash != job.object_hash {
        return Err(Error::new(
            Code::Upstream,
            format!("{url} changed its object format since the commit was fetched"),
        ));
    }
    let received = prepare
        .with_shallow(Shallow::Since {
            cutoff: gix::date::Time::new(cutoff, 0),
        })
        .receive(gix::progress::Discard, interrupt);
    match received {
        Ok(_) => {}
        Err(e) if interrupt.load(Ordering::Relaxed) => {
            return Err(fetch::failed(url, dir, &e, job.ceiling))
        }
        // A server that finds nothing of any tip since the cutoff ends its answer early (git
        // says so only in its own log): no tip reaches a commit of that date. Anything else
        // that cut the history short leaves this step without an answer too.
        Err(e) => {
            if let Some(local) = fetch::failed_here(url, dir, &e, job.ceiling) {
                return Err(local);
            }
            tracing::debug!(url, error = %e, "the history since the cutoff was not received");
            return Ok(found);
        }
    }
    found.via = walk(&repo, &found.tips, job.commit, interrupt)?;
    Ok(found)
}

/// The tips `tips` asks for, each at the commit it names: the default branch (as `HEAD`), or
/// the branches, then the tags, the remote advertised, but those a host makes of commits it
/// has not merged.
fn published(advertised: &Advertised, tips: Tips) -> Vec<Tip> {
    let mut out: Vec<Tip> = advertised
        .refs
        .iter()
        .filter_map(|(name, id)| {
            let wanted = match tips {
                Tips::DefaultBranch => name == "HEAD",
                Tips::All => {
                    (name.starts_with("refs/heads/") || name.starts_with("refs/tags/"))
                        && !NOT_PUBLISHED.iter().any(|p| name.starts_with(p))
                }
            };
            wanted.then(|| Tip {
                name: name.clone(),
                id: *id,
            })
        })
        .collect();
    out.sort_by_key(|t| !t.name.starts_with("refs/heads/"));
    out
}

/// The first tip whose history (as far as it was received) holds `commit`. Every commit is
/// looked at once however many tips and merges share it, and at most [`MAX_WALK`] of them;
/// a raised `interrupt` (the deadline, a cancel) stops it.
fn walk(
    repo: &gix::Repository,
    tips: &[Tip],
    commit: gix::ObjectId,
    interrupt: &AtomicBool,
) -> Result<Option<String>> {
    let mut seen = HashSet::new();
    let mut pending = Vec::new();
    for tip in tips {
        if seen.insert(tip.id) {
            pending.push(tip.id);
        }
        while let Some(id) = pending.pop() {
            if id == commit {
                return Ok(Some(tip.name.clone()));
            }
            if interrupt.load(Ordering::Relaxed) {
                return Err(Error::new(
                    Code::Timeout,
                    format!("looking for commit {commit} took longer than the time allowed"),
                ));
            }
            // Past the shallow boundary a parent is not there: that path ends.
            let Ok(c) = repo.find_commit(id) else {
                continue;
            };
            for parent in c.parent_ids() {
                if seen.insert(parent.detach()) {
                    if seen.len() > MAX_WALK {
                        return Err(Error::too_large(format!(
                            "the history looked at for commit {commit} holds more than {MAX_WALK} commits"
                        )));
                    }
                    pending.push(parent.detach());
                }
            }
        }
    }
    Ok(None)
}

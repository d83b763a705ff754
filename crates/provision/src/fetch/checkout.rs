//! A project's checkout measured before anything is written: files, bytes and depth, from
//! the tree, within the ceilings of a project repository's clone.

use super::failure::upstream;
use cloud_harness_error::{Error, Result};

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

/// Folders a checkout may nest: no path can be longer than 4,096 bytes (PATH_MAX), so a tree
/// nested deeper than this could never be written out.
const MAX_CHECKOUT_DEPTH: usize = 2048;

/// Refuses a checkout of `commit` with more files or bytes than `limits`, or folders nested
/// deeper than [`MAX_CHECKOUT_DEPTH`], before any is written. The trees are read one at a time
/// from a stack of their ids (a hostile tree of 100,000 levels costs neither call stack nor
/// a path per level).
pub(super) fn check_checkout(
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

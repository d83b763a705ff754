//! The local store as a bounded cache: with `TOOLKIT_CACHE_MAX_BYTES` set, a collection that
//! leaves the store's objects above that size forgets bundles, least recently used first
//! (a bundle's use is its record's mtime: set when it is recorded and at every warm start),
//! and collects again, until the store fits. A bundle an open workspace serves (any root
//! besides the bundle index's own names it) is never forgotten, nor one used within the grace
//! period, so an acquisition that just found it cannot lose it before its workspace roots it.
//! A forgotten bundle comes back from the store of record, or from git, when next asked for.

use super::index::BundleIndex;
use super::staging::env_number;
use cloud_harness_fs::cas::{GcReport, Store};
use cloud_harness_fs::{Error, Result};
use serde::Serialize;
use std::collections::HashSet;
use std::fs;
use std::time::{Duration, SystemTime};

pub const MAX_BYTES_VAR: &str = "TOOLKIT_CACHE_MAX_BYTES";

/// `TOOLKIT_CACHE_MAX_BYTES`, if set.
pub fn max_bytes_from_env() -> Result<Option<u64>> {
    match std::env::var(MAX_BYTES_VAR) {
        Ok(v) if !v.is_empty() => env_number(MAX_BYTES_VAR, 0).map(Some),
        _ => Ok(None),
    }
}

#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trim {
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// `url@commit` of every bundle forgotten, least recently used first.
    pub forgotten: Vec<String>,
    pub removed: u64,
    pub removed_bytes: u64,
    pub removed_temp: u64,
}

/// The bytes of every object in the store.
pub fn object_bytes(store: &Store) -> Result<u64> {
    let mut total = 0;
    for kind in ["blob", "tree"] {
        let top = store.root().join("objects").join(kind);
        let shards = fs::read_dir(&top).map_err(|e| Error::io(&top, e))?;
        for shard in shards.flatten() {
            for object in fs::read_dir(shard.path()).into_iter().flatten().flatten() {
                total += object.metadata().map_or(0, |m| m.len());
            }
        }
    }
    Ok(total)
}

/// Collects the store (objects no root reaches, older than `grace`), then, while it is
/// above `max_bytes`, forgets the least recently used bundle it may and collects again.
pub fn collect(store: &Store, grace: Duration, max_bytes: Option<u64>) -> Result<Trim> {
    let mut trim = Trim::default();
    let add = |trim: &mut Trim, r: GcReport| {
        trim.removed += r.removed;
        trim.removed_bytes += r.removed_bytes;
        trim.removed_temp += r.removed_temp;
    };
    let first = store.gc(grace)?;
    trim.bytes_before = object_bytes(store)? + first.removed_bytes;
    add(&mut trim, first);
    let mut size = object_bytes(store)?;
    if let Some(max) = max_bytes {
        let index = BundleIndex::open(store);
        // Digests other roots hold: workspaces (what mounts serve) and operators' own.
        let served: HashSet<_> = store
            .roots()?
            .into_iter()
            .filter(|(name, _)| !name.starts_with("bundles/") && !name.starts_with("manifests/"))
            .map(|(_, digest)| digest)
            .collect();
        let recent = SystemTime::now() - grace;
        let mut candidates: Vec<_> = index
            .list()?
            .into_iter()
            .filter(|r| !served.contains(&r.bundle))
            .filter_map(|r| {
                let used = index.last_used(&r.key)?;
                (used < recent).then_some((used, r))
            })
            .collect();
        candidates.sort_by_key(|(used, _)| *used);
        for (_, record) in candidates {
            if size <= max {
                break;
            }
            index.remove(&record.key)?;
            trim.forgotten
                .push(format!("{}@{}", record.key.url, record.key.commit));
            // The forgotten bundle's objects are old (written or reused before `recent`)
            // unless another bundle shares them, which then keeps them.
            add(&mut trim, store.gc(grace)?);
            size = object_bytes(store)?;
        }
    }
    trim.bytes_after = size;
    Ok(trim)
}

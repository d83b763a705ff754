//! The local store as a bounded cache: with `TOOLKIT_CACHE_MAX_BYTES` set, a collection that
//! leaves the store's objects above that size forgets bundles, least recently used first
//! (a bundle's use is its record's mtime: set when it is recorded and at every warm start),
//! and collects again, until the store fits. A bundle an open workspace serves (any root
//! besides the bundle index's own names it) is never forgotten, nor one used within the grace
//! period, so an acquisition that just found it cannot lose it before its workspace roots it.
//! A forgotten bundle comes back from the store of record, or from git, when next asked for.

use super::index::BundleIndex;
use cloud_harness_control::config::env_number;
use cloud_harness_error::Result;
use cloud_harness_store::cas::{GcReport, Progress, Store, Unwatched};
use serde::Serialize;
use std::collections::HashSet;
use std::time::{Duration, SystemTime};

pub(crate) const MAX_BYTES_VAR: &str = "TOOLKIT_CACHE_MAX_BYTES";

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
    /// The objects' bytes before and after, measured only with a bound to keep.
    pub bytes_before: Option<u64>,
    pub bytes_after: Option<u64>,
    /// `url@commit` of every bundle forgotten, least recently used first.
    pub forgotten: Vec<String>,
    pub removed: u64,
    pub removed_bytes: u64,
    pub removed_temp: u64,
}

/// Collects the store (objects no root reaches, older than `grace`), then, while it is
/// above `max_bytes`, forgets the least recently used bundle it may and collects again.
pub fn collect(store: &Store, grace: Duration, max_bytes: Option<u64>) -> Result<Trim> {
    collect_watched(store, grace, max_bytes, &Unwatched)
}

/// [`collect`], telling `progress` how each collection goes.
pub fn collect_watched(
    store: &Store,
    grace: Duration,
    max_bytes: Option<u64>,
    progress: &dyn Progress,
) -> Result<Trim> {
    let mut trim = Trim::default();
    let add = |trim: &mut Trim, r: GcReport| {
        trim.removed += r.removed;
        trim.removed_bytes += r.removed_bytes;
        trim.removed_temp += r.removed_temp;
        r.removed_bytes
    };
    // Without a bound, a collection is all there is: no walk to size the store.
    let Some(max) = max_bytes else {
        add(&mut trim, store.gc_watched(grace, progress)?);
        return Ok(trim);
    };
    // Sized once; each collection's report says what it freed.
    let mut size = store.object_bytes()?;
    trim.bytes_before = Some(size);
    size = size.saturating_sub(add(&mut trim, store.gc_watched(grace, progress)?));
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
        size = size.saturating_sub(add(&mut trim, store.gc_watched(grace, progress)?));
    }
    trim.bytes_after = Some(size);
    Ok(trim)
}

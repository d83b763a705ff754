//! Garbage collection of the store of record: one collector at a time in the whole fleet (a
//! lease in the bucket, taken and taken over with conditional puts), every object some index
//! record reaches kept, and what none reaches removed once it is older than a grace period (an
//! object uploaded for a record not yet written is young).
//!
//! Records are the roots: every bundle a registry pin, a set member or an open workspace uses
//! was acquired, so has one. Retiring records themselves needs those roots from a shared
//! database, which the fleet does not have yet; so today what is collected is what
//! interrupted publications and deleted records left.

use super::{get, put_new, unreachable, wait, Got, RemoteStore, AT_ONCE, MAX_RECORD};
use crate::index::BundleRecord;
use cloud_harness_control::state::now_ms;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Kind, Tree, MAX_TREE_BYTES};
use futures_util::stream::FuturesUnordered;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::time::Duration;

/// How long a lease lasts; a collector stops deleting before it runs out.
const LEASE_FOR: Duration = Duration::from_secs(600);
/// The margin before the lease's end after which nothing more is deleted.
const LEASE_MARGIN: Duration = Duration::from_secs(60);
/// The largest lease read (one is a few dozen bytes).
const MAX_LEASE: u64 = 64 << 10;

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetGcReport {
    pub records: usize,
    pub kept: usize,
    /// Unreached, but younger than the grace period.
    pub young: usize,
    pub removed: usize,
    pub removed_bytes: u64,
    /// Records that are not bundle records this collector can read: skipped, each named
    /// with why. What one names (a `bundle` and a `manifest` it gives, however bad the rest)
    /// is kept all the same.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedRecord {
    /// Its key in the bucket.
    pub record: String,
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeaseBody {
    holder: String,
    expires_at_ms: i64,
}

struct Lease {
    expires_at_ms: i64,
}

impl RemoteStore {
    fn lease_path(&self) -> ObjectPath {
        self.path("gc/lease")
    }

    /// Collects the store of record as `holder` (a name for the operator: host and pid).
    /// CONFLICT while another collector's lease holds.
    pub fn gc(&self, grace: Duration, holder: &str) -> Result<FleetGcReport> {
        let lease = self.take_lease(holder)?;
        let result = self.collect(grace, &lease);
        self.release_lease(holder);
        result
    }

    fn take_lease(&self, holder: &str) -> Result<Lease> {
        let expires_at_ms = now_ms() + LEASE_FOR.as_millis() as i64;
        let body = serde_json::to_vec(&LeaseBody {
            holder: holder.to_owned(),
            expires_at_ms,
        })
        .map_err(|e| Error::internal(e.to_string()))?;
        let (objects, url, path) = (self.objects.clone(), self.url.clone(), self.lease_path());
        wait(async move {
            let fail = |e| unreachable(&url, e);
            if put_new(&objects, &path, body.clone()).await.map_err(fail)? {
                return Ok(Lease { expires_at_ms });
            }
            // Someone holds or held it: taken over only once it has run out, and only if it
            // is still the lease we read (`If-Match`), so two collectors cannot both win.
            let current = match objects.get(&path).await {
                Ok(current) => current,
                // Released between our put and our read: try again later.
                Err(object_store::Error::NotFound { .. }) => return Err(busy(&url, None)),
                Err(e) => return Err(fail(e)),
            };
            let version = UpdateVersion {
                e_tag: current.meta.e_tag.clone(),
                version: current.meta.version.clone(),
            };
            // A lease too large to be one is not one: it is taken over as run out.
            let held: Option<LeaseBody> = match current.meta.size <= MAX_LEASE {
                true => serde_json::from_slice(&current.bytes().await.map_err(fail)?).ok(),
                false => None,
            };
            if let Some(held) = held.filter(|h| h.expires_at_ms > now_ms()) {
                return Err(busy(&url, Some(&held)));
            }
            let options = PutOptions {
                mode: PutMode::Update(version),
                ..PutOptions::default()
            };
            match objects
                .put_opts(&path, PutPayload::from(body), options)
                .await
            {
                Ok(_) => Ok(Lease { expires_at_ms }),
                Err(object_store::Error::Precondition { .. }) => Err(busy(&url, None)),
                Err(e) => Err(fail(e)),
            }
        })
    }

    /// Gives the lease back if it is still this holder's (an expired one another collector
    /// took over is left alone).
    fn release_lease(&self, holder: &str) {
        let (objects, path, holder) = (self.objects.clone(), self.lease_path(), holder.to_owned());
        let _ = wait(async move {
            let Ok(Got::Bytes(bytes)) = get(&objects, &path, MAX_LEASE).await else {
                return Ok(());
            };
            let held: Option<LeaseBody> = serde_json::from_slice(&bytes).ok();
            if held.is_some_and(|h| h.holder == holder) {
                let _ = objects.delete(&path).await;
            }
            Ok(())
        });
    }

    fn collect(&self, grace: Duration, lease: &Lease) -> Result<FleetGcReport> {
        let remote = self.clone();
        let grace_ms = grace.as_millis() as i64;
        let deadline_ms = lease.expires_at_ms - LEASE_MARGIN.as_millis() as i64;
        wait(async move { remote.collect_async(grace_ms, deadline_ms).await })
    }

    /// Every object under `<prefix>/<under>`.
    async fn list(&self, under: &str) -> Result<Vec<object_store::ObjectMeta>> {
        self.objects
            .list(Some(&self.path(under)))
            .try_collect()
            .await
            .map_err(|e| unreachable(&self.url, e))
    }

    async fn collect_async(&self, grace_ms: i64, deadline_ms: i64) -> Result<FleetGcReport> {
        let fail = |e| unreachable(&self.url, e);
        let mut report = FleetGcReport::default();
        // Mark: every record's manifest and everything below its bundle. A record that is
        // not one (unreadable, or past a record's bounds) cannot be used by any runner; it is
        // skipped, and what it names is kept anyway. Only a record too large to read at all
        // stops the collection: what it names cannot be known, so a sweep could remove it.
        let records = self.list("index/bundles").await?;
        let mut roots = Vec::new();
        let mut named_by_skipped = Vec::new();
        // Packs are kept by the records that name them, and by nothing else.
        let mut packs: HashSet<Digest> = HashSet::new();
        for meta in &records {
            let bytes = match get(&self.objects, &meta.location, MAX_RECORD)
                .await
                .map_err(fail)?
            {
                Got::Bytes(bytes) => bytes,
                Got::Missing => continue,
                Got::TooLarge(size) => {
                    return Err(Error::new(
                        Code::Upstream,
                        format!(
                            "the record {} is {size} bytes or more, more than the {MAX_RECORD} a record may have: what it names cannot be read, so nothing was collected (remove the record, then collect again)",
                            meta.location
                        ),
                    )
                    .with_details(serde_json::json!({
                        "store": self.url,
                        "record": meta.location.as_ref(),
                        "limit": MAX_RECORD,
                    })))
                }
            };
            match BundleRecord::decode(&bytes) {
                Ok(record) => {
                    packs.extend(record.pack.map(|p| p.digest));
                    roots.push((record.bundle, record.manifest));
                }
                Err(e) => {
                    tracing::warn!(store = %self.url, record = %meta.location, error = %e.message, "the collector skipped a record that is not one; what it names is kept");
                    named_by_skipped.extend(named_by(&bytes));
                    packs.extend(pack_named_by(&bytes));
                    report.skipped.push(SkippedRecord {
                        record: meta.location.to_string(),
                        reason: e.message,
                    });
                }
            }
        }
        report.records = roots.len();
        let mut marked: HashSet<(bool, Digest)> = HashSet::new();
        let mut trees = Vec::new();
        for (bundle, manifest) in roots {
            marked.insert((false, manifest));
            if marked.insert((true, bundle)) {
                trees.push(bundle);
            }
        }
        self.mark_trees(trees, &mut marked, true).await?;
        let mut trees = Vec::new();
        for (is_tree, digest) in named_by_skipped {
            if marked.insert((is_tree, digest)) && is_tree {
                trees.push(digest);
            }
        }
        self.mark_trees(trees, &mut marked, false).await?;

        // Sweep: what no record reaches and the grace period no longer covers.
        let objects = self.list("objects").await?;
        let now = now_ms();
        for meta in objects {
            let Some(name) = self.object_name(&meta.location) else {
                continue;
            };
            let kept = match name {
                Named::Object(is_tree, digest) => marked.contains(&(is_tree, digest)),
                Named::Pack(digest) => packs.contains(&digest),
            };
            if kept {
                report.kept += 1;
                continue;
            }
            if now - meta.last_modified.timestamp_millis() < grace_ms {
                report.young += 1;
                continue;
            }
            if now_ms() > deadline_ms {
                return Err(Error::new(
                    Code::Timeout,
                    "the collector's lease is about to run out; it stopped (run it again)",
                ));
            }
            match self.objects.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    report.removed += 1;
                    report.removed_bytes += meta.size;
                }
                Err(e) => return Err(fail(e)),
            }
        }
        Ok(report)
    }

    /// Marks every object below `trees`, reading each tree from the bucket (verified). With
    /// `strict`, a tree that cannot be read stops the collection: a sweep after an incomplete
    /// mark could remove what a record needs. Below what skipped records name, one that
    /// cannot be read is left aside (no runner can use it).
    async fn mark_trees(
        &self,
        mut queue: Vec<Digest>,
        marked: &mut HashSet<(bool, Digest)>,
        strict: bool,
    ) -> Result<()> {
        let mut under_way = FuturesUnordered::new();
        loop {
            while under_way.len() < AT_ONCE {
                let Some(digest) = queue.pop() else { break };
                under_way.push(async move {
                    let path = self.object_path(cloud_harness_store::cas::ObjectKind::Tree, &digest);
                    let bytes = match get(&self.objects, &path, MAX_TREE_BYTES)
                        .await
                        .map_err(|e| unreachable(&self.url, e))?
                    {
                        Got::Bytes(bytes) => Some(bytes),
                        Got::Missing | Got::TooLarge(_) => None,
                    };
                    let tree = bytes
                        .filter(|b| Digest::of(b) == digest)
                        .and_then(|b| Tree::decode(&b).ok())
                        .ok_or_else(|| {
                            Error::new(
                                Code::Upstream,
                                format!(
                                    "tree {digest}, which a record reaches, is missing or bad in {}; nothing was collected",
                                    self.url
                                ),
                            )
                            .with_details(serde_json::json!({ "object": digest.to_string() }))
                        })?;
                    Ok::<_, Error>(tree)
                });
            }
            let Some(tree) = under_way.next().await else {
                return Ok(());
            };
            let tree = match tree {
                Ok(tree) => tree,
                // An outage stops it either way (the tree may be fine).
                Err(e) if strict || e.details.get("retryable").is_some() => return Err(e),
                Err(_) => continue,
            };
            for e in tree.entries() {
                let is_tree = e.kind == Kind::Tree;
                if marked.insert((is_tree, e.digest)) && is_tree {
                    queue.push(e.digest);
                }
            }
        }
    }

    /// The kind and digest an object's key names (`…/objects/blob/ab/cdef…`, `…/tree/…`,
    /// `…/pack/…`).
    fn object_name(&self, location: &ObjectPath) -> Option<Named> {
        let parts: Vec<_> = location.parts().collect();
        let n = parts.len();
        if n < 4 {
            return None;
        }
        let hex = format!("{}{}", parts[n - 2].as_ref(), parts[n - 1].as_ref());
        let digest = Digest::parse(&hex).ok()?;
        match parts[n - 3].as_ref() {
            "tree" => Some(Named::Object(true, digest)),
            "blob" => Some(Named::Object(false, digest)),
            "pack" => Some(Named::Pack(digest)),
            _ => None,
        }
    }
}

/// What an object's key names.
enum Named {
    /// A blob (false) or a tree (true).
    Object(bool, Digest),
    Pack(Digest),
}

/// The pack a record that is not one still names (`pack.digest`), if it is JSON that does.
fn pack_named_by(bytes: &[u8]) -> Option<Digest> {
    let json = serde_json::from_slice::<serde_json::Value>(bytes).ok()?;
    let text = json.get("pack")?.get("digest")?.as_str()?;
    Digest::parse(text).ok()
}

/// The objects a record that is not one still names: the `bundle` tree and the `manifest`
/// blob it gives, if it is JSON that gives them.
fn named_by(bytes: &[u8]) -> Vec<(bool, Digest)> {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return Vec::new();
    };
    let digest = |field: &str| {
        json.get(field)
            .and_then(serde_json::Value::as_str)
            .and_then(|text| Digest::parse(text).ok())
    };
    let mut named = Vec::new();
    named.extend(digest("bundle").map(|d| (true, d)));
    named.extend(digest("manifest").map(|d| (false, d)));
    named
}

fn busy(url: &str, held: Option<&LeaseBody>) -> Error {
    let message = match held {
        Some(h) => format!(
            "another collector ({}) holds the lease of {url} for {} s more",
            h.holder,
            (h.expires_at_ms - now_ms()).max(0) / 1000
        ),
        None => format!("another collector took the lease of {url} first"),
    };
    Error::new(Code::Conflict, message)
        .with_details(serde_json::json!({ "store": url, "retryable": true }))
}

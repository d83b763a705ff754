//! Moving a bundle between the local store and the store of record: publication (leaves
//! first, the record last) and download (every object verified, entered in one batch).

use super::{get, put_new, unreachable, wait, Moved, RemoteStore, AT_ONCE};
use crate::provision::index::BundleRecord;
use cloud_harness_fs::cas::{Digest, Kind, ObjectKind, Store, Tree};
use cloud_harness_fs::{Code, Error, Result};
use futures_util::stream::{self, FuturesUnordered};
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use std::collections::{HashSet, VecDeque};

impl RemoteStore {
    /// Publishes a bundle that is whole in `store`: its blobs, its trees from the deepest up,
    /// its manifest, then its record. Safe to repeat and to run on two runners at once.
    pub fn publish(&self, store: &Store, record: &BundleRecord) -> Result<Moved> {
        // Every object is sent even when the record is there already: a put of an object
        // present costs one refused request, and it restores one an operator deleted.
        let record_path = self.record_path(&record.key);
        let (blobs, levels) = layout(store, &record.bundle)?;
        let mut moved = Moved::default();
        let mut send = |kind: ObjectKind, digests: Vec<Digest>| -> Result<()> {
            let m = self.put_objects(store, kind, digests)?;
            moved.objects += m.objects;
            moved.bytes += m.bytes;
            moved.present += m.present;
            Ok(())
        };
        send(ObjectKind::Blob, blobs)?;
        for level in levels.into_iter().rev() {
            send(ObjectKind::Tree, level)?;
        }
        send(ObjectKind::Blob, vec![record.manifest])?;
        let json = serde_json::to_vec_pretty(record).map_err(|e| Error::internal(e.to_string()))?;
        let objects = self.objects.clone();
        let url = self.url.clone();
        wait(async move {
            put_new(&objects, &record_path, json)
                .await
                .map_err(|e| unreachable(&url, e))
        })?;
        Ok(moved)
    }

    /// Sends objects of `store`, read (and so verified) from it, a few at a time.
    fn put_objects(&self, store: &Store, kind: ObjectKind, digests: Vec<Digest>) -> Result<Moved> {
        let objects = self.objects.clone();
        let url = self.url.clone();
        let paths: Vec<ObjectPath> = digests.iter().map(|d| self.object_path(kind, d)).collect();
        let store = store.clone();
        wait(async move {
            let results: Vec<(bool, u64)> = stream::iter(digests.into_iter().zip(paths))
                .map(|(digest, path)| {
                    let objects = objects.clone();
                    let store = store.clone();
                    let url = url.clone();
                    async move {
                        let bytes = match kind {
                            ObjectKind::Blob => store.blob(&digest)?,
                            ObjectKind::Tree => store.tree(&digest)?.encode(),
                        };
                        let len = bytes.len() as u64;
                        let created = put_new(&objects, &path, bytes)
                            .await
                            .map_err(|e| unreachable(&url, e))?;
                        Ok::<_, Error>((created, len))
                    }
                })
                .buffer_unordered(AT_ONCE)
                .try_collect()
                .await?;
            let mut moved = Moved::default();
            for (created, len) in results {
                if created {
                    moved.objects += 1;
                    moved.bytes += len;
                } else {
                    moved.present += 1;
                }
            }
            Ok(moved)
        })
    }

    /// Brings every object of `record` that `store` lacks from object storage into it, each
    /// checked against its name first. Either all of them enter, in one batch, or none does.
    pub fn download(&self, store: &Store, record: &BundleRecord) -> Result<Moved> {
        let fetch = Fetch {
            remote: self.clone(),
            store: store.clone(),
        };
        let roots = vec![
            (ObjectKind::Tree, record.bundle),
            (ObjectKind::Blob, record.manifest),
        ];
        let (fetched, moved) = wait(async move { fetch.all(roots).await })?;
        let mut writer = store.writer()?;
        for (kind, digest, bytes) in &fetched {
            let put = match kind {
                ObjectKind::Blob => writer.put_blob(bytes)?,
                ObjectKind::Tree => {
                    writer.put_tree(&Tree::decode(bytes).expect("decoded when fetched"))?
                }
            };
            // The canonical encoding round-trips; a tree that re-encodes otherwise is refused.
            if put != *digest {
                return Err(refused(&self.url, *kind, digest, "not in canonical form"));
            }
        }
        writer.commit()?;
        Ok(moved)
    }
}

/// One download: what a bundle's objects are fetched with.
struct Fetch {
    remote: RemoteStore,
    store: Store,
}

impl Fetch {
    /// Every object below `roots` that the local store lacks, fetched and verified. The walk
    /// does not wait level by level: a tree's children are asked for as soon as it arrives,
    /// with up to [`AT_ONCE`] requests under way, since object storage answers each request
    /// after a round trip whatever its size.
    async fn all(
        &self,
        roots: Vec<(ObjectKind, Digest)>,
    ) -> Result<(Vec<(ObjectKind, Digest, Vec<u8>)>, Moved)> {
        let mut moved = Moved::default();
        let mut fetched = Vec::new();
        let mut seen: HashSet<(bool, Digest)> = HashSet::new();
        let mut queue: VecDeque<(ObjectKind, Digest)> = VecDeque::new();
        for (kind, digest) in roots {
            if seen.insert((kind == ObjectKind::Tree, digest)) {
                queue.push_back((kind, digest));
            }
        }
        let mut under_way = FuturesUnordered::new();
        loop {
            while under_way.len() < AT_ONCE {
                let Some((kind, digest)) = queue.pop_front() else {
                    break;
                };
                if self.store.contains(kind, &digest) {
                    moved.present += 1;
                    if kind == ObjectKind::Tree {
                        let tree = self.store.tree(&digest)?;
                        children(&tree, &mut seen, &mut queue);
                    }
                    continue;
                }
                under_way.push(self.one(kind, digest));
            }
            let Some(result) = under_way.next().await else {
                break;
            };
            let (kind, digest, bytes) = result?;
            if kind == ObjectKind::Tree {
                let tree = Tree::decode(&bytes).map_err(|e| {
                    refused(
                        &self.remote.url,
                        kind,
                        &digest,
                        &format!("not a tree: {}", e.message),
                    )
                })?;
                children(&tree, &mut seen, &mut queue);
            }
            moved.objects += 1;
            moved.bytes += bytes.len() as u64;
            fetched.push((kind, digest, bytes));
        }
        Ok((fetched, moved))
    }

    /// One object, verified against its digest.
    async fn one(&self, kind: ObjectKind, digest: Digest) -> Result<(ObjectKind, Digest, Vec<u8>)> {
        let path = self.remote.object_path(kind, &digest);
        let url = &self.remote.url;
        let bytes = get(&self.remote.objects, &path)
            .await
            .map_err(|e| unreachable(url, e))?
            .ok_or_else(|| refused(url, kind, &digest, "missing from object storage"))?;
        let got = Digest::of(&bytes);
        if got != digest {
            return Err(refused(
                url,
                kind,
                &digest,
                &format!("its bytes hash to {got}"),
            ));
        }
        Ok((kind, digest, bytes))
    }
}

/// Queues the entries of `tree` not seen before.
fn children(
    tree: &Tree,
    seen: &mut HashSet<(bool, Digest)>,
    queue: &mut VecDeque<(ObjectKind, Digest)>,
) {
    for e in tree.entries() {
        let kind = match e.kind {
            Kind::Tree => ObjectKind::Tree,
            _ => ObjectKind::Blob,
        };
        if seen.insert((kind == ObjectKind::Tree, e.digest)) {
            queue.push_back((kind, e.digest));
        }
    }
}

/// An object of the store of record that may not enter the local store.
fn refused(url: &str, kind: ObjectKind, digest: &Digest, why: &str) -> Error {
    crate::metrics::remote("refused");
    Error::new(
        Code::Upstream,
        format!(
            "object storage {url} has a bad {} {digest} ({why}); it was refused and nothing of its bundle entered the store",
            kind.dir_name()
        ),
    )
    .with_details(serde_json::json!({
        "store": url,
        "object": digest.to_string(),
        "kind": kind.dir_name(),
    }))
}

/// The bundle's blobs (the manifest aside) and its trees by depth, each object once.
fn layout(store: &Store, bundle: &Digest) -> Result<(Vec<Digest>, Vec<Vec<Digest>>)> {
    let mut blobs = Vec::new();
    let mut levels: Vec<Vec<Digest>> = Vec::new();
    let mut seen = HashSet::new();
    let mut level = vec![*bundle];
    seen.insert((true, *bundle));
    while !level.is_empty() {
        let mut next = Vec::new();
        for digest in &level {
            for e in store.tree(digest)?.entries() {
                if !seen.insert((e.kind == Kind::Tree, e.digest)) {
                    continue;
                }
                match e.kind {
                    Kind::Tree => next.push(e.digest),
                    _ => blobs.push(e.digest),
                }
            }
        }
        levels.push(std::mem::replace(&mut level, next));
    }
    Ok((blobs, levels))
}

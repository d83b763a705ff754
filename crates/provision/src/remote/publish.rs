//! Publication of a bundle to the store of record: leaves first, the record last.

use super::pack::layout;
use super::{put_new, unreachable, wait, Moved, RemoteStore, AT_ONCE};
use crate::index::{BundleRecord, PackRef};
use cloud_harness_error::{Error, Result};
use cloud_harness_store::cas::{Digest, ObjectKind, Store};
use futures_util::stream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;

impl RemoteStore {
    /// Publishes a bundle that is whole in `store`: its blobs, its trees from the deepest up,
    /// its manifest, its pack (all of them in one object, unless packs are off), then its
    /// record, which names the pack. Safe to repeat and to run on two runners at once.
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
        let mut record = record.clone();
        // Without its pack, a record still serves (object by object): a pack that could not
        // be put does not fail a publication whose objects are all there.
        record.pack = match self.packs {
            true => self
                .put_pack(store, &record)
                .map_err(|e| tracing::warn!(url = %record.key.url, error = %e.message, "the bundle is published without its pack"))
                .ok(),
            false => None,
        };
        cloud_harness_error::failpoint::point("fleet.before_record");
        let json =
            serde_json::to_vec_pretty(&record).map_err(|e| Error::internal(e.to_string()))?;
        let objects = self.objects.clone();
        let url = self.url.clone();
        wait(async move {
            put_new(&objects, &record_path, json)
                .await
                .map_err(|e| unreachable(&url, e))
        })?;
        Ok(moved)
    }

    /// Sends the pack of the bundle (create-only, named by its digest); what the record
    /// names it by.
    fn put_pack(&self, store: &Store, record: &BundleRecord) -> Result<PackRef> {
        let bytes = super::pack::encode(store, record)?;
        let pack = PackRef {
            digest: Digest::of(&bytes),
            size: bytes.len() as u64,
        };
        let path = self.pack_path(&pack.digest);
        let objects = self.objects.clone();
        let url = self.url.clone();
        wait(async move {
            put_new(&objects, &path, bytes)
                .await
                .map_err(|e| unreachable(&url, e))
        })?;
        Ok(pack)
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
                        cloud_harness_error::failpoint::point("fleet.object_put");
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
}

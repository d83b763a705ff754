//! Publication of acquired bundles to the store of record, through a queue on disk
//! (`<store>/index/pending/<key>`), so that an outage of object storage or a process killed
//! midway loses none: a bundle is queued before it is recorded locally, leaves the queue only
//! once its record is in object storage, and whatever is queued is tried again later (by the
//! server every [`RETRY_EVERY`], and by the next acquisition of the same toolkit).

use super::index::{BundleIndex, BundleRecord};
use super::remote::{Moved, RemoteStore};
use super::Provisioner;
use cloud_harness_control::home::write_atomic;
use cloud_harness_error::{Error, Result};
use cloud_harness_store::cas::Store;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often the server retries what is queued.
pub const RETRY_EVERY: Duration = Duration::from_secs(30);

/// A queued key with no local record is dropped after this long.
const ORPHAN_AFTER: Duration = Duration::from_secs(3600);

fn is_older_than(entry: &fs::DirEntry, age: Duration) -> bool {
    entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|e| e > age)
}

/// What a pass over the queue did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub published: usize,
    pub failed: usize,
}

pub struct Publications<'a> {
    remote: &'a RemoteStore,
    store: &'a Store,
    dir: PathBuf,
}

impl<'a> Publications<'a> {
    pub fn new(remote: &'a RemoteStore, store: &'a Store) -> Publications<'a> {
        Publications {
            remote,
            store,
            dir: store.root().join("index").join("pending"),
        }
    }

    fn marker(&self, record: &BundleRecord) -> PathBuf {
        self.dir.join(record.key.id())
    }

    /// Queues `record`'s bundle; done before the record enters the local index.
    pub fn queue(&self, record: &BundleRecord) -> Result<()> {
        write_atomic(&self.marker(record), record.key.url.as_bytes())
    }

    pub(crate) fn is_queued(&self, record: &BundleRecord) -> bool {
        self.marker(record).exists()
    }

    /// Publishes a queued bundle and takes it off the queue; on failure it stays queued.
    pub fn publish(&self, record: &BundleRecord) -> Result<Moved> {
        let started = Instant::now();
        match self.remote.publish(self.store, record) {
            Ok(moved) => {
                let _ = fs::remove_file(self.marker(record));
                cloud_harness_control::metrics::remote("published");
                tracing::info!(
                    url = %record.key.url,
                    commit = %record.key.commit,
                    objects = moved.objects,
                    present = moved.present,
                    bytes = moved.bytes,
                    millis = started.elapsed().as_millis() as u64,
                    "published to the store of record"
                );
                Ok(moved)
            }
            Err(e) => {
                cloud_harness_control::metrics::remote("publish_failed");
                tracing::warn!(
                    url = %record.key.url,
                    commit = %record.key.commit,
                    error = %e.message,
                    "publication to the store of record failed; it stays queued and is retried"
                );
                Err(e)
            }
        }
    }

    /// Tries every queued bundle once. A queued key whose local record is gone (collected,
    /// or never written because the process died first) leaves the queue after an hour.
    pub fn retry(&self, index: &BundleIndex) -> Result<Pass> {
        let mut pass = Pass::default();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(pass),
            Err(e) => return Err(Error::io(&self.dir, e)),
        };
        let records = index.list()?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            // Temp files of a marker being written start with a dot.
            let Some(id) = name.to_str().filter(|n| !n.starts_with('.')) else {
                continue;
            };
            match records.iter().find(|r| r.key.id() == id) {
                Some(record) if index.complete(record) => match self.publish(record) {
                    Ok(_) => pass.published += 1,
                    Err(_) => pass.failed += 1,
                },
                // An acquisition queues before it records: a marker with no record is
                // only stale once no acquisition can still be under way.
                _ if is_older_than(&entry, ORPHAN_AFTER) => {
                    let _ = fs::remove_file(entry.path());
                }
                _ => {}
            }
        }
        Ok(pass)
    }
}

impl Provisioner {
    /// Tries once more every publication to the store of record that has not completed (an
    /// outage, a process killed midway). Nothing to do without a store of record.
    pub fn publish_pending(&self) -> Result<Pass> {
        match &self.remote {
            Some(remote) => Publications::new(remote, &self.store).retry(&self.index()),
            None => Ok(Pass::default()),
        }
    }

    /// Records a bundle in the local index and, with a store of record, publishes it there:
    /// queued first, so a failure or a kill leaves it to be retried, never lost. A failed
    /// publication does not fail the acquisition: the bundle is in the local store.
    pub(super) fn record_and_publish(
        &self,
        index: &BundleIndex,
        record: &BundleRecord,
    ) -> Result<()> {
        let Some(remote) = &self.remote else {
            return index.put(record);
        };
        let publications = Publications::new(remote, &self.store);
        publications.queue(record)?;
        cloud_harness_error::failpoint::point("fleet.queued");
        index.put(record)?;
        let _ = publications.publish(record);
        Ok(())
    }

    /// A local warm start of a bundle whose publication was cut short completes it.
    pub(super) fn complete_publication(&self, record: &BundleRecord) {
        if let Some(remote) = &self.remote {
            let publications = Publications::new(remote, &self.store);
            if publications.is_queued(record) {
                let _ = publications.publish(record);
            }
        }
    }
}

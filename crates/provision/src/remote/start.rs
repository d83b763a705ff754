//! A start from the store of record: a bundle this runner lacks, brought from object storage
//! instead of git.

use super::Moved;
use crate::index::{BundleIndex, BundleKey, BundleRecord};
use crate::Provisioner;
use cloud_harness_control::toolkit::Toolkit;
use cloud_harness_error::Result;

/// Whether `e` refuses what the bucket holds (it names the record or the object), as opposed
/// to an outage.
fn is_refusal(e: &cloud_harness_error::Error) -> bool {
    e.details.get("object").is_some() || e.details.get("record").is_some()
}

impl Provisioner {
    /// The commit another runner resolved `tag` to, if the store of record has it.
    pub(crate) fn remote_tag(&self, toolkit: &Toolkit, tag: &str) -> Option<String> {
        let remote = self.remote.as_ref()?;
        match remote.tag(&toolkit.url, tag) {
            Ok(commit) => commit,
            Err(e) => {
                tracing::warn!(url = %toolkit.url, tag, error = %e.message, "the store of record could not be asked for a tag");
                None
            }
        }
    }

    /// The bundle of `key` from the store of record into the local store, verified, and
    /// recorded locally. None when there is no store of record or it has no such bundle, or it
    /// cannot be reached (git stands in; the outage is logged and counted).
    pub(crate) fn start_from_remote(
        &self,
        index: &BundleIndex,
        key: &BundleKey,
    ) -> Result<Option<(BundleRecord, Moved)>> {
        let Some(remote) = &self.remote else {
            return Ok(None);
        };
        let record = match remote.record(key) {
            Ok(Some(record)) => record,
            Ok(None) => {
                cloud_harness_control::metrics::remote("miss");
                return Ok(None);
            }
            Err(e) if is_refusal(&e) => {
                tracing::error!(url = %key.url, error = %e.message, "the store of record holds a bad record; fetching from git instead");
                return Err(e);
            }
            Err(e) => {
                cloud_harness_control::metrics::remote("unreachable");
                tracing::warn!(url = %key.url, error = %e.message, "the store of record could not be asked; fetching from git");
                return Ok(None);
            }
        };
        match remote.download(&self.store, &record, self.limits) {
            Ok(moved) => {
                // Only now, every object in place and checked, does the index learn of it
                // (not of the pack: it is the bucket's).
                let record = BundleRecord {
                    pack: None,
                    ..record
                };
                index.put(&record)?;
                cloud_harness_control::metrics::remote("hit");
                Ok(Some((record, moved)))
            }
            Err(e) if is_refusal(&e) => {
                tracing::error!(url = %key.url, error = %e.message, "the store of record holds a bad object; fetching from git instead");
                Err(e)
            }
            Err(e) => {
                cloud_harness_control::metrics::remote("unreachable");
                tracing::warn!(url = %key.url, error = %e.message, "downloading from the store of record failed; fetching from git");
                Ok(None)
            }
        }
    }
}

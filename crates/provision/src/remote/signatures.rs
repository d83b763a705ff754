//! Signatures beside their bundle in the store of record
//! (`<prefix>/signatures/<bundle hex>/<tier>.<key>.<subject>.sig`, the key and the subject
//! named by digests), so a runner that takes a bundle from the bucket takes its signatures
//! too. Like everything in the bucket they are untrusted: read under bounds here, and kept
//! only once they verify against a key the trust policy names (`signatures::stored::import`).

use super::{get, unreachable, wait, Got, RemoteStore};
use cloud_harness_control::signatures::stored::MAX_PER_TIER;
use cloud_harness_control::signatures::{Subject, MAX_TEXT, TIERS};
use cloud_harness_error::Result;
use cloud_harness_store::cas::Digest;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};

/// Names read under one bundle's folder, at most: a bucket holding more there (names that
/// are no signature's among them) is read no further, and what was not read is not taken.
const MAX_SCANNED: usize = 8 * MAX_PER_TIER * TIERS.len();

/// The start of the names of `key`'s signatures in `tier`.
fn key_prefix(tier: &str, key: &str) -> String {
    format!("{tier}.{}.", &Digest::of(key.as_bytes()).hex()[..32])
}

impl RemoteStore {
    fn signatures_dir(&self, bundle: &Digest) -> ObjectPath {
        self.path(&format!("signatures/{}", bundle.hex()))
    }

    /// The names under `bundle`'s folder, at most [`MAX_SCANNED`].
    async fn signature_names(&self, bundle: &Digest) -> Result<Vec<ObjectMeta>> {
        self.objects
            .list(Some(&self.signatures_dir(bundle)))
            .take(MAX_SCANNED)
            .try_collect()
            .await
            .map_err(|e| unreachable(&self.url, e))
    }

    /// Writes (or replaces) the signature by `key` (a fingerprint) of `subject`.
    pub fn put_signature(&self, subject: Subject, key: &str, text: &str) -> Result<()> {
        let bundle = Digest::parse(subject.bundle)?;
        let name = format!(
            "{}{}.sig",
            key_prefix(subject.tier, key),
            &Digest::of(subject.message().as_bytes()).hex()[..32]
        );
        let path = self.path(&format!("signatures/{}/{name}", bundle.hex()));
        let (objects, url, bytes) = (
            self.objects.clone(),
            self.url.clone(),
            text.as_bytes().to_vec(),
        );
        wait(async move {
            objects
                .put(&path, PutPayload::from(bytes))
                .await
                .map(|_| ())
                .map_err(|e| unreachable(&url, e))
        })
    }

    /// Deletes every signature by `key` of `bundle` in `tier` (none there is no error).
    pub fn remove_signatures(&self, bundle: &Digest, tier: &str, key: &str) -> Result<()> {
        let (remote, bundle, start) = (self.clone(), *bundle, key_prefix(tier, key));
        wait(async move {
            for meta in remote.signature_names(&bundle).await? {
                if meta
                    .location
                    .filename()
                    .is_some_and(|n| n.starts_with(&start))
                {
                    match remote.objects.delete(&meta.location).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => return Err(unreachable(&remote.url, e)),
                    }
                }
            }
            Ok(())
        })
    }

    /// The signatures kept beside `bundle`, as (tier, text): at most [`MAX_PER_TIER`] a
    /// tier, each at most [`MAX_TEXT`] bytes; anything else there is passed over.
    pub fn signatures(&self, bundle: &Digest) -> Result<Vec<(&'static str, String)>> {
        let (remote, bundle) = (self.clone(), *bundle);
        wait(async move {
            let mut found: Vec<(&'static str, String)> = Vec::new();
            for meta in remote.signature_names(&bundle).await? {
                let name = meta.location.filename().unwrap_or_default().to_owned();
                let Some(tier) = TIERS.iter().copied().find(|t| {
                    name.strip_prefix(t)
                        .is_some_and(|r| r.starts_with('.') && r.ends_with(".sig"))
                }) else {
                    continue;
                };
                if found.iter().filter(|(t, _)| *t == tier).count() >= MAX_PER_TIER {
                    continue;
                }
                match get(&remote.objects, &meta.location, MAX_TEXT as u64).await {
                    Ok(Got::Bytes(bytes)) => {
                        if let Ok(text) = String::from_utf8(bytes) {
                            found.push((tier, text));
                        }
                    }
                    Ok(Got::Missing | Got::TooLarge(_)) => {}
                    Err(e) => return Err(unreachable(&remote.url, e)),
                }
            }
            Ok(found)
        })
    }
}

//! Signatures beside their bundle in the store of record
//! (`<prefix>/signatures/<bundle hex>/<tier>.<key>.sig`), so a runner that takes a bundle from
//! the bucket takes its signatures too. Like everything in the bucket they are untrusted: read
//! under bounds here, and believed only once they verify against a key the trust policy names.

use super::{get, unreachable, wait, Got, RemoteStore};
use cloud_harness_control::signatures::stored::MAX_PER_TIER;
use cloud_harness_control::signatures::{MAX_TEXT, TIERS};
use cloud_harness_error::Result;
use cloud_harness_store::cas::Digest;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};

/// Names read under one bundle's folder, at most.
const MAX_LISTED: usize = 4 * MAX_PER_TIER * TIERS.len();

impl RemoteStore {
    fn signature_path(&self, bundle: &Digest, tier: &str, key: &str) -> ObjectPath {
        let key = &Digest::of(key.as_bytes()).hex()[..32];
        self.path(&format!("signatures/{}/{tier}.{key}.sig", bundle.hex()))
    }

    /// Writes (or replaces) the signature by `key` (a fingerprint) of `bundle` in `tier`.
    pub fn put_signature(&self, bundle: &Digest, tier: &str, key: &str, text: &str) -> Result<()> {
        let path = self.signature_path(bundle, tier, key);
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

    /// Takes the signature by `key` of `bundle` in `tier` away (nothing there is no error).
    pub fn remove_signature(&self, bundle: &Digest, tier: &str, key: &str) -> Result<()> {
        let path = self.signature_path(bundle, tier, key);
        let (objects, url) = (self.objects.clone(), self.url.clone());
        wait(async move {
            match objects.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(unreachable(&url, e)),
            }
        })
    }

    /// The signatures kept beside `bundle`, as (tier, text): at most [`MAX_PER_TIER`] a tier,
    /// each at most [`MAX_TEXT`] bytes; anything else there is passed over.
    pub fn signatures(&self, bundle: &Digest) -> Result<Vec<(&'static str, String)>> {
        let prefix = self.path(&format!("signatures/{}", bundle.hex()));
        let (objects, url) = (self.objects.clone(), self.url.clone());
        wait(async move {
            // A bucket that holds more under one bundle than it may is read no further.
            let listed: Vec<object_store::ObjectMeta> = objects
                .list(Some(&prefix))
                .take(MAX_LISTED)
                .try_collect()
                .await
                .map_err(|e| unreachable(&url, e))?;
            let mut found: Vec<(&'static str, String)> = Vec::new();
            for meta in listed {
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
                match get(&objects, &meta.location, MAX_TEXT as u64).await {
                    Ok(Got::Bytes(bytes)) => {
                        if let Ok(text) = String::from_utf8(bytes) {
                            found.push((tier, text));
                        }
                    }
                    Ok(Got::Missing | Got::TooLarge(_)) => {}
                    Err(e) => return Err(unreachable(&url, e)),
                }
            }
            Ok(found)
        })
    }
}

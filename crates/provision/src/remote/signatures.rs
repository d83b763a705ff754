//! Signatures beside their bundle in the store of record
//! (`<prefix>/signatures/<bundle hex>/<subject>/<key>.sig`, the subject — repository, commit,
//! bundle and tier — and the key named by digests), so a runner that takes a bundle from the
//! bucket can take its signatures too. Like everything in the bucket they are untrusted: read
//! under bounds here, and kept only once they verify against a key the trust policy names
//! (`signatures::stored::import`).

use super::{get, unreachable, wait, Got, RemoteStore};
use cloud_harness_control::signatures::stored::MAX_PER_SUBJECT;
use cloud_harness_control::signatures::{Subject, MAX_TEXT};
use cloud_harness_error::Result;
use cloud_harness_store::cas::Digest;
use futures_util::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};

/// Names read under one folder, at most: a bucket holding more there is read no further
/// (what was not read is not taken, and the tier is judged on the rest).
const MAX_SCANNED: usize = 1024;

fn short(text: &str) -> String {
    Digest::of(text.as_bytes()).hex()[..32].to_owned()
}

impl RemoteStore {
    fn subject_dir(&self, subject: Subject) -> Result<String> {
        let bundle = Digest::parse(subject.bundle)?;
        Ok(format!(
            "signatures/{}/{}",
            bundle.hex(),
            short(&subject.message())
        ))
    }

    /// The names under `dir`, at most [`MAX_SCANNED`].
    async fn names_under(&self, dir: &str) -> Result<Vec<ObjectMeta>> {
        let listed: Vec<ObjectMeta> = self
            .objects
            .list(Some(&self.path(dir)))
            .take(MAX_SCANNED)
            .try_collect()
            .await
            .map_err(|e| unreachable(&self.url, e))?;
        if listed.len() == MAX_SCANNED {
            tracing::warn!(store = %self.url, dir, "more names than are read: the rest is passed over");
        }
        Ok(listed)
    }

    /// Writes (or replaces) the signature by `key` (a fingerprint) of `subject`.
    pub fn put_signature(&self, subject: Subject, key: &str, text: &str) -> Result<()> {
        let path = self.path(&format!(
            "{}/{}.sig",
            self.subject_dir(subject)?,
            short(key)
        ));
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

    /// Deletes the signatures by `key` of `subject`, or with no subject of every subject of
    /// `bundle` (none there is no error).
    pub fn remove_signatures(
        &self,
        bundle: &Digest,
        subject: Option<Subject>,
        key: &str,
    ) -> Result<()> {
        let dir = match subject {
            Some(s) => self.subject_dir(s)?,
            None => format!("signatures/{}", bundle.hex()),
        };
        let (remote, name) = (self.clone(), format!("{}.sig", short(key)));
        wait(async move {
            for meta in remote.names_under(&dir).await? {
                if meta.location.filename() == Some(name.as_str()) {
                    match remote.objects.delete(&meta.location).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => return Err(unreachable(&remote.url, e)),
                    }
                }
            }
            Ok(())
        })
    }

    /// The signatures of `subject` kept beside its bundle: at most [`MAX_PER_SUBJECT`], each
    /// at most [`MAX_TEXT`] bytes; anything else there is passed over.
    pub fn signatures(&self, subject: Subject) -> Result<Vec<String>> {
        let (remote, dir) = (self.clone(), self.subject_dir(subject)?);
        wait(async move {
            let mut found = Vec::new();
            for meta in remote.names_under(&dir).await? {
                if found.len() >= MAX_PER_SUBJECT
                    || !meta
                        .location
                        .filename()
                        .is_some_and(|n| n.ends_with(".sig"))
                {
                    continue;
                }
                match get(&remote.objects, &meta.location, MAX_TEXT as u64).await {
                    Ok(Got::Bytes(bytes)) => {
                        if let Ok(text) = String::from_utf8(bytes) {
                            found.push(text);
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

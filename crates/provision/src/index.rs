//! The bundle index: `(url, commit, subdirectory, layout, include/exclude, normalizer version)`
//! to the bundle digest, kept beside the store (`<store>/index/`), one small JSON file per key,
//! written atomically. Tags resolved once are recorded too, so a tag pin starts warm.

use crate::normalize::NORMALIZER_VERSION;
use cloud_harness_control::home::write_atomic;
use cloud_harness_control::toolkit::{Revision, Toolkit};
use cloud_harness_error::{Error, Result};
use cloud_harness_skills::discovery::{Layout, Skipped};
use cloud_harness_skills::spec::Validation;
use cloud_harness_store::cas::{Digest, Kind, ObjectKind, Store};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleKey {
    pub url: String,
    pub commit: String,
    pub subdirectory: String,
    pub layout: Layout,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plugin_manifest: bool,
    pub normalizer: u32,
}

impl BundleKey {
    pub fn new(toolkit: &Toolkit, commit: &str) -> BundleKey {
        BundleKey {
            url: toolkit.url.clone(),
            commit: commit.to_owned(),
            subdirectory: toolkit.subdirectory.clone(),
            // What is served of a bundle (`validation`) is decided when it is served: the
            // same bundle serves every policy.
            layout: Layout {
                validation: Validation::Warn,
                ..toolkit.layout.clone()
            },
            plugin_manifest: toolkit.plugin_manifest,
            normalizer: NORMALIZER_VERSION,
        }
    }

    /// The file name of the key: a digest of its canonical JSON.
    pub fn id(&self) -> String {
        let json = serde_json::to_vec(self).expect("keys serialize");
        Digest::of(&json).hex()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleRecord {
    pub key: BundleKey,
    pub bundle: Digest,
    pub manifest: Digest,
    pub skills: usize,
    pub instance_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    pub fetched_url: String,
    pub object_format: String,
    /// How the commit was chosen: a commit id, a tag, or the default branch head.
    pub requested: String,
    pub warnings: Vec<String>,
    /// The skill folders the normalizer left out, each with its reason (a bad `SKILL.md`, an
    /// exclude pattern): shown where the toolkit's skills are listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
    /// Seconds since the Unix epoch.
    pub acquired_at: u64,
    /// In the store of record: the pack of the bundle's objects, fetched in one request
    /// (`remote::pack`). Never in a runner's own index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackRef>,
    /// Whether a branch or tag of the repository reaches the commit (`reach`), checked when
    /// it was fetched; none for a bundle recorded before the check existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reach: Option<crate::reach::Reach>,
}

/// A pack of a bundle's objects in the store of record: its SHA-256 and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackRef {
    pub digest: Digest,
    pub size: u64,
}

/// The largest bundle record read, here or from the store of record (its warnings and
/// skipped folders make most of it).
pub const MAX_RECORD: u64 = 4 << 20;

impl BundleRecord {
    /// A record from its JSON, which may have come from anywhere (another runner, a bucket):
    /// at most [`MAX_RECORD`] bytes (TOO_LARGE), a record (INVALID_ARGUMENT otherwise; JSON
    /// nested deeper than 128 is not one).
    pub fn decode(bytes: &[u8]) -> Result<BundleRecord> {
        if bytes.len() as u64 > MAX_RECORD {
            return Err(Error::too_large(format!(
                "a bundle record of {} bytes, more than the {MAX_RECORD} a record may have",
                bytes.len()
            ))
            .with_details(serde_json::json!({ "limit": MAX_RECORD })));
        }
        serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid(format!("not a bundle record: {e}")))
    }
}

pub struct BundleIndex {
    store: Store,
    bundles: PathBuf,
    tags: PathBuf,
}

pub fn describe(revision: &Revision) -> String {
    match revision {
        Revision::Commit(c) => format!("commit {c}"),
        Revision::Tag(t) => format!("tag {t}"),
        Revision::DefaultHead => "default branch head".into(),
    }
}

/// The name of a tag's record: a digest of the repository and the tag.
pub(crate) fn tag_id(url: &str, tag: &str) -> String {
    Digest::of(format!("{url}\0{tag}").as_bytes()).hex()
}

/// A tag's record: the commit it was resolved to.
pub(crate) fn tag_record(url: &str, tag: &str, commit: &str) -> Vec<u8> {
    serde_json::json!({ "url": url, "tag": tag, "commit": commit })
        .to_string()
        .into_bytes()
}

/// The commit of a tag's record, if the record is of that repository and tag.
pub(crate) fn commit_of_tag(record: &[u8], url: &str, tag: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(record).ok()?;
    (v["url"] == url && v["tag"] == tag).then(|| v["commit"].as_str().map(str::to_owned))?
}

impl BundleIndex {
    pub fn open(store: &Store) -> BundleIndex {
        let base = store.root().join("index");
        BundleIndex {
            store: store.clone(),
            bundles: base.join("bundles"),
            tags: base.join("tags"),
        }
    }

    pub fn get(&self, key: &BundleKey) -> Option<BundleRecord> {
        let bytes = fs::read(self.record_path(key)).ok()?;
        BundleRecord::decode(&bytes).ok().filter(|r| r.key == *key)
    }

    /// Records a bundle and makes it (and its manifest) a garbage-collection root.
    pub fn put(&self, record: &BundleRecord) -> Result<()> {
        let id = record.key.id();
        self.store
            .set_root(&format!("bundles/{id}"), &record.bundle)?;
        self.store
            .set_root(&format!("manifests/{id}"), &record.manifest)?;
        let json = serde_json::to_vec_pretty(record).map_err(|e| Error::internal(e.to_string()))?;
        write_atomic(&self.bundles.join(format!("{id}.json")), &json)
    }

    fn record_path(&self, key: &BundleKey) -> PathBuf {
        self.bundles.join(format!("{}.json", key.id()))
    }

    /// Notes that the bundle of `key` was just used (its record's mtime), for the cache's
    /// least-recently-used order.
    pub(crate) fn touch(&self, key: &BundleKey) {
        if let Ok(file) = fs::File::open(self.record_path(key)) {
            let _ = file.set_modified(std::time::SystemTime::now());
        }
    }

    /// When the bundle of `key` was last used (recorded or started warm).
    pub(crate) fn last_used(&self, key: &BundleKey) -> Option<std::time::SystemTime> {
        fs::metadata(self.record_path(key))
            .and_then(|m| m.modified())
            .ok()
    }

    /// Forgets a bundle: its record and its roots (its objects go at the next collection
    /// unless something else roots them).
    pub fn remove(&self, key: &BundleKey) -> Result<()> {
        // The record first: a bundle found is then always rooted.
        match fs::remove_file(self.record_path(key)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&self.record_path(key), e)),
        }
        let id = key.id();
        self.store.remove_root(&format!("bundles/{id}"))?;
        self.store.remove_root(&format!("manifests/{id}"))
    }

    /// Every recorded bundle, newest first.
    pub fn list(&self) -> Result<Vec<BundleRecord>> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.bundles) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(Error::io(&self.bundles, e)),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|x| x == "json") {
                if let Ok(r) = BundleRecord::decode(&fs::read(&path).unwrap_or_default()) {
                    out.push(r);
                }
            }
        }
        out.sort_by(|a, b| {
            b.acquired_at
                .cmp(&a.acquired_at)
                .then(a.bundle.cmp(&b.bundle))
        });
        Ok(out)
    }

    /// The record of a bundle digest, if any acquisition produced it.
    pub fn by_bundle(&self, bundle: &Digest) -> Result<Option<BundleRecord>> {
        Ok(self.list()?.into_iter().find(|r| r.bundle == *bundle))
    }

    fn tag_path(&self, url: &str, tag: &str) -> PathBuf {
        self.tags.join(format!("{}.json", tag_id(url, tag)))
    }

    pub fn tag(&self, url: &str, tag: &str) -> Option<String> {
        commit_of_tag(&fs::read(self.tag_path(url, tag)).ok()?, url, tag)
    }

    pub(crate) fn set_tag(&self, url: &str, tag: &str, commit: &str) -> Result<()> {
        write_atomic(&self.tag_path(url, tag), &tag_record(url, tag, commit))
    }

    /// Whether the bundle, its manifest and every object below them are in the store.
    pub fn complete(&self, record: &BundleRecord) -> bool {
        fn tree_complete(store: &Store, digest: &Digest) -> bool {
            let Ok(tree) = store.tree(digest) else {
                return false;
            };
            tree.entries().iter().all(|e| match e.kind {
                Kind::Tree => tree_complete(store, &e.digest),
                _ => store.contains(ObjectKind::Blob, &e.digest),
            })
        }
        self.store.contains(ObjectKind::Blob, &record.manifest)
            && tree_complete(&self.store, &record.bundle)
    }
}

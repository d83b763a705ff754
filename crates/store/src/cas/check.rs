//! Checking the store (`cas verify`) and collecting its garbage (`cas gc`).

use super::digest::Digest;
use super::progress::{Progress, Unwatched};
use super::store::{ObjectKind, Store};
use super::tree::Tree;
use cloud_harness_error::{Error, Result};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProblemKind {
    /// The object's bytes do not match its name, or it cannot be parsed.
    Corrupt,
    /// A tree or a root names an object that is not there.
    Missing,
}

#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub problem: ProblemKind,
    pub object: String,
    pub detail: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    pub blobs: u64,
    pub trees: u64,
    pub bytes: u64,
    pub problems: Vec<Problem>,
}

/// Every object file of one kind, with the digest its name claims (None: not a digest name).
fn object_files(store: &Store, kind: ObjectKind) -> Result<Vec<(PathBuf, Option<Digest>)>> {
    let top = store.objects_dir(kind);
    let mut out = Vec::new();
    for shard in fs::read_dir(&top).map_err(|e| Error::io(&top, e))? {
        let shard = shard.map_err(|e| Error::io(&top, e))?;
        let shard_name = shard.file_name().to_string_lossy().into_owned();
        let shard_path = shard.path();
        if !shard_path.is_dir() {
            out.push((shard_path, None));
            continue;
        }
        for obj in fs::read_dir(&shard_path).map_err(|e| Error::io(&shard_path, e))? {
            let obj = obj.map_err(|e| Error::io(&shard_path, e))?;
            let name = obj.file_name().to_string_lossy().into_owned();
            let digest = Digest::parse(&format!("{shard_name}{name}")).ok();
            out.push((obj.path(), digest));
        }
    }
    Ok(out)
}

fn hash_file(path: &Path) -> std::io::Result<(Digest, u64)> {
    Digest::of_stream(&mut File::open(path)?, &mut std::io::sink())
}

impl Store {
    /// The bytes every object of the store takes (its files' lengths).
    pub fn object_bytes(&self) -> Result<u64> {
        let mut total = 0;
        for kind in [ObjectKind::Blob, ObjectKind::Tree] {
            for (path, _) in object_files(self, kind)? {
                total += fs::symlink_metadata(&path).map_or(0, |m| m.len());
            }
        }
        Ok(total)
    }

    /// Re-hashes every object, parses every tree, and checks that every object a tree or a
    /// root names is present with the size the tree records.
    pub fn verify(&self) -> Result<VerifyReport> {
        self.verify_watched(&Unwatched)
    }

    /// [`Store::verify`], telling `progress` of each object hashed.
    pub fn verify_watched(&self, progress: &dyn Progress) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let corrupt = |object: String, detail: String| Problem {
            problem: ProblemKind::Corrupt,
            object,
            detail,
        };
        let mut blob_sizes: HashMap<Digest, u64> = HashMap::new();
        let blobs = object_files(self, ObjectKind::Blob)?;
        let total = blobs.len() as u64;
        for (i, (path, digest)) in blobs.into_iter().enumerate() {
            progress.at("hashing blobs", i as u64, total);
            let Some(digest) = digest else {
                let detail = "a file in the blob directory whose name is not a digest".into();
                report
                    .problems
                    .push(corrupt(path.display().to_string(), detail));
                continue;
            };
            report.blobs += 1;
            match hash_file(&path) {
                Ok((actual, size)) if actual == digest => {
                    report.bytes += size;
                    blob_sizes.insert(digest, size);
                }
                Ok((actual, _)) => report.problems.push(corrupt(
                    format!("blob {digest}"),
                    format!("content hashes to {actual}"),
                )),
                Err(e) => report.problems.push(corrupt(
                    format!("blob {digest}"),
                    format!("unreadable: {e}"),
                )),
            }
        }
        let mut trees: HashMap<Digest, Tree> = HashMap::new();
        let mut bad_trees = HashSet::new();
        let tree_files = object_files(self, ObjectKind::Tree)?;
        let total = tree_files.len() as u64;
        for (i, (path, digest)) in tree_files.into_iter().enumerate() {
            progress.at("reading trees", i as u64, total);
            let Some(digest) = digest else {
                let detail = "a file in the tree directory whose name is not a digest".into();
                report
                    .problems
                    .push(corrupt(path.display().to_string(), detail));
                continue;
            };
            report.trees += 1;
            let parsed = fs::read(&path)
                .map_err(|e| format!("unreadable: {e}"))
                .and_then(|bytes| {
                    let actual = Digest::of(&bytes);
                    if actual != digest {
                        return Err(format!("content hashes to {actual}"));
                    }
                    Tree::decode(&bytes).map_err(|e| e.message)
                });
            match parsed {
                Ok(tree) => {
                    trees.insert(digest, tree);
                }
                Err(detail) => {
                    bad_trees.insert(digest);
                    report
                        .problems
                        .push(corrupt(format!("tree {digest}"), detail));
                }
            }
        }
        // Objects published after the scan above are not missing: look again on disk.
        let blob_there =
            |d: &Digest| blob_sizes.contains_key(d) || self.contains(ObjectKind::Blob, d);
        let tree_there = |d: &Digest| {
            trees.contains_key(d) || bad_trees.contains(d) || self.contains(ObjectKind::Tree, d)
        };
        let mut tree_list: Vec<_> = trees.iter().collect();
        tree_list.sort_by_key(|(d, _)| **d);
        for (digest, tree) in tree_list {
            for entry in tree.entries() {
                let what = format!("{} {:?} of tree {digest}", entry.digest, entry.name);
                if entry.kind.is_blob() {
                    if !blob_there(&entry.digest) {
                        report.problems.push(Problem {
                            problem: ProblemKind::Missing,
                            object: format!("blob {}", entry.digest),
                            detail: format!("named as {what}"),
                        });
                    } else if let Some(&size) = blob_sizes.get(&entry.digest) {
                        if size != entry.size {
                            report.problems.push(corrupt(
                                format!("tree {digest}"),
                                format!(
                                    "records {} bytes for {what}, the blob has {size}",
                                    entry.size
                                ),
                            ));
                        }
                    }
                } else if !tree_there(&entry.digest) {
                    report.problems.push(Problem {
                        problem: ProblemKind::Missing,
                        object: format!("tree {}", entry.digest),
                        detail: format!("named as {what}"),
                    });
                }
            }
        }
        for (name, digest) in self.roots()? {
            if !tree_there(&digest) && !blob_there(&digest) {
                report.problems.push(Problem {
                    problem: ProblemKind::Missing,
                    object: digest.to_string(),
                    detail: format!("named by root {name}"),
                });
            }
        }
        Ok(report)
    }

    /// Removes every object no root reaches and every temp file, when older than `grace`.
    /// Holds the store lock exclusively, so no batch is being written meanwhile; the grace
    /// period covers objects written by a batch whose root is not recorded yet.
    pub fn gc(&self, grace: Duration) -> Result<GcReport> {
        self.gc_watched(grace, &Unwatched)
    }

    /// [`Store::gc`], telling `progress` of each tree walked and each object looked at.
    pub fn gc_watched(&self, grace: Duration, progress: &dyn Progress) -> Result<GcReport> {
        let _lock = self.lock(true)?;
        let cutoff = SystemTime::now()
            .checked_sub(grace)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut live_trees = HashSet::new();
        let mut live_blobs = HashSet::new();
        let mut stack: Vec<Digest> = Vec::new();
        for (_, digest) in self.roots()? {
            if self.contains(ObjectKind::Tree, &digest) {
                stack.push(digest);
            } else {
                live_blobs.insert(digest);
            }
        }
        while let Some(digest) = stack.pop() {
            if !live_trees.insert(digest) {
                continue;
            }
            progress.at("marking what the roots keep", live_trees.len() as u64, 0);
            let tree = match self.tree(&digest) {
                Ok(tree) => tree,
                Err(e) if e.code == cloud_harness_error::Code::NotFound => continue,
                // Without the tree we cannot know what it keeps alive: stop, delete nothing.
                Err(e) => {
                    return Err(Error::internal(format!(
                        "garbage collection stopped, nothing was removed: {}; run `cloud-harness cas verify`",
                        e.message
                    )))
                }
            };
            for entry in tree.entries() {
                if entry.kind.is_blob() {
                    live_blobs.insert(entry.digest);
                } else {
                    stack.push(entry.digest);
                }
            }
        }
        let mut report = GcReport {
            kept: (live_trees.len() + live_blobs.len()) as u64,
            ..GcReport::default()
        };
        for (kind, live) in [
            (ObjectKind::Blob, &live_blobs),
            (ObjectKind::Tree, &live_trees),
        ] {
            let files = object_files(self, kind)?;
            let total = files.len() as u64;
            for (i, (path, digest)) in files.into_iter().enumerate() {
                progress.at("sweeping", i as u64, total);
                if digest.is_some_and(|d| live.contains(&d)) || digest.is_none() {
                    continue;
                }
                if let Some(size) = older_than(&path, cutoff) {
                    if fs::remove_file(&path).is_ok() {
                        report.removed += 1;
                        report.removed_bytes += size;
                        cloud_harness_error::failpoint::point("gc.removed");
                    }
                }
            }
        }
        let tmp = self.tmp_dir();
        for item in fs::read_dir(&tmp).map_err(|e| Error::io(&tmp, e))? {
            let path = item.map_err(|e| Error::io(&tmp, e))?.path();
            if older_than(&path, cutoff).is_none() {
                continue;
            }
            // Temp files of a dead writer, or the scratch folder of a dead fetch.
            let removed = if path.is_dir() && !path.is_symlink() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            if removed.is_ok() {
                report.removed_temp += 1;
            }
        }
        Ok(report)
    }
}

/// The file's size when its mtime is before `cutoff`.
fn older_than(path: &Path, cutoff: SystemTime) -> Option<u64> {
    let meta = fs::symlink_metadata(path).ok()?;
    (meta.modified().ok()? < cutoff).then_some(meta.len())
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub kept: u64,
    pub removed: u64,
    pub removed_bytes: u64,
    pub removed_temp: u64,
}

//! The ceilings a bundle from the store of record is held to: those staging holds a toolkit
//! fetched from git to (`CLOUD_HARNESS_MAX_*`). While its objects arrive they are counted by
//! distinct object, which bounds what a download keeps in memory; once every tree is in, the
//! bundle is counted by path, as staging counts and as every later walk of it goes: a few
//! distinct trees can name one another so often that they stand for a vast tree.

use super::refused;
use crate::index::BundleRecord;
use crate::staging::Limits;
use cloud_harness_error::{Error, Result};
use cloud_harness_store::cas::{Digest, Kind, ObjectKind, Tree, MAX_TREE_BYTES};
use std::collections::{HashMap, HashSet, VecDeque};

/// An object to fetch: a tree at a depth (the bundle's own tree is 1), or a blob of the size
/// its tree gives (none for the manifest, which no tree names).
#[derive(Clone, Copy)]
pub(super) enum Want {
    Tree(Digest, usize),
    Blob(Digest, Option<u64>),
}

/// What a refusal names: the store, the toolkit and the record of the bundle.
#[derive(Clone)]
pub(super) struct Named {
    pub url: String,
    pub toolkit: String,
    pub record: String,
}

/// What one bundle may hold: what staging lets a toolkit fetched from git hold (files, bytes,
/// bytes per file, depth below the bundle and its skill folder), and what it holds so far in
/// distinct objects, which bounds what a download keeps in memory. (Counted by path, which
/// needs every tree, it is checked once all have come: [`check_bundle`].)
pub(super) struct Budget {
    limits: Limits,
    named: Named,
    blob_sizes: HashMap<Digest, u64>,
    trees: HashSet<Digest>,
    declared_bytes: u64,
    /// Bytes arrived, and the bytes of blobs asked for and not yet arrived.
    fetched_bytes: u64,
    reserved_bytes: u64,
}

impl Budget {
    pub(super) fn new(limits: Limits, named: Named) -> Budget {
        Budget {
            limits,
            named,
            blob_sizes: HashMap::new(),
            trees: HashSet::new(),
            declared_bytes: 0,
            fetched_bytes: 0,
            reserved_bytes: 0,
        }
    }

    /// How deep the bundle's trees may nest: the bundle, a skill folder at a toolkit's top,
    /// and the depth a toolkit's tree may have.
    fn max_depth(&self) -> usize {
        self.limits.max_depth + 2
    }

    /// What one download may hold in memory until it is written: the files' bytes, the
    /// trees' and the manifest's.
    pub(super) fn max_download(&self) -> u64 {
        self.limits.max_bytes.saturating_mul(2)
    }

    /// The refusal of a bundle past one of its ceilings, naming the object that passed it.
    fn past(&self, kind: ObjectKind, digest: &Digest, what: String, limit: u64) -> Error {
        past(&self.named, kind, digest, &what, limit)
    }

    /// A tree more (at most as many distinct trees as files, as staging counts folders).
    pub(super) fn tree(&mut self, digest: &Digest) -> Result<()> {
        self.trees.insert(*digest);
        let limit = self.limits.max_files + 1;
        if self.trees.len() as u64 > limit {
            let what =
                format!("holds more than the limit of {limit} folders (CLOUD_HARNESS_MAX_FILES)");
            return Err(self.past(ObjectKind::Tree, digest, what, limit));
        }
        Ok(())
    }

    /// Queues the entries of `tree` (at `depth`) not seen before, each counted first.
    pub(super) fn children(
        &mut self,
        tree: &Tree,
        depth: usize,
        queue: &mut VecDeque<Want>,
    ) -> Result<()> {
        for e in tree.entries() {
            if e.kind == Kind::Tree {
                if self.trees.contains(&e.digest) {
                    continue;
                }
                if depth + 1 > self.max_depth() {
                    let what = format!(
                        "nests deeper than the limit of {} folders (CLOUD_HARNESS_MAX_DEPTH, and two for the bundle)",
                        self.max_depth()
                    );
                    let limit = self.max_depth() as u64;
                    return Err(self.past(ObjectKind::Tree, &e.digest, what, limit));
                }
                self.tree(&e.digest)?;
                queue.push_back(Want::Tree(e.digest, depth + 1));
                continue;
            }
            match self.blob_sizes.get(&e.digest) {
                Some(&size) if size == e.size => continue,
                Some(&size) => {
                    return Err(refused(
                        &self.named.url,
                        ObjectKind::Blob,
                        &e.digest,
                        &format!("two trees give it two sizes, {size} and {}", e.size),
                    ))
                }
                None => {}
            }
            let limits = self.limits;
            if e.size > limits.max_file_bytes {
                let what = format!(
                    "holds a file of {} bytes, more than the limit of {} bytes per file (CLOUD_HARNESS_MAX_FILE_BYTES)",
                    e.size, limits.max_file_bytes
                );
                return Err(self.past(ObjectKind::Blob, &e.digest, what, limits.max_file_bytes));
            }
            self.blob_sizes.insert(e.digest, e.size);
            self.declared_bytes += e.size;
            if self.blob_sizes.len() as u64 > limits.max_files {
                let what = format!(
                    "holds more than the limit of {} files (CLOUD_HARNESS_MAX_FILES)",
                    limits.max_files
                );
                return Err(self.past(ObjectKind::Blob, &e.digest, what, limits.max_files));
            }
            if self.declared_bytes > limits.max_bytes {
                let what = format!(
                    "holds more than the limit of {} bytes in all (CLOUD_HARNESS_MAX_BYTES)",
                    limits.max_bytes
                );
                return Err(self.past(ObjectKind::Blob, &e.digest, what, limits.max_bytes));
            }
            queue.push_back(Want::Blob(e.digest, Some(e.size)));
        }
        Ok(())
    }

    /// Before `want` is asked for: the most bytes it may have. A blob's (its tree's word) is
    /// reserved; a tree or the manifest may have what is left, at most what such an object
    /// may. Either way, what the download holds stays within [`Budget::max_download`].
    pub(super) fn reserve(&mut self, want: &Want, max_manifest: u64) -> Result<u64> {
        let limit = self.max_download();
        let left = limit.saturating_sub(self.fetched_bytes + self.reserved_bytes);
        let max = match *want {
            Want::Blob(_, Some(size)) if size <= left => {
                self.reserved_bytes += size;
                return Ok(size);
            }
            Want::Blob(_, Some(_)) => 0,
            Want::Blob(_, None) => max_manifest.min(left),
            Want::Tree(..) => MAX_TREE_BYTES.min(left),
        };
        if max == 0 {
            let (kind, digest) = want.name();
            return Err(self.too_much(kind, &digest, limit));
        }
        Ok(max)
    }

    /// An object arrived: its reservation becomes what it holds.
    pub(super) fn arrived(&mut self, want: &Want, len: usize) -> Result<()> {
        if let Want::Blob(_, Some(size)) = *want {
            self.reserved_bytes -= size;
        }
        self.fetched_bytes += len as u64;
        let limit = self.max_download();
        if self.fetched_bytes > limit {
            let (kind, digest) = want.name();
            return Err(self.too_much(kind, &digest, limit));
        }
        Ok(())
    }

    fn too_much(&self, kind: ObjectKind, digest: &Digest, limit: u64) -> Error {
        let what =
            format!("is more than {limit} bytes to download (twice CLOUD_HARNESS_MAX_BYTES)");
        self.past(kind, digest, what, limit)
    }
}

/// What a tree holds counted by path, as staging counts a toolkit: every file and folder as
/// often as trees name it (saturating), and the most trees on one path down (1 for a tree of
/// files).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Shape {
    height: usize,
    files: u64,
    folders: u64,
    bytes: u64,
}

/// The bundle as its record describes it (one skill folder per entry of its tree, as
/// many as the record counts) and within a toolkit's ceilings counted by path: files,
/// folders, bytes and depth as staging would have counted them.
pub(super) fn check_bundle(
    trees: &HashMap<Digest, Tree>,
    named: &Named,
    record: &BundleRecord,
    limits: Limits,
) -> Result<()> {
    let root = &trees[&record.bundle];
    let folders = root
        .entries()
        .iter()
        .filter(|e| e.kind == Kind::Tree)
        .count();
    if folders != root.entries().len() || folders != record.skills {
        return Err(refused(
            &named.url,
            ObjectKind::Tree,
            &record.bundle,
            &format!(
                "not the bundle its record says: {} entries, {folders} of them folders, where the record counts {} skills",
                root.entries().len(),
                record.skills
            ),
        ));
    }
    let shape = shape(trees, record.bundle);
    let max_depth = limits.max_depth + 2;
    // The bundle's own folder is not counted; a skill folder may be one more than staging
    // counted (a toolkit that is one skill at its top).
    let max_folders = limits.max_files.saturating_add(1);
    let by_path = "counted by path (a folder as often as trees name it, as staging counts)";
    let past_one = if shape.height > max_depth {
        Some((format!("nests {} folders deep, more than the limit of {max_depth} (CLOUD_HARNESS_MAX_DEPTH, and two for the bundle)", shape.height), max_depth as u64))
    } else if shape.files > limits.max_files {
        Some((format!("holds {} files {by_path}, more than the limit of {} files (CLOUD_HARNESS_MAX_FILES)", shape.files, limits.max_files), limits.max_files))
    } else if shape.folders > max_folders {
        Some((format!("holds {} folders {by_path}, more than the limit of {max_folders} folders (CLOUD_HARNESS_MAX_FILES)", shape.folders), max_folders))
    } else if shape.bytes > limits.max_bytes {
        Some((format!("holds {} bytes {by_path}, more than the limit of {} bytes in all (CLOUD_HARNESS_MAX_BYTES)", shape.bytes, limits.max_bytes), limits.max_bytes))
    } else {
        None
    };
    match past_one {
        Some((what, limit)) => Err(past(named, ObjectKind::Tree, &record.bundle, &what, limit)),
        None => Ok(()),
    }
}

/// The [`Shape`] of the tree `root`, each distinct tree computed once from its children's
/// (a pass over the distinct trees, not the paths), without recursion.
fn shape(trees: &HashMap<Digest, Tree>, root: Digest) -> Shape {
    let mut shapes: HashMap<Digest, Shape> = HashMap::new();
    let mut stack = vec![(root, false)];
    while let Some((digest, children_done)) = stack.pop() {
        if shapes.contains_key(&digest) {
            continue;
        }
        let entries = trees[&digest].entries();
        if !children_done {
            stack.push((digest, true));
            let mut subtrees: Vec<Digest> = entries
                .iter()
                .filter(|e| e.kind == Kind::Tree && !shapes.contains_key(&e.digest))
                .map(|e| e.digest)
                .collect();
            subtrees.sort_unstable();
            subtrees.dedup();
            stack.extend(subtrees.into_iter().map(|d| (d, false)));
            continue;
        }
        let mut shape = Shape {
            height: 1,
            ..Shape::default()
        };
        for e in entries {
            if e.kind == Kind::Tree {
                let below = shapes[&e.digest];
                shape.height = shape.height.max(below.height + 1);
                shape.files = shape.files.saturating_add(below.files);
                shape.folders = shape
                    .folders
                    .saturating_add(below.folders.saturating_add(1));
                shape.bytes = shape.bytes.saturating_add(below.bytes);
            } else {
                shape.files = shape.files.saturating_add(1);
                shape.bytes = shape.bytes.saturating_add(e.size);
            }
        }
        shapes.insert(digest, shape);
    }
    shapes[&root]
}

/// A bundle of the store of record past a ceiling: TOO_LARGE, naming the record and the
/// object that passed it.
fn past(named: &Named, kind: ObjectKind, digest: &Digest, what: &str, limit: u64) -> Error {
    cloud_harness_control::metrics::remote("refused");
    Error::too_large(format!(
        "object storage {}: the bundle of {} (record {}) {what}, at {} {digest}; it was refused and nothing of it entered the store",
        named.url,
        named.toolkit,
        named.record,
        kind.dir_name()
    ))
    .with_details(serde_json::json!({
        "store": named.url,
        "record": named.record,
        "object": digest.to_string(),
        "kind": kind.dir_name(),
        "limit": limit,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_harness_store::cas::Entry;

    fn entry(name: String, kind: Kind, size: u64, digest: Digest) -> Entry {
        Entry {
            name,
            kind,
            size,
            digest,
        }
    }

    /// Trees of `width` entries each naming the tree below, `levels` deep, over a folder of
    /// one 10-byte file: few distinct trees, `width^levels` paths.
    #[derive(Default)]
    struct Walked {
        trees: HashMap<Digest, Tree>,
    }

    fn fan(width: usize, levels: usize) -> (Walked, Digest) {
        let mut walked = Walked::default();
        let file = Digest::of(b"0123456789");
        let mut below = Tree::new(vec![entry("f".into(), Kind::File, 10, file)]).unwrap();
        let mut digest = Digest::of(&below.encode());
        walked.trees.insert(digest, below);
        for _ in 0..levels {
            let entries = (0..width)
                .map(|i| entry(format!("d{i}"), Kind::Tree, 0, digest))
                .collect();
            below = Tree::new(entries).unwrap();
            digest = Digest::of(&below.encode());
            walked.trees.insert(digest, below);
        }
        (walked, digest)
    }

    #[test]
    fn a_bundle_is_counted_by_path_as_staging_counts_it() {
        let (walked, root) = fan(3, 2);
        assert_eq!(
            shape(&walked.trees, root),
            Shape {
                height: 3,
                files: 9,
                folders: 3 + 9,
                bytes: 90
            }
        );
        // 65,536^5 paths: saturates, computed from six distinct trees.
        let (walked, root) = fan(1 << 16, 5);
        let shape = shape(&walked.trees, root);
        assert_eq!((shape.height, shape.files), (6, u64::MAX));
    }

    #[test]
    fn a_bundle_of_few_objects_and_many_paths_is_refused_naming_its_record() {
        let (mut walked, skill) = fan(64, 2);
        let root = Tree::new(vec![entry("a".into(), Kind::Tree, 0, skill)]).unwrap();
        let bundle = Digest::of(&root.encode());
        walked.trees.insert(bundle, root);
        let named = Named {
            url: "s3://b/p".into(),
            toolkit: "https://git.example/kit.git".into(),
            record: "p/index/bundles/k.json".into(),
        };
        let record = BundleRecord {
            key: crate::index::BundleKey {
                url: named.toolkit.clone(),
                commit: "c".repeat(40),
                subdirectory: String::new(),
                layout: Default::default(),
                plugin_manifest: false,
                normalizer: 2,
            },
            bundle,
            manifest: bundle,
            skills: 1,
            instance_id: "team".into(),
            preset: None,
            fetched_url: named.toolkit.clone(),
            object_format: "sha1".into(),
            requested: "commit".into(),
            warnings: vec![],
            skipped: vec![],
            acquired_at: 0,
            pack: None,
            reach: None,
        };
        let limits = Limits {
            max_files: 4000,
            ..Limits::default()
        };
        // 64 × 64 files by path, 4 distinct objects.
        let e = check_bundle(&walked.trees, &named, &record, limits).unwrap_err();
        assert_eq!(e.code, cloud_harness_error::Code::TooLarge, "{e}");
        assert!(
            e.message.contains("holds 4096 files counted by path"),
            "{e}"
        );
        assert!(
            e.message.contains("more than the limit of 4000 files"),
            "{e}"
        );
        assert_eq!(e.details["record"], "p/index/bundles/k.json");
        assert_eq!(e.details["limit"], 4000);
        let fits = Limits {
            max_files: 4096 + 64 + 1,
            ..Limits::default()
        };
        check_bundle(&walked.trees, &named, &record, fits).unwrap();
        let bytes = Limits {
            max_bytes: 4096 * 10 - 1,
            ..fits
        };
        let e = check_bundle(&walked.trees, &named, &record, bytes).unwrap_err();
        assert!(
            e.message.contains("holds 40960 bytes counted by path"),
            "{e}"
        );
    }
}

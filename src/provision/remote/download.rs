//! Download of a bundle from the store of record, which is not trusted: every object bounded
//! and verified, the whole bundle checked against its record and a toolkit's ceilings, and
//! only then entered into the local store, in one batch.
//!
//! A tree names its folders by digest, so a few distinct objects can stand for a vast tree
//! (a tree of 65,536 entries all naming a second such tree, and so on). What is fetched is
//! bounded by distinct objects (memory); what the bundle holds is counted by path, as staging
//! counts a toolkit, before anything is written: every later walk of the bundle goes by path.

use super::{blocking, get_held, hold, unreachable, wait, Got, Moved, RemoteStore, AT_ONCE};
use crate::provision::index::BundleRecord;
use crate::provision::staging::Limits;
use cloud_harness_fs::cas::{Digest, Kind, ObjectKind, Store, Tree, MAX_TREE_BYTES};
use cloud_harness_fs::{Code, Error, Result};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Downloads under way at once in the process: each holds up to twice
/// `CLOUD_HARNESS_MAX_BYTES` in memory until it is written; more wait their turn (within their
/// own deadline).
const DOWNLOADS_AT_ONCE: usize = 2;
static DOWNLOADS: Semaphore = Semaphore::const_new(DOWNLOADS_AT_ONCE);

impl RemoteStore {
    /// Brings every object of `record` that `store` lacks from object storage into it, within
    /// the ceilings `limits` puts on a toolkit fetched from git and within its fetch timeout.
    /// Every object is checked (its bytes against its name, a blob's length against its
    /// tree's word, a tree's entries and depth, the files, folders and bytes of the whole
    /// bundle counted by path) before any is written; then all of them enter, in one batch, or
    /// none does.
    pub fn download(&self, store: &Store, record: &BundleRecord, limits: Limits) -> Result<Moved> {
        let named = Named {
            url: self.url.clone(),
            toolkit: record.key.url.clone(),
            record: self.record_path(&record.key).to_string(),
        };
        let fetch = Fetch {
            remote: self.clone(),
            store: store.clone(),
            max_manifest: limits.max_file_bytes,
        };
        let budget = Budget::new(limits, named.clone());
        let (bundle, manifest) = (record.bundle, record.manifest);
        let seconds = limits.max_seconds;
        let late = named.clone();
        let (walked, moved) = wait(async move {
            let whole = async {
                let _turn = DOWNLOADS
                    .acquire()
                    .await
                    .map_err(|_| Error::internal("the downloads' semaphore was closed"))?;
                fetch.all(bundle, manifest, budget).await
            };
            tokio::time::timeout(Duration::from_secs(seconds), whole)
                .await
                .unwrap_or_else(|_| Err(timed_out(&late, seconds)))
        })?;
        walked.check_bundle(&named, record, limits)?;
        let mut writer = store.writer()?;
        for bytes in &walked.blobs {
            writer.put_blob(bytes)?;
        }
        // A tree arrives after the tree that names it: backwards, children go first.
        for digest in walked.fetched_trees.iter().rev() {
            // The canonical encoding round-trips; a tree that re-encodes otherwise is refused.
            if writer.put_tree(&walked.trees[digest])? != *digest {
                return Err(refused(
                    &self.url,
                    ObjectKind::Tree,
                    digest,
                    "not in canonical form",
                ));
            }
        }
        writer.commit()?;
        Ok(moved)
    }
}

/// What a refusal names: the store, the toolkit and the record of the bundle.
#[derive(Clone)]
struct Named {
    url: String,
    toolkit: String,
    record: String,
}

/// One download: what a bundle's objects are fetched with.
struct Fetch {
    remote: RemoteStore,
    store: Store,
    /// The largest manifest taken (no tree gives its size).
    max_manifest: u64,
}

/// An object to fetch: a tree at a depth (the bundle's own tree is 1), or a blob of the size
/// its tree gives (none for the manifest, which no tree names).
#[derive(Clone, Copy)]
enum Want {
    Tree(Digest, usize),
    Blob(Digest, Option<u64>),
}

/// A step of the walk: whether the local store has an object, or the object from the bucket
/// (at most that many bytes).
enum Step {
    Look(Want),
    Get(Want, u64),
}

/// What a step came back with: an object the local store has (a tree read from it), one it
/// lacks, or one fetched and verified (a tree decoded).
enum Came {
    Present(Want, Option<Tree>),
    Absent(Want),
    Fetched(Want, Vec<u8>, Option<Tree>),
}

/// What a download found: the blobs and trees it fetched (trees in the order they came) and
/// every tree of the bundle, fetched or already in the store.
#[derive(Default)]
struct Walked {
    blobs: Vec<Vec<u8>>,
    fetched_trees: Vec<Digest>,
    trees: HashMap<Digest, Tree>,
}

impl Fetch {
    /// Every object below the bundle and the manifest that the local store lacks, fetched,
    /// verified and counted. The walk does not wait level by level: a tree's children are
    /// looked for as soon as it arrives, with up to [`AT_ONCE`] steps under way, since object
    /// storage answers each request after a round trip whatever its size.
    async fn all(
        &self,
        bundle: Digest,
        manifest: Digest,
        mut budget: Budget,
    ) -> Result<(Walked, Moved)> {
        let mut moved = Moved::default();
        let mut walked = Walked::default();
        let mut queue = VecDeque::from([Want::Tree(bundle, 1), Want::Blob(manifest, None)]);
        let mut absent = VecDeque::new();
        budget.tree(&bundle)?;
        let mut under_way = FuturesUnordered::new();
        loop {
            while under_way.len() < AT_ONCE {
                // What the local store lacks is asked for first, its bytes reserved.
                let step = if let Some(want) = absent.pop_front() {
                    Step::Get(want, budget.reserve(&want, self.max_manifest)?)
                } else if let Some(want) = queue.pop_front() {
                    Step::Look(want)
                } else {
                    break;
                };
                under_way.push(self.step(step));
            }
            let Some(came) = under_way.next().await else {
                break;
            };
            match came? {
                Came::Present(want, tree) => {
                    moved.present += 1;
                    if let (Want::Tree(digest, depth), Some(tree)) = (want, tree) {
                        budget.children(&tree, depth, &mut queue)?;
                        walked.trees.insert(digest, tree);
                    }
                }
                Came::Absent(want) => absent.push_back(want),
                Came::Fetched(want, bytes, tree) => {
                    budget.arrived(&want, bytes.len())?;
                    moved.objects += 1;
                    moved.bytes += bytes.len() as u64;
                    match (want, tree) {
                        (Want::Tree(digest, depth), Some(tree)) => {
                            budget.children(&tree, depth, &mut queue)?;
                            walked.trees.insert(digest, tree);
                            walked.fetched_trees.push(digest);
                        }
                        _ => walked.blobs.push(bytes),
                    }
                }
            }
        }
        Ok((walked, moved))
    }

    /// One step; reading the local store, hashing and decoding run on blocking threads, not
    /// on the object-storage runtime's workers.
    async fn step(&self, step: Step) -> Result<Came> {
        let url = self.remote.url.clone();
        match step {
            Step::Look(want) => {
                let store = self.store.clone();
                blocking(move || look(&store, &url, want)).await
            }
            Step::Get(want, max) => {
                // A blob's bytes are known before it is asked for; a tree's once the server
                // says, before its body is read.
                let early = match want {
                    Want::Blob(_, Some(size)) => {
                        Some(hold(size).await.map_err(|e| unreachable(&url, e))?)
                    }
                    _ => None,
                };
                let (kind, digest) = want.name();
                let path = self.remote.object_path(kind, &digest);
                let (got, _late) = get_held(&self.remote.objects, &path, max, early.is_none())
                    .await
                    .map_err(|e| unreachable(&url, e))?;
                let bytes = match got {
                    Got::Bytes(bytes) => bytes,
                    Got::Missing => {
                        return Err(refused(&url, kind, &digest, "missing from object storage"))
                    }
                    Got::TooLarge(size) => {
                        return Err(refused(
                            &url,
                            kind,
                            &digest,
                            &format!("{size} bytes or more, more than the {max} it may have"),
                        ))
                    }
                };
                let came = blocking(move || verify(&url, want, bytes)).await;
                drop(early);
                came
            }
        }
    }
}

/// Whether the local store has the object `want` names: a tree is read from it; a blob's
/// size is checked against what the bucket's tree says (the local copy is verified, so a
/// different size is the bucket's tree lying).
fn look(store: &Store, url: &str, want: Want) -> Result<Came> {
    let (kind, digest) = want.name();
    if !store.contains(kind, &digest) {
        return Ok(Came::Absent(want));
    }
    match want {
        Want::Tree(..) => Ok(Came::Present(want, Some(store.tree(&digest)?))),
        Want::Blob(_, Some(size)) => {
            let path = store.object_path(ObjectKind::Blob, &digest);
            let local = std::fs::metadata(&path)
                .map_err(|e| Error::io(&path, e))?
                .len();
            if local != size {
                return Err(refused(
                    url,
                    kind,
                    &digest,
                    &format!(
                        "its tree says {size} bytes, and the copy in the local store has {local}"
                    ),
                ));
            }
            Ok(Came::Present(want, None))
        }
        Want::Blob(_, None) => Ok(Came::Present(want, None)),
    }
}

/// An object's bytes checked against its digest (and a blob's against its tree's size), a
/// tree decoded.
fn verify(url: &str, want: Want, bytes: Vec<u8>) -> Result<Came> {
    let (kind, digest) = want.name();
    let got = Digest::of(&bytes);
    if got != digest {
        return Err(refused(
            url,
            kind,
            &digest,
            &format!("its bytes hash to {got}"),
        ));
    }
    match want {
        Want::Blob(_, Some(size)) if bytes.len() as u64 != size => Err(refused(
            url,
            kind,
            &digest,
            &format!("{} bytes where its tree says {size}", bytes.len()),
        )),
        Want::Blob(..) => Ok(Came::Fetched(want, bytes, None)),
        Want::Tree(..) => {
            let tree = Tree::decode(&bytes).map_err(|e| {
                refused(
                    url,
                    ObjectKind::Tree,
                    &digest,
                    &format!("not a tree: {}", e.message),
                )
            })?;
            Ok(Came::Fetched(want, bytes, Some(tree)))
        }
    }
}

impl Want {
    fn name(&self) -> (ObjectKind, Digest) {
        match *self {
            Want::Tree(d, _) => (ObjectKind::Tree, d),
            Want::Blob(d, _) => (ObjectKind::Blob, d),
        }
    }
}

/// What one bundle may hold: what staging lets a toolkit fetched from git hold (files, bytes,
/// bytes per file, depth below the bundle and its skill folder), and what it holds so far in
/// distinct objects, which bounds what a download keeps in memory. (Counted by path, which
/// needs every tree, it is checked once all have come: [`Walked::check_bundle`].)
struct Budget {
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
    fn new(limits: Limits, named: Named) -> Budget {
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
    fn max_download(&self) -> u64 {
        self.limits.max_bytes.saturating_mul(2)
    }

    /// The refusal of a bundle past one of its ceilings, naming the object that passed it.
    fn past(&self, kind: ObjectKind, digest: &Digest, what: String, limit: u64) -> Error {
        past(&self.named, kind, digest, &what, limit)
    }

    /// A tree more (at most as many distinct trees as files, as staging counts folders).
    fn tree(&mut self, digest: &Digest) -> Result<()> {
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
    fn children(&mut self, tree: &Tree, depth: usize, queue: &mut VecDeque<Want>) -> Result<()> {
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
    fn reserve(&mut self, want: &Want, max_manifest: u64) -> Result<u64> {
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
    fn arrived(&mut self, want: &Want, len: usize) -> Result<()> {
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

impl Walked {
    /// The bundle as its record describes it (one skill folder per entry of its tree, as
    /// many as the record counts) and within a toolkit's ceilings counted by path: files,
    /// folders, bytes and depth as staging would have counted them.
    fn check_bundle(&self, named: &Named, record: &BundleRecord, limits: Limits) -> Result<()> {
        let root = &self.trees[&record.bundle];
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
        let shape = self.shape(record.bundle);
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
    fn shape(&self, root: Digest) -> Shape {
        let mut shapes: HashMap<Digest, Shape> = HashMap::new();
        let mut stack = vec![(root, false)];
        while let Some((digest, children_done)) = stack.pop() {
            if shapes.contains_key(&digest) {
                continue;
            }
            let entries = self.trees[&digest].entries();
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
}

/// A bundle of the store of record past a ceiling: TOO_LARGE, naming the record and the
/// object that passed it.
fn past(named: &Named, kind: ObjectKind, digest: &Digest, what: &str, limit: u64) -> Error {
    crate::metrics::remote("refused");
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

/// A download that did not end within the fetch timeout: TIMEOUT, naming the record.
fn timed_out(named: &Named, seconds: u64) -> Error {
    crate::metrics::remote("timeout");
    Error::new(
        Code::Timeout,
        format!(
            "object storage {}: the download of the bundle of {} (record {}) took longer than the limit of {seconds} s (CLOUD_HARNESS_FETCH_TIMEOUT); nothing of it entered the store",
            named.url, named.toolkit, named.record
        ),
    )
    .with_details(serde_json::json!({
        "store": named.url,
        "record": named.record,
        "limit": seconds,
    }))
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

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_harness_fs::cas::Entry;

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
            walked.shape(root),
            Shape {
                height: 3,
                files: 9,
                folders: 3 + 9,
                bytes: 90
            }
        );
        // 65,536^5 paths: saturates, computed from six distinct trees.
        let (walked, root) = fan(1 << 16, 5);
        let shape = walked.shape(root);
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
            key: crate::provision::index::BundleKey {
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
        };
        let limits = Limits {
            max_files: 4000,
            ..Limits::default()
        };
        // 64 × 64 files by path, 4 distinct objects.
        let e = walked.check_bundle(&named, &record, limits).unwrap_err();
        assert_eq!(e.code, Code::TooLarge, "{e}");
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
        walked.check_bundle(&named, &record, fits).unwrap();
        let bytes = Limits {
            max_bytes: 4096 * 10 - 1,
            ..fits
        };
        let e = walked.check_bundle(&named, &record, bytes).unwrap_err();
        assert!(
            e.message.contains("holds 40960 bytes counted by path"),
            "{e}"
        );
    }
}

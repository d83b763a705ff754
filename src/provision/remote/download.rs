//! Download of a bundle from the store of record, which is not trusted: every object bounded
//! and verified, the whole bundle checked against its record and a toolkit's ceilings, and
//! only then entered into the local store, in one batch.

use super::{get, unreachable, wait, Got, Moved, RemoteStore, AT_ONCE};
use crate::provision::index::BundleRecord;
use crate::provision::staging::Limits;
use cloud_harness_fs::cas::{Digest, Kind, ObjectKind, Store, Tree, MAX_TREE_BYTES};
use cloud_harness_fs::{Code, Error, Result};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet, VecDeque};

impl RemoteStore {
    /// Brings every object of `record` that `store` lacks from object storage into it, within
    /// the ceilings `limits` puts on a toolkit fetched from git. Every object is checked (its
    /// bytes against its name, a blob's length against its tree's word, a tree's entries and
    /// depth, the counts and bytes of the whole bundle) before any is written; then all of
    /// them enter, in one batch, or none does.
    pub fn download(&self, store: &Store, record: &BundleRecord, limits: Limits) -> Result<Moved> {
        let fetch = Fetch {
            remote: self.clone(),
            store: store.clone(),
            max_manifest: limits.max_file_bytes,
        };
        let budget = Budget::new(limits, &record.key.url);
        let (bundle, manifest) = (record.bundle, record.manifest);
        let (walked, moved) = wait(async move { fetch.all(bundle, manifest, budget).await })?;
        walked.check_bundle(&self.url, record, limits)?;
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
    /// asked for as soon as it arrives, with up to [`AT_ONCE`] requests under way, since object
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
        budget.tree(&self.remote.url, &bundle)?;
        let mut under_way = FuturesUnordered::new();
        loop {
            while under_way.len() < AT_ONCE {
                let Some(want) = queue.pop_front() else {
                    break;
                };
                let (kind, digest) = want.name();
                if self.store.contains(kind, &digest) {
                    moved.present += 1;
                    if let Want::Tree(_, depth) = want {
                        let tree = self.store.tree(&digest)?;
                        budget.children(&self.remote.url, &tree, depth, &mut queue)?;
                        walked.trees.insert(digest, tree);
                    }
                    continue;
                }
                under_way.push(self.one(want));
            }
            let Some(result) = under_way.next().await else {
                break;
            };
            let (want, bytes) = result?;
            budget.fetched(&self.remote.url, &want, bytes.len())?;
            moved.objects += 1;
            moved.bytes += bytes.len() as u64;
            match want {
                Want::Tree(digest, depth) => {
                    let tree = Tree::decode(&bytes).map_err(|e| {
                        refused(
                            &self.remote.url,
                            ObjectKind::Tree,
                            &digest,
                            &format!("not a tree: {}", e.message),
                        )
                    })?;
                    budget.children(&self.remote.url, &tree, depth, &mut queue)?;
                    walked.trees.insert(digest, tree);
                    walked.fetched_trees.push(digest);
                }
                Want::Blob(..) => walked.blobs.push(bytes),
            }
        }
        Ok((walked, moved))
    }

    /// One object, no larger than it may be, verified against its digest.
    async fn one(&self, want: Want) -> Result<(Want, Vec<u8>)> {
        let (kind, digest) = want.name();
        let max = match want {
            Want::Tree(..) => MAX_TREE_BYTES,
            Want::Blob(_, Some(size)) => size,
            Want::Blob(_, None) => self.max_manifest,
        };
        let path = self.remote.object_path(kind, &digest);
        let url = &self.remote.url;
        let bytes = match get(&self.remote.objects, &path, max)
            .await
            .map_err(|e| unreachable(url, e))?
        {
            Got::Bytes(bytes) => bytes,
            Got::Missing => return Err(refused(url, kind, &digest, "missing from object storage")),
            Got::TooLarge(size) => {
                return Err(refused(
                    url,
                    kind,
                    &digest,
                    &format!("{size} bytes or more, more than the {max} it may have"),
                ))
            }
        };
        let got = Digest::of(&bytes);
        if got != digest {
            return Err(refused(
                url,
                kind,
                &digest,
                &format!("its bytes hash to {got}"),
            ));
        }
        if let Want::Blob(_, Some(size)) = want {
            if bytes.len() as u64 != size {
                return Err(refused(
                    url,
                    kind,
                    &digest,
                    &format!("{} bytes where its tree says {size}", bytes.len()),
                ));
            }
        }
        Ok((want, bytes))
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
/// bytes per file, depth below the bundle and its skill folder), and what it holds so far.
struct Budget {
    limits: Limits,
    /// The toolkit, for the errors.
    toolkit: String,
    blob_sizes: HashMap<Digest, u64>,
    trees: HashSet<Digest>,
    declared_bytes: u64,
    fetched_bytes: u64,
}

impl Budget {
    fn new(limits: Limits, toolkit: &str) -> Budget {
        Budget {
            limits,
            toolkit: toolkit.to_owned(),
            blob_sizes: HashMap::new(),
            trees: HashSet::new(),
            declared_bytes: 0,
            fetched_bytes: 0,
        }
    }

    /// How deep the bundle's trees may nest: the bundle, a skill folder at a toolkit's top,
    /// and the depth a toolkit's tree may have.
    fn max_depth(&self) -> usize {
        self.limits.max_depth + 2
    }

    /// The refusal of a bundle past one of its ceilings, naming the object that passed it.
    fn past(
        &self,
        url: &str,
        kind: ObjectKind,
        digest: &Digest,
        what: String,
        limit: u64,
    ) -> Error {
        past(url, &self.toolkit, kind, digest, &what, limit)
    }

    /// A tree more (at most as many as files, as staging counts folders).
    fn tree(&mut self, url: &str, digest: &Digest) -> Result<()> {
        self.trees.insert(*digest);
        let limit = self.limits.max_files + 1;
        if self.trees.len() as u64 > limit {
            let what =
                format!("holds more than the limit of {limit} folders (CLOUD_HARNESS_MAX_FILES)");
            return Err(self.past(url, ObjectKind::Tree, digest, what, limit));
        }
        Ok(())
    }

    /// Queues the entries of `tree` (at `depth`) not seen before, each counted first.
    fn children(
        &mut self,
        url: &str,
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
                    return Err(self.past(
                        url,
                        ObjectKind::Tree,
                        &e.digest,
                        what,
                        self.max_depth() as u64,
                    ));
                }
                self.tree(url, &e.digest)?;
                queue.push_back(Want::Tree(e.digest, depth + 1));
                continue;
            }
            match self.blob_sizes.get(&e.digest) {
                Some(&size) if size == e.size => continue,
                Some(&size) => {
                    return Err(refused(
                        url,
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
                return Err(self.past(
                    url,
                    ObjectKind::Blob,
                    &e.digest,
                    what,
                    limits.max_file_bytes,
                ));
            }
            self.blob_sizes.insert(e.digest, e.size);
            self.declared_bytes += e.size;
            if self.blob_sizes.len() as u64 > limits.max_files {
                let what = format!(
                    "holds more than the limit of {} files (CLOUD_HARNESS_MAX_FILES)",
                    limits.max_files
                );
                return Err(self.past(url, ObjectKind::Blob, &e.digest, what, limits.max_files));
            }
            if self.declared_bytes > limits.max_bytes {
                let what = format!(
                    "holds more than the limit of {} bytes in all (CLOUD_HARNESS_MAX_BYTES)",
                    limits.max_bytes
                );
                return Err(self.past(url, ObjectKind::Blob, &e.digest, what, limits.max_bytes));
            }
            queue.push_back(Want::Blob(e.digest, Some(e.size)));
        }
        Ok(())
    }

    /// An object fetched: what a download holds in memory until it is written is bounded
    /// (the files' bytes, the trees' and the manifest's: twice CLOUD_HARNESS_MAX_BYTES).
    fn fetched(&mut self, url: &str, want: &Want, len: usize) -> Result<()> {
        self.fetched_bytes += len as u64;
        let limit = self.limits.max_bytes.saturating_mul(2);
        if self.fetched_bytes > limit {
            let (kind, digest) = want.name();
            let what =
                format!("is more than {limit} bytes to download (twice CLOUD_HARNESS_MAX_BYTES)");
            return Err(self.past(url, kind, &digest, what, limit));
        }
        Ok(())
    }
}

impl Walked {
    /// The bundle as its record describes it: one skill folder per entry of its tree, as many
    /// as the record counts, and no path through its trees longer than they may nest (the walk
    /// meets each tree once, at its shallowest; a tree two folders name is as deep as the
    /// deeper of them).
    fn check_bundle(&self, url: &str, record: &BundleRecord, limits: Limits) -> Result<()> {
        let root = &self.trees[&record.bundle];
        let folders = root
            .entries()
            .iter()
            .filter(|e| e.kind == Kind::Tree)
            .count();
        if folders != root.entries().len() || folders != record.skills {
            return Err(refused(
                url,
                ObjectKind::Tree,
                &record.bundle,
                &format!(
                    "not the bundle its record says: {} entries, {folders} of them folders, where the record counts {} skills",
                    root.entries().len(),
                    record.skills
                ),
            ));
        }
        let max = limits.max_depth + 2;
        let height = self.height(record.bundle);
        if height > max {
            let what = format!("nests {height} folders deep, more than the limit of {max} (CLOUD_HARNESS_MAX_DEPTH, and two for the bundle)");
            return Err(past(
                url,
                &record.key.url,
                ObjectKind::Tree,
                &record.bundle,
                &what,
                max as u64,
            ));
        }
        Ok(())
    }

    /// The most trees on one path down from `root` (1 for a tree of files), without recursion.
    fn height(&self, root: Digest) -> usize {
        let mut heights: HashMap<Digest, usize> = HashMap::new();
        let mut stack = vec![(root, false)];
        while let Some((digest, children_done)) = stack.pop() {
            if heights.contains_key(&digest) {
                continue;
            }
            let subtrees = self.trees[&digest]
                .entries()
                .iter()
                .filter(|e| e.kind == Kind::Tree)
                .map(|e| e.digest);
            if children_done {
                let below = subtrees.filter_map(|d| heights.get(&d)).max().copied();
                heights.insert(digest, 1 + below.unwrap_or(0));
            } else {
                stack.push((digest, true));
                stack.extend(
                    subtrees
                        .filter(|d| !heights.contains_key(d))
                        .map(|d| (d, false)),
                );
            }
        }
        heights[&root]
    }
}

/// A bundle of the store of record past a ceiling: TOO_LARGE, naming the object that passed it.
fn past(
    url: &str,
    toolkit: &str,
    kind: ObjectKind,
    digest: &Digest,
    what: &str,
    limit: u64,
) -> Error {
    crate::metrics::remote("refused");
    Error::too_large(format!(
        "object storage {url}: the bundle of {toolkit} {what}, at {} {digest}; it was refused and nothing of it entered the store",
        kind.dir_name()
    ))
    .with_details(serde_json::json!({
        "store": url,
        "object": digest.to_string(),
        "kind": kind.dir_name(),
        "limit": limit,
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

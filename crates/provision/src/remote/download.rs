//! Download of a bundle from the store of record, which is not trusted: every object bounded
//! and verified, the whole bundle checked against its record and a toolkit's ceilings, and
//! only then entered into the local store, in one batch.
//!
//! A tree names its folders by digest, so a few distinct objects can stand for a vast tree
//! (a tree of 65,536 entries all naming a second such tree, and so on). What is fetched is
//! bounded by distinct objects (memory); what the bundle holds is counted by path, as staging
//! counts a toolkit, before anything is written: every later walk of the bundle goes by path.

use super::ceilings::{check_bundle, Budget, Named, Want};
use super::pack::Packed;
use super::{
    blocking, get_held, hold, refused, unreachable, wait, Got, Moved, RemoteStore, AT_ONCE,
};
use crate::index::BundleRecord;
use crate::staging::Limits;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, ObjectKind, Store, Tree};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
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
        let mut fetch = Fetch {
            remote: self.clone(),
            store: store.clone(),
            max_manifest: limits.max_file_bytes,
            packed: Mutex::default(),
            requests: AtomicUsize::new(0),
        };
        let budget = Budget::new(limits, named.clone());
        let (bundle, manifest) = (record.bundle, record.manifest);
        let pack = record.pack.filter(|_| self.packs);
        let seconds = limits.max_seconds;
        let late = named.clone();
        let (walked, moved) = wait(async move {
            let whole = async {
                let _turn = DOWNLOADS
                    .acquire()
                    .await
                    .map_err(|_| Error::internal("the downloads' semaphore was closed"))?;
                let mut moved = Moved::default();
                // Held while the pack's objects are: what is in flight stays within its bound.
                let mut _pack_held = None;
                if let Some(pack) = pack {
                    let max = budget.max_download();
                    match fetch
                        .remote
                        .fetch_pack(&pack, limits, max, &mut moved)
                        .await
                    {
                        Ok((objects, held)) => {
                            fetch.packed = Mutex::new(objects);
                            _pack_held = Some(held);
                        }
                        // What is in the pack is checked again object by object as it is
                        // used; a pack refused or cut short leaves the bucket's objects to ask
                        // for (an outage then shows there).
                        Err(e) => {
                            tracing::error!(store = %fetch.remote.url, error = %e.message, "fetching the bundle object by object instead");
                        }
                    }
                }
                let (walked, walk_moved) = fetch.all(bundle, manifest, budget).await?;
                moved.objects += walk_moved.objects;
                moved.bytes += walk_moved.bytes;
                moved.present += walk_moved.present;
                moved.requests += fetch.requests.load(Ordering::Relaxed);
                Ok((walked, moved))
            };
            tokio::time::timeout(Duration::from_secs(seconds), whole)
                .await
                .unwrap_or_else(|_| Err(timed_out(&late, seconds)))
        })?;
        check_bundle(&walked.trees, &named, record, limits)?;
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
    /// The objects of the bundle's pack, taken as they are asked for.
    packed: Mutex<Packed>,
    /// GET requests for single objects.
    requests: AtomicUsize,
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
                let (kind, digest) = want.name();
                let from_pack = self
                    .packed
                    .lock()
                    .expect("pack lock")
                    .remove(&(kind == ObjectKind::Tree, digest));
                if let Some(bytes) = from_pack.filter(|b| b.len() as u64 <= max) {
                    return blocking(move || verify(&url, want, bytes)).await;
                }
                self.requests.fetch_add(1, Ordering::Relaxed);
                // A blob's bytes are known before it is asked for; a tree's once the server
                // says, before its body is read.
                let early = match want {
                    Want::Blob(_, Some(size)) => {
                        Some(hold(size).await.map_err(|e| unreachable(&url, e))?)
                    }
                    _ => None,
                };
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
    pub(super) fn name(&self) -> (ObjectKind, Digest) {
        match *self {
            Want::Tree(d, _) => (ObjectKind::Tree, d),
            Want::Blob(d, _) => (ObjectKind::Blob, d),
        }
    }
}

/// A download that did not end within the fetch timeout: TIMEOUT, naming the record.
fn timed_out(named: &Named, seconds: u64) -> Error {
    cloud_harness_control::metrics::remote("timeout");
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

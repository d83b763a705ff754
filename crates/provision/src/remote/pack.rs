//! A bundle's objects packed in one object of the store of record, so a runner starts from
//! object storage in one request instead of one per object. The pack is named by its SHA-256
//! (`objects/pack/ab/cdef…`), put create-only, and named by the bundle's record with its size;
//! a runner that reads it trusts none of it: every entry is bounded before it is kept, every
//! object checked against its name, and the download then walks and bounds the bundle exactly
//! as it does object by object. A pack that cannot be read whole, is too large or holds an
//! object that is not what its name says is refused as a whole, and the download goes on
//! object by object.
//!
//! ```text
//! CHPACK1\n                                    8 bytes
//! { kind: b'b' | b't', digest: [u8; 32], len: u64 LE, bytes: [u8; len] } …
//! ```
//! The manifest first, then the trees from the bundle down, then the blobs.
//!
//! A large pack comes in ranges, several requests under way at once (a bucket serves each
//! connection at a bounded rate), read in order as they arrive.

use super::{blocking, hold, unreachable, Moved, RemoteStore};
use crate::index::{BundleRecord, PackRef};
use crate::staging::Limits;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Kind, Store, MAX_TREE_BYTES};
use object_store::ObjectStoreExt;
use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

const MAGIC: &[u8; 8] = b"CHPACK1\n";
/// A pack larger than this comes in ranges of this size (see [`RemoteStore::with_range_bytes`]).
pub const RANGE_BYTES: u64 = 8 << 20;
/// Ranges of one pack under way at once. Their bytes wait until read in order: at most this
/// many ranges' (32 MiB) beside the objects read so far, which the pack's size bounds.
pub const RANGES_AT_ONCE: usize = 4;
/// An entry's head: its kind, digest and length.
const HEAD: usize = 1 + 32 + 8;

/// Objects by kind (a tree: true) and digest.
pub(super) type Packed = HashMap<(bool, Digest), Vec<u8>>;

/// The pack of a bundle whole in `store`: its manifest, trees and blobs, each once.
pub(super) fn encode(store: &Store, record: &BundleRecord) -> Result<Vec<u8>> {
    let (blobs, levels) = layout(store, &record.bundle)?;
    let mut pack = MAGIC.to_vec();
    let mut put = |kind: u8, digest: &Digest, bytes: &[u8]| {
        pack.push(kind);
        pack.extend_from_slice(&digest.0);
        pack.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        pack.extend_from_slice(bytes);
    };
    put(b'b', &record.manifest, &store.blob(&record.manifest)?);
    for digest in levels.iter().flatten() {
        put(b't', digest, &store.tree(digest)?.encode());
    }
    for digest in &blobs {
        put(b'b', digest, &store.blob(digest)?);
    }
    Ok(pack)
}

/// The bundle's blobs (the manifest aside) and its trees by depth, each object once.
pub(super) fn layout(store: &Store, bundle: &Digest) -> Result<(Vec<Digest>, Vec<Vec<Digest>>)> {
    let mut blobs = Vec::new();
    let mut levels: Vec<Vec<Digest>> = Vec::new();
    let mut seen = HashSet::new();
    let mut level = vec![*bundle];
    seen.insert((true, *bundle));
    while !level.is_empty() {
        let mut next = Vec::new();
        for digest in &level {
            for e in store.tree(digest)?.entries() {
                if !seen.insert((e.kind == Kind::Tree, e.digest)) {
                    continue;
                }
                match e.kind {
                    Kind::Tree => next.push(e.digest),
                    _ => blobs.push(e.digest),
                }
            }
        }
        levels.push(std::mem::replace(&mut level, next));
    }
    Ok((blobs, levels))
}

/// A pack read as it arrives: every entry bounded before its bytes are kept.
struct Reader {
    limits: Limits,
    /// What is not yet a whole head or a whole entry.
    pending: Vec<u8>,
    magic: bool,
    objects: Packed,
}

impl Reader {
    fn feed(&mut self, mut chunk: &[u8]) -> std::result::Result<(), String> {
        while !chunk.is_empty() {
            let want = self.wanted()?;
            let take = (want - self.pending.len()).min(chunk.len());
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.pending.len() == want {
                self.complete()?;
            }
        }
        Ok(())
    }

    /// How many bytes `pending` must hold to be whole: the magic, a head, or a head and its
    /// bytes (checked against what an object of its kind may have).
    fn wanted(&self) -> std::result::Result<usize, String> {
        if !self.magic {
            return Ok(MAGIC.len());
        }
        if self.pending.len() < HEAD {
            return Ok(HEAD);
        }
        let len = u64::from_le_bytes(self.pending[33..HEAD].try_into().expect("8 bytes"));
        let max = match self.pending[0] {
            b't' => MAX_TREE_BYTES,
            b'b' => self.limits.max_file_bytes,
            other => return Err(format!("an entry of unknown kind {other}")),
        };
        if len > max {
            return Err(format!(
                "an entry of {len} bytes, more than the {max} it may have"
            ));
        }
        Ok(HEAD + len as usize)
    }

    fn complete(&mut self) -> std::result::Result<(), String> {
        if !self.magic {
            if self.pending != MAGIC {
                return Err("it does not begin as a pack".into());
            }
            self.magic = true;
            self.pending.clear();
            return Ok(());
        }
        if self.pending.len() == HEAD && self.wanted()? > HEAD {
            return Ok(()); // a head; its bytes follow
        }
        let is_tree = self.pending[0] == b't';
        let digest = Digest(self.pending[1..33].try_into().expect("32 bytes"));
        // At most as many objects as a bundle may have files and folders, and its manifest.
        let max = self.limits.max_files.saturating_mul(2).saturating_add(2);
        if self.objects.len() as u64 >= max {
            return Err(format!("more than the {max} objects a bundle may have"));
        }
        let bytes = self.pending.split_off(HEAD);
        self.pending.clear();
        self.objects.insert((is_tree, digest), bytes);
        Ok(())
    }

    fn finish(self) -> std::result::Result<Packed, String> {
        if !self.magic || !self.pending.is_empty() {
            return Err("it ends in the middle of an entry".into());
        }
        Ok(self.objects)
    }
}

/// Every object of `bytes`, a whole pack, checked (the tests' and the fuzzer's way in).
pub fn read_all(bytes: &[u8], limits: Limits) -> std::result::Result<usize, String> {
    let mut reader = Reader::new(limits);
    reader.feed(bytes)?;
    let objects = reader.finish()?;
    check_objects(&objects)?;
    Ok(objects.len())
}

impl Reader {
    fn new(limits: Limits) -> Reader {
        Reader {
            limits,
            pending: Vec::new(),
            magic: false,
            objects: HashMap::new(),
        }
    }
}

/// Every object's bytes against its name.
fn check_objects(objects: &Packed) -> std::result::Result<(), String> {
    for ((is_tree, digest), bytes) in objects {
        let got = Digest::of(bytes);
        if got != *digest {
            let kind = if *is_tree { "tree" } else { "blob" };
            return Err(format!("its {kind} {digest} hashes to {got}"));
        }
    }
    Ok(())
}

/// Whether `e` says a range was answered with something else (a whole object, another range,
/// no `Content-Range`), as object_store words it, rather than that the store failed.
fn ranges_unanswered(e: &object_store::Error) -> bool {
    let mut said = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        said.push_str(&format!(": {s}"));
        source = s.source();
    }
    ["non-partial response", "Content-Range", "Requested "]
        .iter()
        .any(|words| said.contains(words))
}

impl RemoteStore {
    /// Where the pack named `digest` is.
    pub(super) fn pack_path(&self, digest: &Digest) -> object_store::path::Path {
        let hex = digest.hex();
        self.path(&format!("objects/pack/{}/{}", &hex[..2], &hex[2..]))
    }

    /// The objects of the pack `pack` names, in one request, each checked against its name;
    /// at most `max` bytes (what a download may hold), and the share of the bytes in flight
    /// they hold, to keep while they are. A pack that cannot be used is refused, named; an
    /// outage is UPSTREAM and retryable.
    pub(super) async fn fetch_pack(
        &self,
        pack: &PackRef,
        limits: Limits,
        max: u64,
        moved: &mut Moved,
    ) -> Result<(Packed, tokio::sync::SemaphorePermit<'static>)> {
        let bad = |why: String| {
            cloud_harness_control::metrics::remote("refused");
            Error::new(
                Code::Upstream,
                format!(
                    "object storage {} has a bad pack {} ({why}); it was refused",
                    self.url, pack.digest
                ),
            )
            .with_details(serde_json::json!({ "store": self.url, "pack": pack.digest.to_string() }))
        };
        if pack.size > max {
            return Err(bad(format!(
                "its record says {} bytes, more than the {max} a download may hold",
                pack.size
            )));
        }
        let held = hold(pack.size)
            .await
            .map_err(|e| unreachable(&self.url, e))?;
        let ranges = self.ranges(pack.size);
        let no_ranges = &self.no_ranges;
        let read = if ranges.len() > 1 && !no_ranges.load(Ordering::Relaxed) {
            let sent = std::sync::atomic::AtomicUsize::new(0);
            let read = self.read_ranges(pack, ranges, limits, &sent).await;
            moved.requests += sent.into_inner();
            match read {
                // A store (or a proxy) that does not answer ranges: whole, from now on.
                Err(e) if ranges_unanswered(&e) => {
                    tracing::warn!(store = %self.url, error = %e, "the store does not answer ranges; its packs come whole");
                    no_ranges.store(true, Ordering::Relaxed);
                    moved.requests += 1;
                    self.read_pack(pack, limits).await
                }
                read => read,
            }
        } else {
            moved.requests += 1;
            self.read_pack(pack, limits).await
        };
        let objects = match read {
            Ok(Ok(objects)) => objects,
            Ok(Err(why)) => return Err(bad(why)),
            Err(e) => return Err(unreachable(&self.url, e)),
        };
        let checked = blocking(move || Ok(check_objects(&objects).map(|()| objects))).await?;
        checked.map(|objects| (objects, held)).map_err(bad)
    }

    /// The pack's objects as they arrive, or why it is not the pack its record names. (The
    /// stream is not hashed against the pack's name: each object is checked against its own,
    /// which is what is trusted.)
    async fn read_pack(
        &self,
        pack: &PackRef,
        limits: Limits,
    ) -> object_store::Result<std::result::Result<Packed, String>> {
        use futures_util::StreamExt;
        let result = match self.objects.get(&self.pack_path(&pack.digest)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(Err("missing".into())),
            Err(e) => return Err(e),
        };
        if result.meta.size != pack.size {
            let said = result.meta.size;
            return Ok(Err(format!(
                "{said} bytes where its record says {}",
                pack.size
            )));
        }
        let mut reader = Reader::new(limits);
        let mut total = 0u64;
        let mut body = result.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            total += chunk.len() as u64;
            if total > pack.size {
                return Ok(Err(format!(
                    "more bytes than the {} its record says",
                    pack.size
                )));
            }
            if let Err(why) = reader.feed(&chunk) {
                return Ok(Err(why));
            }
        }
        Ok(reader.finish())
    }

    /// The ranges a pack of `size` bytes comes in: one (the whole) up to the range size.
    fn ranges(&self, size: u64) -> Vec<std::ops::Range<u64>> {
        let step = self.range_bytes;
        (0..size.div_ceil(step))
            .map(|i| i * step..((i + 1) * step).min(size))
            .collect()
    }

    /// [`Self::read_pack`] in `ranges` (in order, covering the pack), [`RANGES_AT_ONCE`]
    /// under way; each must be exactly the range asked of an object of the recorded size.
    /// `sent` counts the requests made.
    async fn read_ranges(
        &self,
        pack: &PackRef,
        ranges: Vec<std::ops::Range<u64>>,
        limits: Limits,
        sent: &std::sync::atomic::AtomicUsize,
    ) -> object_store::Result<std::result::Result<Packed, String>> {
        use futures_util::StreamExt;
        let path = self.pack_path(&pack.digest);
        let fetch = |range: std::ops::Range<u64>| {
            let path = path.clone();
            async move {
                sent.fetch_add(1, Ordering::Relaxed);
                self.read_range(&path, pack.size, range).await
            }
        };
        let mut parts = futures_util::stream::iter(ranges)
            .map(fetch)
            .buffered(RANGES_AT_ONCE);
        let mut reader = Reader::new(limits);
        while let Some(part) = parts.next().await {
            let bytes = match part {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(why)) => return Ok(Err(why)),
                Err(object_store::Error::NotFound { .. }) => return Ok(Err("missing".into())),
                Err(e) => return Err(e),
            };
            if let Err(why) = reader.feed(&bytes) {
                return Ok(Err(why));
            }
        }
        Ok(reader.finish())
    }

    /// One range of a pack of `size` bytes, no more bytes kept than the range has.
    async fn read_range(
        &self,
        path: &object_store::path::Path,
        size: u64,
        range: std::ops::Range<u64>,
    ) -> object_store::Result<std::result::Result<Vec<u8>, String>> {
        use futures_util::StreamExt;
        let options = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let result = self.objects.get_opts(path, options).await?;
        if result.meta.size != size {
            let said = result.meta.size;
            return Ok(Err(format!("{said} bytes where its record says {size}")));
        }
        if result.range != range {
            let got = &result.range;
            return Ok(Err(format!("bytes {got:?} where {range:?} were asked")));
        }
        let want = (range.end - range.start) as usize;
        let mut bytes = Vec::with_capacity(want);
        let mut body = result.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            if bytes.len() + chunk.len() > want {
                return Ok(Err(format!("more than the {want} bytes of {range:?}")));
            }
            bytes.extend_from_slice(&chunk);
        }
        if bytes.len() != want {
            let got = bytes.len();
            return Ok(Err(format!("{got} bytes of the {want} of {range:?}")));
        }
        Ok(Ok(bytes))
    }
}

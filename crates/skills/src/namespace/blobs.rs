//! Open store objects, shared by every view in the process. A file read through any view keeps
//! its object open here, by store and digest, so the workspaces serving the same bundles share
//! one descriptor per file, and the descriptors held are bounded whatever the number of views:
//! each view kept 256 of its own before, and a runner's views held ~100 each in the scale bench
//! (`cargo bench --bench scale`), which made open descriptors the first limit a runner with a
//! few hundred workspaces met.
//!
//! An object held is served only while the kernel says its file is the one opened (same
//! inode, size and times): one rewritten in place since is dropped and opened, and checked,
//! again, as a new view would have.

use cloud_harness_store::cas::{Digest, FileId, Store};
use lru::LruCache;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::sync::{Arc, LazyLock, Mutex};

/// Objects held open at most, in all.
pub const HELD: usize = 2048;

/// Which store an object is from: objects of the same digest in two stores are the same bytes,
/// but a store's own object may be damaged, and that one must answer for it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) struct StoreKey(u64);

impl StoreKey {
    pub(super) fn of(store: &Store) -> StoreKey {
        let mut h = std::hash::DefaultHasher::new();
        store.root().hash(&mut h);
        StoreKey(h.finish())
    }
}

type Held = LruCache<(StoreKey, Digest), (Arc<File>, FileId)>;

static OPEN: LazyLock<Mutex<Held>> = LazyLock::new(|| {
    Mutex::new(LruCache::new(
        NonZeroUsize::new(HELD).expect("a non-zero bound"),
    ))
});

/// The object `digest` of `store`, if held and unchanged since it was opened.
pub(super) fn get(store: StoreKey, digest: &Digest) -> Option<Arc<File>> {
    let (file, opened) = OPEN
        .lock()
        .expect("open objects lock")
        .get(&(store, *digest))
        .cloned()?;
    match file.metadata() {
        Ok(meta) if FileId::of(&meta) == opened => Some(file),
        _ => {
            OPEN.lock()
                .expect("open objects lock")
                .pop(&(store, *digest));
            None
        }
    }
}

/// Holds `file`, the object `digest` of `store` just opened and checked.
pub(super) fn put(store: StoreKey, digest: &Digest, file: Arc<File>) {
    let Ok(meta) = file.metadata() else { return };
    OPEN.lock()
        .expect("open objects lock")
        .put((store, *digest), (file, FileId::of(&meta)));
}

/// Objects held open now.
pub fn held() -> usize {
    OPEN.lock().expect("open objects lock").len()
}

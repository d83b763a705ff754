//! Files an import has read and hashed before, by what the kernel says identifies their bytes
//! (device, inode, size, modification and change times; see [`super::verified`]): an
//! unchanged file is not read again. The live tiers import a project's skill folders again on
//! every change there; without this each pass would read and hash every file of them.
//!
//! Only a file left alone for a second before it was read is recorded (a change right after
//! could keep its times), and a digest found here is used only while its blob is still in the
//! store. Bounded (least recently used first out), shared by the whole process.

use super::digest::Digest;
use super::verified::FileId;
use lru::LruCache;
use std::fs::Metadata;
use std::num::NonZeroUsize;
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

/// Entries kept: about 150 bytes each, so some 10 MiB at most.
const CAPACITY: usize = 65536;

fn cache() -> &'static Mutex<LruCache<FileId, Digest>> {
    static CACHE: OnceLock<Mutex<LruCache<FileId, Digest>>> = OnceLock::new();
    CACHE.get_or_init(|| {
        Mutex::new(LruCache::new(
            NonZeroUsize::new(CAPACITY).expect("a non-zero capacity"),
        ))
    })
}

/// What the file `meta` describes hashed to when it was last read, if it has not changed.
pub fn digest_of(meta: &Metadata) -> Option<Digest> {
    cache()
        .lock()
        .expect("hashed lock")
        .get(&FileId::of(meta))
        .copied()
}

/// Records that the file `meta` describes (as it was before it was read, at `read_at`)
/// hashed to `digest`, if it had settled by then.
pub fn record(meta: &Metadata, digest: Digest, read_at: SystemTime) {
    if FileId::settled(meta, read_at) {
        cache()
            .lock()
            .expect("hashed lock")
            .put(FileId::of(meta), digest);
    }
}

#[cfg(test)]
mod tests {
    use crate::cas::{Limits, ObjectKind, Store};
    use std::time::Duration;

    #[test]
    fn an_unchanged_file_is_not_read_again_while_its_blob_is_stored() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path().join("store")).unwrap();
        let dir = tmp.path().join("skills");
        std::fs::create_dir_all(dir.join("a")).unwrap();
        for name in ["a/SKILL.md", "a/one.md", "two.md"] {
            std::fs::write(dir.join(name), name).unwrap();
        }
        // Read right after it was written: not trusted for the next import.
        let first = store.import_dir(&dir, &Limits::PROJECT).unwrap();
        let again = store.import_dir(&dir, &Limits::PROJECT).unwrap();
        assert_eq!((first.unchanged, again.unchanged), (0, 0));
        assert_eq!(first.digest, again.digest);

        std::thread::sleep(Duration::from_millis(1100));
        let settled = store.import_dir(&dir, &Limits::PROJECT).unwrap();
        let unchanged = store.import_dir(&dir, &Limits::PROJECT).unwrap();
        assert_eq!((settled.unchanged, unchanged.unchanged), (0, 3));
        assert_eq!(unchanged.digest, first.digest);

        // Rewritten: read again, the others not.
        std::fs::write(dir.join("two.md"), "changed").unwrap();
        let changed = store.import_dir(&dir, &Limits::PROJECT).unwrap();
        assert_eq!(changed.unchanged, 2);
        assert_ne!(changed.digest, first.digest);

        // A blob no longer stored (collected meanwhile) is read and stored again.
        let blob = crate::cas::Digest::of(b"a/one.md");
        let path = store.object_path(ObjectKind::Blob, &blob);
        std::fs::remove_file(&path).unwrap();
        let restored = store.import_dir(&dir, &Limits::PROJECT).unwrap();
        assert_eq!(restored.unchanged, 1);
        assert!(store.contains(ObjectKind::Blob, &blob));
    }
}

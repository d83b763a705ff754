//! Objects this process has already hashed and found whole: one hash per object file per
//! process lifetime, whichever mount, workspace or reader asks first.
//!
//! An entry names the digest and the identity of the file that held the bytes (device, inode,
//! size, modification and change times). A file replaced (a new inode), rewritten or touched
//! in place (new times) no longer matches and is hashed again, so the cache only trusts what
//! it saw: the same file, unchanged as far as the kernel says. The kernel's clock for file
//! times is coarse (a tick of a few milliseconds), so a file changed within a second before it
//! was hashed is not recorded: a change right after the hash could keep its times (as git
//! treats its "racily clean" index entries). What the cache cannot see — bits that rot on the
//! disk under an unchanged inode — `cloud-harness cas verify` checks.

use super::digest::Digest;
use crate::stats::STATS;
use lru::LruCache;
use std::fs::Metadata;
use std::num::NonZeroUsize;
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Entries kept: about 100 bytes each, so some 6 MiB at most.
const CAPACITY: usize = 65536;

/// How long a file must have been left alone before its hash is trusted for later reads.
const SETTLED: Duration = Duration::from_secs(1);

/// What the kernel says identifies a file's bytes: a file whose `FileId` is unchanged was not
/// replaced, written or touched since (within the clock's tick).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileId {
    pub fn of(meta: &Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the file `meta` describes had been left alone for [`SETTLED`] at `now`: only
    /// then may what its bytes hashed to be trusted while it keeps these times.
    pub(super) fn settled(meta: &Metadata, now: SystemTime) -> bool {
        // Any change of the bytes (or of the times) moves the change time to the kernel's now.
        let changed =
            UNIX_EPOCH + Duration::new(meta.ctime().max(0) as u64, meta.ctime_nsec() as u32);
        changed + SETTLED <= now
    }
}

/// Keyed by the digest and the file (device, inode), so that two files of the same bytes (two
/// stores in one process) do not push each other out.
type Key = (Digest, u64, u64);

fn key(digest: &Digest, id: &FileId) -> Key {
    (*digest, id.dev, id.ino)
}

fn cache() -> &'static Mutex<LruCache<Key, FileId>> {
    static CACHE: OnceLock<Mutex<LruCache<Key, FileId>>> = OnceLock::new();
    CACHE.get_or_init(|| {
        Mutex::new(LruCache::new(
            NonZeroUsize::new(CAPACITY).expect("a non-zero capacity"),
        ))
    })
}

/// Whether the file described by `meta` was hashed to `digest` in this process. A caller
/// told no hashes the object before using it, and the counters count it so.
pub fn known(digest: &Digest, meta: &Metadata) -> bool {
    let id = FileId::of(meta);
    let known = cache()
        .lock()
        .expect("verified lock")
        .get(&key(digest, &id))
        == Some(&id);
    STATS.object_read(known);
    known
}

/// Records that the file described by `meta` hashed to `digest`, if it had settled.
pub fn record(digest: &Digest, meta: &Metadata) {
    record_at(digest, meta, SystemTime::now());
}

fn record_at(digest: &Digest, meta: &Metadata, now: SystemTime) {
    if !FileId::settled(meta, now) {
        return;
    }
    let id = FileId::of(meta);
    cache()
        .lock()
        .expect("verified lock")
        .put(key(digest, &id), id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_is_known_until_it_changes_or_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        std::fs::write(&path, b"hello").unwrap();
        let digest = Digest::of(b"hello");
        let meta = || std::fs::metadata(&path).unwrap();
        let later = || SystemTime::now() + Duration::from_secs(2);
        assert!(!known(&digest, &meta()));
        // Hashed right after it was written: not trusted for later reads.
        record(&digest, &meta());
        assert!(!known(&digest, &meta()));
        record_at(&digest, &meta(), later());
        assert!(known(&digest, &meta()));
        // Rewritten in place: the same inode, new times.
        std::thread::sleep(Duration::from_millis(20));
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(b"jello").unwrap();
        drop(f);
        assert!(!known(&digest, &meta()));
        // Replaced by another file with the same bytes: a new inode.
        record_at(&digest, &meta(), later());
        let other = dir.path().join("other");
        std::fs::write(&other, b"hello").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!known(&digest, &meta()));
    }
}

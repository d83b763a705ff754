//! Directory listings without open handles: the kernel opens directories without asking
//! (zero-message opendir), so a walk costs no round trip per folder, and every readdir offset
//! names the listing it belongs to. An offset is `tag << 32 | position`: the tag is a hash of
//! the listing (names and inodes), the position counts "." and ".." first. A reader that goes
//! on after a generation change passes an offset of the old listing and keeps getting that
//! listing, never a mix of two. Kept ([`Listings`]): the last 64 listings made, and every
//! folder's latest two, however many other folders are listed meanwhile — the kernel serves a
//! cached listing without asking, so a listing made long ago may be the one a reader is in
//! when its folder changes. A reader inside a listing no longer kept gets ESTALE rather than
//! a wrong listing.

use super::node::Child;
use lru::LruCache;
use std::collections::HashMap;
use std::hash::{Hash, Hasher as _};
use std::num::NonZeroUsize;
use std::sync::Arc;

/// A directory's listing as of one generation.
#[derive(Debug)]
pub struct Listing {
    pub children: Vec<Child>,
    pub(super) tag: u32,
}

/// Listings kept for readers still inside them: the last [`RECENT`] made, and for every folder
/// the kernel knows its latest two, however many other folders are listed meanwhile.
pub(super) struct Listings {
    recent: LruCache<(u64, u32), Arc<Listing>>,
    latest: HashMap<u64, [Option<Arc<Listing>>; 2]>,
}

/// Listings kept of all folders together, most recent first.
const RECENT: usize = 64;

impl Default for Listings {
    fn default() -> Self {
        Listings {
            recent: LruCache::new(NonZeroUsize::new(RECENT).expect("non-zero")),
            latest: HashMap::new(),
        }
    }
}

impl Listings {
    pub(super) fn find(&mut self, ino: u64, tag: u32) -> Option<Arc<Listing>> {
        if let Some(l) = self.recent.get(&(ino, tag)) {
            return Some(l.clone());
        }
        let kept = self.latest.get(&ino)?;
        kept.iter().flatten().find(|l| l.tag == tag).cloned()
    }

    /// `listing`, or the kept one equal to it.
    pub(super) fn keep(&mut self, ino: u64, listing: Arc<Listing>) -> Arc<Listing> {
        let kept = self.latest.entry(ino).or_default();
        let listing = match kept.iter().flatten().find(|l| l.tag == listing.tag) {
            Some(same) => same.clone(),
            None => {
                kept[1] = kept[0].replace(listing.clone());
                listing
            }
        };
        self.recent.put((ino, listing.tag), listing.clone());
        listing
    }

    /// A folder the kernel forgot has no reader left inside its listings.
    pub(super) fn forget(&mut self, ino: u64) {
        self.latest.remove(&ino);
    }
}

impl Listing {
    pub(super) fn new(children: Vec<Child>) -> Listing {
        let mut h = std::hash::DefaultHasher::new();
        for c in &children {
            c.name.hash(&mut h);
            c.attr.ino.hash(&mut h);
        }
        // 31 bits: offsets stay positive as the signed positions of lseek and telldir.
        let tag = (h.finish() as u32) & 0x7fff_ffff;
        Listing { children, tag }
    }

    /// The offset at which a reader goes on after `position` entries ("." and ".." included).
    pub fn cookie(&self, position: u64) -> u64 {
        (u64::from(self.tag) << 32) | (position & 0xffff_ffff)
    }
}

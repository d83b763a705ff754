//! Directory listings without open handles: the kernel opens directories without asking
//! (zero-message opendir), so a walk costs no round trip per folder, and every readdir offset
//! names the listing it belongs to. An offset is `tag << 32 | position`: the tag is a hash of
//! the listing (names and inodes), the position counts "." and ".." first. A reader that goes
//! on after a generation change passes an offset of the old listing and keeps getting that
//! listing (kept here, the last [`LISTINGS`]), never a mix of two; when the old listing is no
//! longer kept and the folder changed meanwhile, it gets ESTALE rather than a wrong listing.

use super::{Child, Namespace, Result};
use nix::errno::Errno;
use std::hash::{Hash, Hasher as _};
use std::sync::Arc;

/// Listings kept for readers still inside them.
pub(super) const LISTINGS: usize = 64;

/// A directory's listing as of one generation.
#[derive(Debug)]
pub struct Listing {
    pub children: Vec<Child>,
    tag: u32,
}

impl Listing {
    fn new(children: Vec<Child>) -> Listing {
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

impl Namespace {
    /// The listing a readdir of `ino` at `offset` reads, and the position it starts at: offset
    /// 0 begins the directory's listing in the current generation; any other offset is a
    /// [`Listing::cookie`] and goes on in the listing it came from.
    pub fn listing_at(&self, ino: u64, offset: u64) -> Result<(Arc<Listing>, u64)> {
        let dir = self.node(ino)?;
        if !dir.ident.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let (tag, position) = ((offset >> 32) as u32, offset & 0xffff_ffff);
        if offset != 0 {
            let kept = self
                .listings
                .lock()
                .expect("listing lock")
                .get(&(ino, tag))
                .cloned();
            if let Some(listing) = kept {
                return Ok((listing, position));
            }
        }
        let listing = Arc::new(Listing::new(self.children(&self.generation(), &dir.ident)?));
        if offset != 0 && listing.tag != tag {
            // A listing of an earlier generation, no longer kept: this folder has changed.
            return Err(Errno::ESTALE);
        }
        self.listings
            .lock()
            .expect("listing lock")
            .put((ino, listing.tag), listing.clone());
        Ok((listing, position))
    }
}

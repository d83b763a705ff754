//! Reads through the namespace: file contents (each blob checked against its digest before its
//! first byte is served), symlink targets, a whole path without the kernel, and the extended
//! attributes that show where a skill comes from, and the listing a readdir reads.

use super::listing::Listing;
use super::{Child, Ident, Namespace, Reach, Result, XATTR_PREFIX};
use crate::generation::{Generation, SkillOrigin};
use cloud_harness_store::cas::{Digest, Kind};
use nix::errno::Errno;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Blobs up to this size are read whole to be checked when first opened (their bytes answer
/// the read that opened them); larger ones are hashed as a stream, not held in memory.
const READ_WHOLE: u64 = 128 << 10;
/// The longest symlink target followed (the kernel's PATH_MAX).
const MAX_TARGET: u64 = 4096;

impl Namespace {
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        match &self.node(ino)?.ident {
            Ident::SkillBlob {
                kind: Kind::Symlink,
                digest,
                ..
            } => self.store.blob(digest).map_err(|e| {
                tracing::error!(object = %digest, error = %e, "cannot read symlink target");
                Errno::EIO
            }),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Reads up to `size` bytes at `offset`. A blob is checked against its digest before its
    /// first byte is served; a corrupt one gives EIO (and a log line naming it), never bytes.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let node = self.node(ino)?;
        match &node.ident {
            Ident::Resolution(_) => {
                let data = node.data.as_deref().unwrap_or_default();
                let start = (offset as usize).min(data.len());
                let end = start.saturating_add(size as usize).min(data.len());
                Ok(data[start..end].to_vec())
            }
            Ident::SkillBlob {
                kind: Kind::File | Kind::Executable,
                digest,
                ..
            } => self.read_blob(digest, node.attr.size, offset, size, Reach::Store),
            Ident::SkillBlob { .. } => Err(Errno::EINVAL),
            _ => Err(Errno::EISDIR),
        }
    }

    /// Up to `size` bytes at `offset` of the blob `digest`, a file of `file_size` bytes.
    fn read_blob(
        &self,
        digest: &Digest,
        file_size: u64,
        offset: u64,
        size: u32,
        reach: Reach,
    ) -> Result<Vec<u8>> {
        let (file, fresh) = self.open_blob(digest, reach)?;
        let want = (size as u64).min(file_size.saturating_sub(offset)) as usize;
        if let Some(mut bytes) = fresh {
            let start = (offset as usize).min(bytes.len());
            let end = start.saturating_add(want).min(bytes.len());
            if start == 0 {
                bytes.truncate(end);
                return Ok(bytes);
            }
            return Ok(bytes[start..end].to_vec());
        }
        let mut buf = vec![0u8; want];
        let mut done = 0;
        while done < want {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!(object = %digest, error = %e, "read failed");
                    return Err(Errno::EIO);
                }
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Reads up to `size` bytes at `offset` of the file at `path` (names below the root, as
    /// the mount shows them) in the current generation, without the kernel: nothing is
    /// remembered. Symlinks are followed inside the mount, as a read through it would.
    /// Returns the file's size and the bytes; `Ok(None)` when there is no such file, EISDIR
    /// for a folder.
    pub fn read_path(
        &self,
        path: &[&str],
        offset: u64,
        size: u32,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        self.read_path_reaching(path, offset, size, Reach::Store)
    }

    /// [`Namespace::read_path`] within `reach`: with [`Reach::Held`], from what the namespace
    /// holds only (trees in memory, blobs open and checked), EWOULDBLOCK when it would have to
    /// read the store. The bytes of an open blob still come by `pread`, from the page cache
    /// when the file was read lately.
    pub fn read_path_reaching(
        &self,
        path: &[&str],
        offset: u64,
        size: u32,
        reach: Reach,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        let g = self.generation();
        let Some(file) = self.find_path(&g, path, reach)? else {
            return Ok(None);
        };
        match &file.ident {
            Ident::SkillBlob { digest, .. } => {
                let bytes = self.read_blob(digest, file.attr.size, offset, size, reach)?;
                Ok(Some((file.attr.size, bytes)))
            }
            Ident::Resolution(_) => {
                let data = g.resolution_json.as_ref();
                let start = (offset as usize).min(data.len());
                let end = start.saturating_add(size as usize).min(data.len());
                Ok(Some((data.len() as u64, data[start..end].to_vec())))
            }
            _ => Err(Errno::EISDIR),
        }
    }

    /// The digest and size of the skill file at `path` (as [`Namespace::read_path`] finds
    /// it, links followed), from the trees alone: the file's bytes are not read. `Ok(None)`
    /// when there is no such skill file (the generated resolution file included), EISDIR for
    /// a folder.
    pub fn stat_path(&self, path: &[&str]) -> Result<Option<(Digest, u64)>> {
        let g = self.generation();
        match self.find_path(&g, path, Reach::Store)? {
            Some(Child {
                ident: Ident::SkillBlob { digest, .. },
                attr,
                ..
            }) => Ok(Some((digest, attr.size))),
            Some(Child {
                ident: Ident::Resolution(_),
                ..
            })
            | None => Ok(None),
            Some(_) => Err(Errno::EISDIR),
        }
    }

    /// The node at `path` in `g`, symlinks followed inside the mount (at most 40, each target
    /// at most a path's length), or `None` when there is none; EISDIR for the root.
    fn find_path(&self, g: &Generation, path: &[&str], reach: Reach) -> Result<Option<Child>> {
        // Names still to walk (last first) and the folders walked so far.
        let mut pending: Vec<String> = path.iter().rev().map(|s| s.to_string()).collect();
        let mut walked: Vec<Child> = Vec::new();
        let mut links = 0;
        while let Some(name) = pending.pop() {
            match name.as_str() {
                "" | "." => continue,
                ".." => {
                    if walked.pop().is_none() {
                        return Ok(None); // above the root
                    }
                    continue;
                }
                _ => {}
            }
            let parent = walked.last().map_or(Ident::Root, |c| c.ident.clone());
            let child = match self.find_child(g, &parent, &name, reach) {
                Ok(Some(child)) => child,
                Ok(None) | Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => return Ok(None),
                Err(e) => return Err(e),
            };
            if let Ident::SkillBlob {
                kind: Kind::Symlink,
                digest,
                ..
            } = &child.ident
            {
                links += 1;
                if links > 40 {
                    return Err(Errno::ELOOP);
                }
                if reach == Reach::Held {
                    return Err(Errno::EWOULDBLOCK); // a link's target is read from the store
                }
                if child.attr.size > MAX_TARGET {
                    return Err(Errno::ENAMETOOLONG);
                }
                let target = self
                    .store
                    .blob_up_to(digest, MAX_TARGET)
                    .map_err(|_| Errno::EIO)?;
                let Ok(target) = String::from_utf8(target) else {
                    return Ok(None);
                };
                if target.starts_with('/') {
                    return Ok(None); // outside the mount
                }
                pending.extend(target.split('/').rev().map(str::to_owned));
                continue;
            }
            walked.push(child);
        }
        match walked.pop() {
            Some(file) => Ok(Some(file)),
            None => Err(Errno::EISDIR),
        }
    }

    /// The open object file of the blob `digest`, checked; with its bytes when this call
    /// just read a small one whole to check it (they answer the read that asked, so a first
    /// read of a small file reads the object once).
    fn open_blob(&self, digest: &Digest, reach: Reach) -> Result<(Arc<File>, Option<Vec<u8>>)> {
        if let Some(f) = super::blobs::get(self.store_key, digest) {
            return Ok((f, None));
        }
        if reach == Reach::Held {
            return Err(Errno::EWOULDBLOCK);
        }
        let (file, fresh) = self
            .store
            .open_blob(digest, READ_WHOLE)
            .map_err(|_| Errno::EIO)?;
        let file = Arc::new(file);
        super::blobs::put(self.store_key, digest, file.clone());
        Ok((file, fresh))
    }

    /// The extended attributes of a node: provenance of skills, the generation at the root.
    pub fn xattrs(&self, ino: u64) -> Result<Vec<(String, String)>> {
        let node = self.node(ino)?;
        let g = self.generation();
        let mut out = Vec::new();
        let mut put = |k: &str, v: String| out.push((format!("{XATTR_PREFIX}{k}"), v));
        match &node.ident {
            Ident::Root | Ident::Resolution(_) | Ident::TiersDir => {
                put("generation", g.digest().to_string())
            }
            Ident::TierDir(t) => put("tier", t.to_string()),
            Ident::SkillDir { view, skill, rel }
            | Ident::SkillBlob {
                view, skill, rel, ..
            } => {
                let origin: &SkillOrigin = g.skill(*view, skill).ok_or(Errno::ENOENT)?;
                put("skill", skill.to_string());
                put("tier", origin.tier.to_string());
                put("source", origin.source.clone());
                if let Some(t) = &origin.provenance.toolkit {
                    put("toolkit", t.clone());
                }
                if let Some(u) = &origin.provenance.url {
                    put("url", u.clone());
                }
                if let Some(c) = &origin.provenance.commit {
                    put("commit", c.clone());
                }
                put("skill-digest", origin.digest.to_string());
                let digest = match &node.ident {
                    Ident::SkillBlob { digest, .. } => *digest,
                    _ => self.skill_tree(&g, *view, skill, rel, Reach::Store)?.1,
                };
                put("digest", digest.to_string());
            }
        }
        Ok(out)
    }
}

/// Listings: what a readdir at an offset reads.
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
            let found = self.listings.lock().expect("listing lock").find(ino, tag);
            if let Some(listing) = found {
                return Ok((listing, position));
            }
        }
        let listing = Arc::new(Listing::new(self.children(&self.generation(), &dir.ident)?));
        if offset != 0 && listing.tag != tag {
            // A listing of an earlier generation, no longer kept: this folder has changed.
            return Err(Errno::ESTALE);
        }
        let kept = self
            .listings
            .lock()
            .expect("listing lock")
            .keep(ino, listing);
        Ok((kept, position))
    }
}

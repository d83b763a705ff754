//! What the file system is made of, whatever the generation: a node's identity (its place,
//! and a file's content), its attributes, the nodes the kernel holds and the children a
//! listing finds.

use crate::generation::View;
use crate::resolver::Tier;
use cloud_harness_store::cas::{Digest, Kind};
use nix::errno::Errno;
use std::hash::{Hash, Hasher as _};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// The inode of the file system's root.
pub const ROOT_INO: u64 = 1;

pub type Result<T> = std::result::Result<T, Errno>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    File,
    Symlink,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    pub size: u64,
    pub perm: u16,
}

/// What a node is, independently of the generation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Ident {
    Root,
    TiersDir,
    TierDir(Tier),
    Resolution(Digest),
    /// A folder of a skill; `rel` is empty for the skill folder itself.
    SkillDir {
        view: View,
        skill: Arc<str>,
        rel: Arc<str>,
    },
    /// A file or symlink of a skill, named by its content too.
    SkillBlob {
        view: View,
        skill: Arc<str>,
        rel: Arc<str>,
        kind: Kind,
        digest: Digest,
    },
}

impl Ident {
    pub(super) fn ino(&self, salt: u64) -> u64 {
        if *self == Ident::Root {
            return ROOT_INO;
        }
        let mut h = std::hash::DefaultHasher::new();
        self.hash(&mut h);
        salt.hash(&mut h);
        // 0 means "no entry" to the kernel and 1 is the root.
        h.finish().max(2)
    }

    pub(super) fn is_dir(&self) -> bool {
        matches!(
            self,
            Ident::Root | Ident::TiersDir | Ident::TierDir(_) | Ident::SkillDir { .. }
        )
    }
}

#[derive(Debug)]
pub(super) struct Node {
    pub(super) ident: Ident,
    pub(super) attr: Attr,
    /// The bytes of a synthetic file (the resolution).
    pub(super) data: Option<Arc<[u8]>>,
    pub(super) lookups: AtomicU64,
}

/// A child found in a directory, not yet known to the kernel.
#[derive(Debug, Clone)]
pub struct Child {
    pub name: String,
    pub attr: Attr,
    pub(super) ident: Ident,
    pub(super) data: Option<Arc<[u8]>>,
}

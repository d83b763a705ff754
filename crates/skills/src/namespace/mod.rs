//! The skills filesystem without the kernel: inodes, lookups, listings, reads and extended
//! attributes over the current generation, as plain functions that return a value or an errno.
//! The FUSE adapter (`fuse.rs`) only translates.
//!
//! ```text
//! /                      the merged view: one folder per winning skill
//! /.tiers/<tier>/        each tier's own view (its sources resolved alone)
//! /.resolution.json      the resolution: winners, shadowed, conflicts, warnings, generation
//! ```
//!
//! This module holds the nodes, lookups and listings; `read` the reads and extended
//! attributes, `swap` what a new generation makes the kernel forget.
//!
//! Inode numbers: a directory's number is a hash of its place (view, skill, path inside the
//! skill), so it is stable across generations; a file's number also covers its content digest,
//! so a file whose content changes gets a new inode and the kernel's cached pages of the old
//! one are never served for the new content. Nodes live while the kernel holds a lookup
//! reference (dropped on forget), so memory follows the kernel's own cache. Directories open
//! without a handle; `listing` says how a reader still keeps the listing it started.

pub mod blobs;
mod listing;
mod node;
mod read;
mod swap;

pub use listing::Listing;
pub use node::{Attr, Child, FileKind, Result, ROOT_INO};
use node::{Ident, Node};

use crate::generation::{Generation, View, ViewMap};
use crate::relpath;
use crate::resolver::Tier;
use cloud_harness_store::cas::{Digest, Kind, Store, Tree};
use lru::LruCache;
use nix::errno::Errno;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

pub const TIERS_DIR: &str = ".tiers";
pub const RESOLUTION_FILE: &str = ".resolution.json";
pub const XATTR_PREFIX: &str = "user.cloud-harness.";

const TREE_CACHE: usize = 4096;

/// Where a read may get what it needs: from the store's files, or only from what the namespace
/// already holds (trees in memory, blobs open and checked). A read on a thread that serves
/// many connections asks for `Held` and gets EWOULDBLOCK instead of waiting on a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Store,
    Held,
}

/// A kernel cache entry to drop after a generation change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// The name `name` in directory `parent` (a positive or negative dentry).
    Entry { parent: u64, name: String },
    /// The attributes and cached listing of a directory.
    Inode { ino: u64 },
}

pub struct Namespace {
    store: Store,
    root_view: View,
    current: RwLock<Arc<Generation>>,
    nodes: RwLock<HashMap<u64, Arc<Node>>>,
    trees: Mutex<LruCache<Digest, Arc<Tree>>>,
    /// Its store, as the process's shared open objects know it ([`blobs`]).
    store_key: blobs::StoreKey,
    /// Listings kept for readers inside them (see `listing`).
    listings: Mutex<listing::Listings>,
}

fn perm_of(kind: Kind) -> u16 {
    kind.mode() as u16
}

fn dir_attr(ino: u64) -> Attr {
    Attr {
        ino,
        kind: FileKind::Directory,
        size: 0,
        perm: perm_of(Kind::Tree),
    }
}

/// Where `ident` lives among `nodes`: its inode when present (`Ok`), else the free number it
/// would take (`Err`). Numbers are hashes of the identity; a collision moves to the next salt,
/// so every search for a node must come through here.
fn slot(nodes: &HashMap<u64, Arc<Node>>, ident: &Ident) -> std::result::Result<u64, u64> {
    let mut salt = 0;
    loop {
        let ino = ident.ino(salt);
        match nodes.get(&ino) {
            Some(n) if n.ident == *ident => return Ok(ino),
            Some(_) => salt += 1,
            None => return Err(ino),
        }
    }
}

impl Namespace {
    /// A namespace whose root shows `root_view`: the merged view with `.tiers/` and the
    /// resolution, or one tier's view alone.
    pub fn new(store: Store, root_view: View, generation: Arc<Generation>) -> Namespace {
        let root = Node {
            ident: Ident::Root,
            attr: dir_attr(ROOT_INO),
            data: None,
            lookups: AtomicU64::new(u64::MAX / 2),
        };
        let cap = |n| NonZeroUsize::new(n).expect("cache sizes are non-zero");
        Namespace {
            store_key: blobs::StoreKey::of(&store),
            store,
            root_view,
            current: RwLock::new(generation),
            nodes: RwLock::new(HashMap::from([(ROOT_INO, Arc::new(root))])),
            trees: Mutex::new(LruCache::new(cap(TREE_CACHE))),
            listings: Mutex::new(listing::Listings::default()),
        }
    }

    pub fn generation(&self) -> Arc<Generation> {
        self.current.read().expect("generation lock").clone()
    }

    /// The view, skill and path inside the skill of the file `ino`, if it is a skill's file.
    pub fn skill_file(&self, ino: u64) -> Option<(View, Arc<str>, Arc<str>)> {
        match &self.node(ino).ok()?.ident {
            Ident::SkillBlob {
                view, skill, rel, ..
            } => Some((*view, skill.clone(), rel.clone())),
            _ => None,
        }
    }

    /// Nodes the kernel holds references to (for tests and memory accounting).
    pub fn node_count(&self) -> usize {
        self.nodes.read().expect("node lock").len()
    }

    fn node(&self, ino: u64) -> Result<Arc<Node>> {
        self.nodes
            .read()
            .expect("node lock")
            .get(&ino)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    /// Records one kernel reference to the child, allocating its inode number. A readdirplus
    /// entry handed to the kernel counts as a lookup too.
    pub fn remember(&self, child: &Child) -> Attr {
        let add_ref = |nodes: &HashMap<u64, Arc<Node>>, ino| {
            let node: &Arc<Node> = &nodes[&ino];
            node.lookups.fetch_add(1, Ordering::Relaxed);
            node.attr
        };
        {
            let nodes = self.nodes.read().expect("node lock");
            if let Ok(ino) = slot(&nodes, &child.ident) {
                return add_ref(&nodes, ino);
            }
        }
        let mut nodes = self.nodes.write().expect("node lock");
        match slot(&nodes, &child.ident) {
            Ok(ino) => add_ref(&nodes, ino),
            Err(ino) => {
                let attr = Attr { ino, ..child.attr };
                nodes.insert(
                    ino,
                    Arc::new(Node {
                        ident: child.ident.clone(),
                        attr,
                        data: child.data.clone(),
                        lookups: AtomicU64::new(1),
                    }),
                );
                attr
            }
        }
    }

    /// The inode of `ident` if the kernel holds it.
    fn known(&self, ident: &Ident) -> Option<u64> {
        slot(&self.nodes.read().expect("node lock"), ident).ok()
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        // Under the write lock no lookup can add a reference meanwhile.
        let mut nodes = self.nodes.write().expect("node lock");
        if let Some(node) = nodes.get(&ino) {
            let left = node.lookups.load(Ordering::Relaxed).saturating_sub(n);
            if left == 0 {
                nodes.remove(&ino);
                // Under the same lock: a lookup and readdir of the folder cannot come between.
                self.listings.lock().expect("listing lock").forget(ino);
            } else {
                node.lookups.store(left, Ordering::Relaxed);
            }
        }
    }

    fn tree(&self, digest: &Digest, reach: Reach) -> Result<Arc<Tree>> {
        if let Some(t) = self.trees.lock().expect("tree cache lock").get(digest) {
            return Ok(t.clone());
        }
        if reach == Reach::Held {
            return Err(Errno::EWOULDBLOCK);
        }
        let tree = Arc::new(self.store.tree(digest).map_err(|e| {
            tracing::error!(object = %digest, error = %e, "cannot read tree");
            Errno::EIO
        })?);
        self.trees
            .lock()
            .expect("tree cache lock")
            .put(*digest, tree.clone());
        Ok(tree)
    }

    /// The current tree of a skill folder, and its digest.
    fn skill_tree(
        &self,
        g: &Generation,
        view: View,
        skill: &str,
        rel: &str,
        reach: Reach,
    ) -> Result<(Arc<Tree>, Digest)> {
        let origin = g.skill(view, skill).ok_or(Errno::ENOENT)?;
        let mut digest = origin.digest;
        let mut tree = self.tree(&digest, reach)?;
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            let entry = tree
                .get(part)
                .filter(|e| e.kind == Kind::Tree)
                .ok_or(Errno::ENOENT)?;
            digest = entry.digest;
            tree = self.tree(&digest, reach)?;
        }
        Ok((tree, digest))
    }

    fn skill_child(view: View, skill: &str) -> Child {
        let ident = Ident::SkillDir {
            view,
            skill: skill.into(),
            rel: "".into(),
        };
        Child {
            name: skill.to_owned(),
            attr: dir_attr(ident.ino(0)),
            ident,
            data: None,
        }
    }

    fn resolution_child(g: &Generation) -> Child {
        let ident = Ident::Resolution(g.resolution_digest);
        Child {
            name: RESOLUTION_FILE.to_owned(),
            attr: Attr {
                ino: ident.ino(0),
                kind: FileKind::File,
                size: g.resolution_json.len() as u64,
                perm: 0o444,
            },
            ident,
            data: Some(g.resolution_json.clone()),
        }
    }

    fn tiers_child() -> Child {
        Child {
            name: TIERS_DIR.to_owned(),
            attr: dir_attr(Ident::TiersDir.ino(0)),
            ident: Ident::TiersDir,
            data: None,
        }
    }

    fn tier_child(tier: Tier) -> Child {
        let ident = Ident::TierDir(tier);
        Child {
            name: tier.as_str().to_owned(),
            attr: dir_attr(ident.ino(0)),
            ident,
            data: None,
        }
    }

    fn tree_child(
        view: View,
        skill: &Arc<str>,
        rel: &str,
        entry: &cloud_harness_store::cas::Entry,
    ) -> Child {
        let rel = relpath::join(rel, &entry.name).into();
        let (ident, attr) = if entry.kind == Kind::Tree {
            let ident = Ident::SkillDir {
                view,
                skill: skill.clone(),
                rel,
            };
            (ident.clone(), dir_attr(ident.ino(0)))
        } else {
            let ident = Ident::SkillBlob {
                view,
                skill: skill.clone(),
                rel,
                kind: entry.kind,
                digest: entry.digest,
            };
            let kind = if entry.kind == Kind::Symlink {
                FileKind::Symlink
            } else {
                FileKind::File
            };
            let attr = Attr {
                ino: ident.ino(0),
                kind,
                size: entry.size,
                perm: perm_of(entry.kind),
            };
            (ident, attr)
        };
        Child {
            name: entry.name.clone(),
            attr,
            ident,
            data: None,
        }
    }

    fn root_is_merged(&self) -> bool {
        self.root_view == View::Merged
    }

    /// The child `name` of the directory `parent`, in generation `g`.
    fn find_child(
        &self,
        g: &Generation,
        parent: &Ident,
        name: &str,
        reach: Reach,
    ) -> Result<Option<Child>> {
        Ok(match parent {
            Ident::Root => {
                if self.root_is_merged() && name == TIERS_DIR {
                    Some(Self::tiers_child())
                } else if self.root_is_merged() && name == RESOLUTION_FILE {
                    Some(Self::resolution_child(g))
                } else {
                    g.skill(self.root_view, name)
                        .map(|_| Self::skill_child(self.root_view, name))
                }
            }
            Ident::TiersDir => g.tiers().find(|t| t.as_str() == name).map(Self::tier_child),
            Ident::TierDir(t) => g
                .skill(View::Tier(*t), name)
                .map(|_| Self::skill_child(View::Tier(*t), name)),
            Ident::SkillDir { view, skill, rel } => {
                let (tree, _) = self.skill_tree(g, *view, skill, rel, reach)?;
                tree.get(name)
                    .map(|e| Self::tree_child(*view, skill, rel, e))
            }
            Ident::Resolution(_) | Ident::SkillBlob { .. } => return Err(Errno::ENOTDIR),
        })
    }

    fn view_children(view: View, map: &ViewMap) -> impl Iterator<Item = Child> + '_ {
        map.keys().map(move |name| Self::skill_child(view, name))
    }

    /// Every child of `parent` in generation `g`, in listing order.
    fn children(&self, g: &Generation, parent: &Ident) -> Result<Vec<Child>> {
        Ok(match parent {
            Ident::Root => {
                let mut out = Vec::new();
                if self.root_is_merged() {
                    out.push(Self::resolution_child(g));
                    out.push(Self::tiers_child());
                }
                out.extend(Self::view_children(self.root_view, g.view(self.root_view)));
                out
            }
            Ident::TiersDir => g.tiers().map(Self::tier_child).collect(),
            Ident::TierDir(t) => {
                Self::view_children(View::Tier(*t), g.view(View::Tier(*t))).collect()
            }
            Ident::SkillDir { view, skill, rel } => {
                let (tree, _) = self.skill_tree(g, *view, skill, rel, Reach::Store)?;
                tree.entries()
                    .iter()
                    .map(|e| Self::tree_child(*view, skill, rel, e))
                    .collect()
            }
            Ident::Resolution(_) | Ident::SkillBlob { .. } => return Err(Errno::ENOTDIR),
        })
    }

    /// Looks `name` up in `parent`. `Ok(None)` is a negative entry the kernel may cache.
    pub fn lookup(&self, parent: u64, name: &str) -> Result<Option<Attr>> {
        let dir = self.node(parent)?;
        if !dir.ident.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let g = self.generation();
        match self.find_child(&g, &dir.ident, name, Reach::Store) {
            Ok(Some(child)) => Ok(Some(self.remember(&child))),
            Ok(None) => Ok(None),
            // The directory itself is gone in this generation: nothing below it exists.
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(self.node(ino)?.attr)
    }
}

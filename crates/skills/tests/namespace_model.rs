//! A reference model of generation swaps: random sequences of generations, walked, listed and
//! forgotten through a simulated kernel cache (positive and negative entries with their
//! attributes, cached listings, open directory handles). After the invalidations each swap
//! sends are applied to that cache, every answer it still holds must equal a fresh one: the
//! kernel never serves a stale name, attribute or listing.

use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::generation::Generation;
use cloud_harness_skills::namespace::{Attr, FileKind, Invalidation, Namespace, ROOT_INO};
use cloud_harness_skills::resolver::Tier;
use cloud_harness_skills::stack::StackSpec;
use cloud_harness_store::cas::Store;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;
use std::sync::Arc;

const SKILLS: [&str; 3] = ["a", "b", "c"];
/// Every name a walk may try: the mount's own, the tiers, the skills, their files, and one
/// that never exists.
const NAMES: [&str; 14] = [
    ".tiers",
    ".resolution.json",
    "owner",
    "workspace",
    "builtin",
    "a",
    "b",
    "c",
    "SKILL.md",
    "refs",
    "n.md",
    "t.md",
    "deep",
    "zz",
];

/// One skill folder: its SKILL.md body, an optional `refs/n.md` (with `refs/deep/n.md`), an
/// optional `t.md`.
#[derive(Debug, Clone)]
struct SkillSpec {
    body: u8,
    refs: Option<u8>,
    top: Option<u8>,
}

/// One generation: three folders (owner, and two of the workspace tier, which can conflict),
/// each holding some of the skills.
type GenSpec = [Vec<(usize, SkillSpec)>; 3];

#[derive(Debug, Clone)]
enum Op {
    Swap(GenSpec),
    /// Walks a path from the root, name by name, as the kernel resolves it.
    Walk(Vec<usize>),
    /// Lists the directory a path ends at (readdirplus: the children's entries are cached).
    List(Vec<usize>, bool),
    /// Opens the directory a path ends at and keeps the handle.
    Open(Vec<usize>),
    /// The kernel evicts one cached entry that has none below it.
    Evict(usize),
}

fn skill_spec() -> impl Strategy<Value = SkillSpec> {
    (
        0u8..2,
        proptest::option::of(0u8..2),
        proptest::option::of(0u8..2),
    )
        .prop_map(|(body, refs, top)| SkillSpec { body, refs, top })
}

fn folder() -> impl Strategy<Value = Vec<(usize, SkillSpec)>> {
    proptest::collection::btree_map(0..SKILLS.len(), skill_spec(), 0..=SKILLS.len())
        .prop_map(|m| m.into_iter().collect())
}

fn op() -> impl Strategy<Value = Op> {
    let path = || proptest::collection::vec(0..NAMES.len(), 0..5);
    prop_oneof![
        2 => [folder(), folder(), folder()].prop_map(Op::Swap),
        4 => path().prop_map(Op::Walk),
        2 => (path(), any::<bool>()).prop_map(|(p, plus)| Op::List(p, plus)),
        1 => path().prop_map(Op::Open),
        1 => any::<usize>().prop_map(Op::Evict),
    ]
}

fn write_folder(dir: &Path, skills: &[(usize, SkillSpec)]) {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).unwrap();
    for (i, s) in skills {
        let name = SKILLS[*i];
        let d = dir.join(name);
        fs::create_dir_all(&d).unwrap();
        let md = format!("---\nname: {name}\ndescription: d\n---\nbody {}\n", s.body);
        fs::write(d.join("SKILL.md"), md).unwrap();
        if let Some(r) = s.refs {
            fs::create_dir_all(d.join("refs/deep")).unwrap();
            fs::write(d.join("refs/n.md"), format!("refs {r}")).unwrap();
            fs::write(d.join("refs/deep/n.md"), format!("deep {r}")).unwrap();
        }
        if let Some(t) = s.top {
            fs::write(d.join("t.md"), "t".repeat(usize::from(t) + 1)).unwrap();
        }
    }
}

/// A listing as readers see it: names and inode numbers.
type Names = Vec<(String, u64)>;

/// What the kernel holds.
#[derive(Default)]
struct Kernel {
    /// `(parent, name)` → the entry's attributes, or a negative entry.
    entries: HashMap<(u64, String), Option<Attr>>,
    /// Lookup references the kernel holds per inode (each positive entry made one or more).
    refs: HashMap<u64, u64>,
    /// Cached listings (the mount opens directories with `FOPEN_CACHE_DIR`).
    listings: HashMap<u64, Vec<(String, u64)>>,
    /// Readers inside a listing: the directory, the offset they go on at, and the listing
    /// they started.
    handles: Vec<(u64, u64, Names)>,
    /// References the kernel cannot drop yet: an open directory keeps its inode, so its
    /// forget waits until the reader closes it.
    deferred: HashMap<u64, u64>,
}

/// The listing a reader of `dir` gets at `offset`.
fn listing_of(ns: &Namespace, dir: u64, offset: u64) -> Vec<(String, u64, Attr)> {
    let (listing, _) = ns.listing_at(dir, offset).unwrap();
    listing
        .children
        .iter()
        .map(|c| (c.name.clone(), c.attr.ino, c.attr))
        .collect()
}

impl Kernel {
    /// The entry `name` in `parent`, from the cache or by a lookup.
    fn lookup(&mut self, ns: &Namespace, parent: u64, name: &str) -> Option<Attr> {
        let key = (parent, name.to_owned());
        if let Some(cached) = self.entries.get(&key) {
            return *cached;
        }
        let found = ns.lookup(parent, name).unwrap();
        if let Some(attr) = found {
            *self.refs.entry(attr.ino).or_default() += 1;
        }
        self.entries.insert(key, found);
        found
    }

    /// Walks `path` from the root; the directory it ends at, if it is one.
    fn walk(&mut self, ns: &Namespace, path: &[usize]) -> Option<u64> {
        let mut dir = ROOT_INO;
        for &i in path {
            let attr = self.lookup(ns, dir, NAMES[i])?;
            if attr.kind != FileKind::Directory {
                return None;
            }
            dir = attr.ino;
        }
        Some(dir)
    }

    fn list(&mut self, ns: &Namespace, dir: u64, plus: bool) {
        if self.listings.contains_key(&dir) && !plus {
            return;
        }
        let children = listing_of(ns, dir, 0);
        let (listing, _) = ns.listing_at(dir, 0).unwrap();
        if plus {
            // Every entry counts as a lookup, cached or not (as the kernel counts it).
            for child in &listing.children {
                let key = (dir, child.name.clone());
                let attr = ns.remember(child);
                if self.entries.get(&key) != Some(&Some(attr)) {
                    self.drop_entry(ns, &key);
                    self.entries.insert(key, Some(attr));
                }
                *self.refs.entry(attr.ino).or_default() += 1;
            }
        }
        let names = children.into_iter().map(|(n, ino, _)| (n, ino)).collect();
        self.listings.entry(dir).or_insert(names);
    }

    /// A reader that has read "." and "..", and goes on later.
    fn open(&mut self, ns: &Namespace, dir: u64) {
        let (listing, _) = ns.listing_at(dir, 0).unwrap();
        let names = listing
            .children
            .iter()
            .map(|c| (c.name.clone(), c.attr.ino))
            .collect();
        self.handles.push((dir, listing.cookie(2), names));
    }

    /// Drops the entry `key` and, as the kernel's dentry cache does, everything under it; the
    /// inodes left without an entry are forgotten.
    fn drop_entry(&mut self, ns: &Namespace, key: &(u64, String)) {
        let Some(Some(attr)) = self.entries.remove(key) else {
            return;
        };
        let below: Vec<(u64, String)> = self
            .entries
            .keys()
            .filter(|(p, _)| *p == attr.ino)
            .cloned()
            .collect();
        for k in below {
            self.drop_entry(ns, &k);
        }
        self.listings.remove(&attr.ino);
        if let Some(n) = self.refs.remove(&attr.ino) {
            if self.handles.iter().any(|(dir, _, _)| *dir == attr.ino) {
                *self.deferred.entry(attr.ino).or_default() += n;
            } else {
                ns.forget(attr.ino, n);
            }
        }
    }

    fn apply(&mut self, ns: &Namespace, invalidations: &[Invalidation]) {
        for inv in invalidations {
            match inv {
                Invalidation::Entry { parent, name } => {
                    let key = (*parent, name.clone());
                    self.drop_entry(ns, &key);
                    self.entries.remove(&key);
                }
                Invalidation::Inode { ino } => {
                    self.listings.remove(ino);
                }
            }
        }
    }

    fn evict(&mut self, ns: &Namespace, pick: usize) {
        let parents: HashSet<u64> = self.entries.keys().map(|(p, _)| *p).collect();
        let mut leaves: Vec<(u64, String)> = self
            .entries
            .iter()
            .filter(|(_, v)| v.is_none_or(|a| !parents.contains(&a.ino)))
            .map(|(k, _)| k.clone())
            .collect();
        leaves.sort();
        if leaves.is_empty() {
            return;
        }
        let key = leaves[pick % leaves.len()].clone();
        self.drop_entry(ns, &key);
        self.entries.remove(&key);
    }

    /// Every answer the kernel would still give from its cache equals a fresh one.
    fn check(&self, ns: &Namespace) -> std::result::Result<(), TestCaseError> {
        let mut reachable = vec![ROOT_INO];
        let mut i = 0;
        while i < reachable.len() {
            let dir = reachable[i];
            i += 1;
            let mut here: Vec<_> = self
                .entries
                .iter()
                .filter(|((p, _), _)| *p == dir)
                .collect();
            here.sort_by(|a, b| a.0.cmp(b.0));
            for ((parent, name), cached) in here {
                let fresh = ns.lookup(*parent, name).unwrap();
                if let Some(a) = fresh {
                    ns.forget(a.ino, 1);
                }
                prop_assert_eq!(fresh, *cached, "stale entry {:?} in {}", name, parent);
                if let Some(a) = cached.filter(|a| a.kind == FileKind::Directory) {
                    reachable.push(a.ino);
                }
            }
            if let Some(cached) = self.listings.get(&dir) {
                let fresh: Vec<(String, u64)> = listing_of(ns, dir, 0)
                    .into_iter()
                    .map(|(n, ino, _)| (n, ino))
                    .collect();
                prop_assert_eq!(&fresh, cached, "stale listing of {}", dir);
            }
        }
        for (dir, offset, names) in &self.handles {
            let now: Vec<(String, u64)> = listing_of(ns, *dir, *offset)
                .into_iter()
                .map(|(n, ino, _)| (n, ino))
                .collect();
            prop_assert_eq!(&now, names, "an open handle changed its listing");
        }
        Ok(())
    }
}

struct World {
    tmp: tempfile::TempDir,
    store: Store,
    spec: StackSpec,
}

impl World {
    fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path().join("store")).unwrap();
        let dirs = ["owner", "ws1", "ws2"].map(|d| tmp.path().join(d));
        let spec = StackSpec {
            dirs: vec![
                (Tier::Owner, dirs[0].clone()),
                (Tier::Workspace, dirs[1].clone()),
                (Tier::Workspace, dirs[2].clone()),
            ],
            ..StackSpec::default()
        };
        World { tmp, store, spec }
    }

    fn generation(&self, g: &GenSpec) -> Arc<Generation> {
        for (d, skills) in ["owner", "ws1", "ws2"].iter().zip(g) {
            write_folder(&self.tmp.path().join(d), skills);
        }
        Arc::new(
            self.spec
                .generation(&self.store, &SkillCache::default())
                .unwrap(),
        )
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_cached_answer_equals_a_fresh_lookup_after_each_swap(
        first in [folder(), folder(), folder()],
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let w = World::new();
        let ns = Namespace::new(w.store.clone(), cloud_harness_skills::generation::View::Merged, w.generation(&first));
        let mut kernel = Kernel::default();
        for op in &ops {
            match op {
                Op::Swap(g) => {
                    let next = w.generation(g);
                    let invalidations = ns.set_generation(next);
                    kernel.apply(&ns, &invalidations);
                    kernel.check(&ns)?;
                }
                Op::Walk(path) => {
                    kernel.walk(&ns, path);
                }
                Op::List(path, plus) => {
                    if let Some(dir) = kernel.walk(&ns, path) {
                        kernel.list(&ns, dir, *plus);
                    }
                }
                Op::Open(path) => {
                    if let Some(dir) = kernel.walk(&ns, path) {
                        kernel.open(&ns, dir);
                    }
                }
                Op::Evict(pick) => kernel.evict(&ns, *pick),
            }
        }
        kernel.check(&ns)?;
        // With every entry evicted, the namespace holds nothing the kernel does not.
        kernel.handles.clear();
        for (ino, n) in std::mem::take(&mut kernel.deferred) {
            ns.forget(ino, n);
        }
        while !kernel.entries.is_empty() {
            kernel.evict(&ns, 0);
        }
        prop_assert_eq!(ns.node_count(), 1, "nodes left without a kernel reference");
    }
}

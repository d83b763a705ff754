//! Links inside a served skill. A skill folder is served at the top of a view (the merged
//! root of a mount, a bundle, a tier's folder), beside its siblings, wherever it sat in its
//! source. A link in it may lead within the skill or to a sibling (`../other/…`); one that
//! leads above the view's root — an absolute target, too many `..`, or a chain of links that
//! adds up to that — would let whoever follows it on the host out of the mount. Such links
//! are dropped from the skill, each named in a warning; the skill keeps everything else.

use cloud_harness_error::Result;
use cloud_harness_store::cas::{Digest, Kind, Store, Tree, WalkBudget, Writer};
use std::collections::{BTreeSet, HashMap};

/// How many links one resolution may pass through (the kernel's own limit).
const MAX_HOPS: usize = 40;

/// The skill tree `skill` (served as the folder `name`) without the links that leave the
/// view, and the paths (within the skill) of the links dropped. Unchanged, it is `skill`.
/// The folders listed, by path, count against `budget`.
pub fn contain(
    store: &Store,
    skill: &Digest,
    name: &str,
    budget: &mut WalkBudget,
) -> Result<(Digest, Vec<String>)> {
    let root = budget.tree(store, skill)?;
    let mut links = Vec::new();
    collect(store, &root, &mut Vec::new(), &mut links, budget)?;
    let mut dropped = BTreeSet::new();
    let mut trees = Trees {
        store,
        read: HashMap::new(),
        budget,
    };
    for (path, target) in &links {
        let mut hops = 0;
        let start: Vec<String> = std::iter::once(name.to_owned())
            .chain(path[..path.len() - 1].iter().cloned())
            .collect();
        if resolve(&mut trees, &root, name, start, target, &mut hops)?.is_none() {
            dropped.insert(path.join("/"));
        }
    }
    if dropped.is_empty() {
        return Ok((*skill, Vec::new()));
    }
    let mut writer = store.writer()?;
    let digest = without(store, &mut writer, &root, "", &dropped)?;
    writer.commit()?;
    Ok((digest, dropped.into_iter().collect()))
}

/// Every link of the tree with its path (components) and target.
fn collect(
    store: &Store,
    tree: &Tree,
    at: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Vec<u8>)>,
    budget: &mut WalkBudget,
) -> Result<()> {
    for entry in tree.entries() {
        at.push(entry.name.clone());
        match entry.kind {
            Kind::Tree => {
                let sub = budget.tree(store, &entry.digest)?;
                collect(store, &sub, at, out, budget)?
            }
            Kind::Symlink => out.push((at.clone(), link_target(store, entry)?)),
            _ => {}
        }
        at.pop();
    }
    Ok(())
}

/// A link's target, as the kernel would take it: one longer than a path may be leads
/// nowhere (ENAMETOOLONG), and is not read.
fn link_target(store: &Store, entry: &cloud_harness_store::cas::Entry) -> Result<Vec<u8>> {
    if entry.size > MAX_TARGET {
        return Ok(Vec::new());
    }
    store.blob_up_to(&entry.digest, MAX_TARGET)
}

/// The longest link target followed (the kernel's PATH_MAX).
const MAX_TARGET: u64 = 4096;

/// The skill's folders as the resolution of its links reads them: each read once, counted
/// against the walk's budget.
struct Trees<'a> {
    store: &'a Store,
    read: HashMap<Digest, Tree>,
    budget: &'a mut WalkBudget,
}

impl Trees<'_> {
    fn load(&mut self, digest: &Digest) -> Result<()> {
        if !self.read.contains_key(digest) {
            let tree = self.budget.tree(self.store, digest)?;
            self.read.insert(*digest, tree);
        }
        Ok(())
    }
}

/// The entry at `path` within the skill, if any.
fn entry_at(
    trees: &mut Trees,
    root: &Tree,
    path: &[String],
) -> Result<Option<cloud_harness_store::cas::Entry>> {
    let mut folder: Option<Digest> = None;
    for (i, part) in path.iter().enumerate() {
        let tree = match folder {
            None => root,
            Some(digest) => {
                trees.load(&digest)?;
                &trees.read[&digest]
            }
        };
        let Some(entry) = tree.get(part).cloned() else {
            return Ok(None);
        };
        if i + 1 == path.len() {
            return Ok(Some(entry));
        }
        if entry.kind != Kind::Tree {
            return Ok(None);
        }
        folder = Some(entry.digest);
    }
    Ok(None)
}

/// Where `target`, read at `pos` (a path from the view's root: `[name, folder…]`), leads, or
/// `None` if it leaves the root. Links met inside the skill are followed (a chain adds up);
/// a step into a sibling cannot be followed further here, but its `..` still counts.
fn resolve(
    trees: &mut Trees,
    root: &Tree,
    name: &str,
    mut pos: Vec<String>,
    target: &[u8],
    hops: &mut usize,
) -> Result<Option<Vec<String>>> {
    let Ok(target) = std::str::from_utf8(target) else {
        return Ok(None);
    };
    if target.starts_with('/') || target.is_empty() {
        return Ok(None);
    }
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if pos.pop().is_none() {
                    return Ok(None);
                }
            }
            step => {
                pos.push(step.to_owned());
                if pos[0] != name {
                    continue;
                }
                let Some(entry) = entry_at(trees, root, &pos[1..])? else {
                    continue;
                };
                if entry.kind == Kind::Symlink {
                    *hops += 1;
                    if *hops > MAX_HOPS {
                        // The kernel refuses such a chain (ELOOP) before it leads anywhere.
                        return Ok(Some(pos));
                    }
                    let next = link_target(trees.store, &entry)?;
                    pos.pop();
                    match resolve(trees, root, name, pos, &next, hops)? {
                        Some(there) => pos = there,
                        None => return Ok(None),
                    }
                }
            }
        }
    }
    Ok(Some(pos))
}

/// `tree` without the entries named (by their paths from the skill's top) in `dropped`.
fn without(
    store: &Store,
    writer: &mut Writer<'_>,
    tree: &Tree,
    prefix: &str,
    dropped: &BTreeSet<String>,
) -> Result<Digest> {
    let mut entries = Vec::new();
    for entry in tree.entries() {
        let path = if prefix.is_empty() {
            entry.name.clone()
        } else {
            format!("{prefix}/{}", entry.name)
        };
        if dropped.contains(&path) {
            continue;
        }
        let mut entry = entry.clone();
        let inside = format!("{path}/");
        let holds_dropped = dropped
            .range(inside.clone()..)
            .next()
            .is_some_and(|d| d.starts_with(&inside));
        if entry.kind == Kind::Tree && holds_dropped {
            entry.digest = without(store, writer, &store.tree(&entry.digest)?, &path, dropped)?;
        }
        entries.push(entry);
    }
    writer.put_tree(&Tree::new(entries)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_harness_store::cas::Entry;

    fn link(w: &mut Writer<'_>, name: &str, target: &str) -> Entry {
        let digest = w.put_blob(target.as_bytes()).unwrap();
        Entry {
            name: name.into(),
            kind: Kind::Symlink,
            size: target.len() as u64,
            digest,
        }
    }

    fn file(w: &mut Writer<'_>, name: &str) -> Entry {
        let digest = w.put_blob(b"text").unwrap();
        Entry {
            name: name.into(),
            kind: Kind::File,
            size: 4,
            digest,
        }
    }

    #[test]
    fn links_that_leave_the_view_are_dropped_and_the_rest_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path().join("store")).unwrap();
        let mut w = store.writer().unwrap();
        let sub_entries = vec![
            file(&mut w, "notes.md"),
            link(&mut w, "up", ".."),
            link(&mut w, "to-sibling", "../../b/SKILL.md"),
            link(&mut w, "escape", "../../../README.md"),
            link(&mut w, "chain", "up/../../.."),
        ];
        let sub = w.put_tree(&Tree::new(sub_entries).unwrap()).unwrap();
        let top = vec![
            file(&mut w, "SKILL.md"),
            link(&mut w, "abs", "/etc/passwd"),
            link(&mut w, "self", "SKILL.md"),
            link(&mut w, "loop", "loop"),
            Entry {
                name: "refs".into(),
                kind: Kind::Tree,
                size: 0,
                digest: sub,
            },
        ];
        let skill = w.put_tree(&Tree::new(top).unwrap()).unwrap();
        w.commit().unwrap();
        let (kept, dropped) = contain(&store, &skill, "a", &mut WalkBudget::default()).unwrap();
        assert_eq!(dropped, ["abs", "refs/chain", "refs/escape"]);
        let tree = store.tree(&kept).unwrap();
        assert!(tree.get("self").is_some() && tree.get("abs").is_none());
        // A loop leads nowhere (the kernel says ELOOP): harmless, kept.
        assert!(tree.get("loop").is_some());
        let refs = store.tree(&tree.get("refs").unwrap().digest).unwrap();
        let names: Vec<&str> = refs.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["notes.md", "to-sibling", "up"]);
        // A clean skill is left as it is.
        let (same, none) = contain(&store, &kept, "a", &mut WalkBudget::default()).unwrap();
        assert_eq!((same, none.len()), (kept, 0));
    }
}

//! Links inside a served skill. A skill folder is served at the top of a view (the merged
//! root of a mount, a bundle, a tier's folder), beside its siblings, wherever it sat in its
//! source. A link in it may lead within the skill or to a sibling (`../other/…`); one that
//! leads above the view's root — an absolute target, too many `..`, or a chain of links that
//! adds up to that — would let whoever follows it on the host out of the mount. Such links
//! are dropped from the skill, each named in a warning; the skill keeps everything else.

use crate::cas::{Digest, Kind, Store, Tree, Writer};
use crate::error::Result;
use std::collections::BTreeSet;

/// How many links one resolution may pass through (the kernel's own limit).
const MAX_HOPS: usize = 40;

/// The skill tree `skill` (served as the folder `name`) without the links that leave the
/// view, and the paths (within the skill) of the links dropped. Unchanged, it is `skill`.
pub fn contain(store: &Store, skill: &Digest, name: &str) -> Result<(Digest, Vec<String>)> {
    let root = store.tree(skill)?;
    let mut links = Vec::new();
    collect(store, &root, &mut Vec::new(), &mut links)?;
    let mut dropped = BTreeSet::new();
    for (path, target) in &links {
        let mut hops = 0;
        let start: Vec<String> = std::iter::once(name.to_owned())
            .chain(path[..path.len() - 1].iter().cloned())
            .collect();
        if resolve(store, &root, name, start, target, &mut hops)?.is_none() {
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
) -> Result<()> {
    for entry in tree.entries() {
        at.push(entry.name.clone());
        match entry.kind {
            Kind::Tree => collect(store, &store.tree(&entry.digest)?, at, out)?,
            Kind::Symlink => out.push((at.clone(), store.blob(&entry.digest)?)),
            _ => {}
        }
        at.pop();
    }
    Ok(())
}

/// The entry at `path` within the skill, if any.
fn entry_at(store: &Store, root: &Tree, path: &[String]) -> Result<Option<crate::cas::Entry>> {
    let mut tree = root.clone();
    for (i, part) in path.iter().enumerate() {
        let Some(entry) = tree.get(part).cloned() else {
            return Ok(None);
        };
        if i + 1 == path.len() {
            return Ok(Some(entry));
        }
        if entry.kind != Kind::Tree {
            return Ok(None);
        }
        tree = store.tree(&entry.digest)?;
    }
    Ok(None)
}

/// Where `target`, read at `pos` (a path from the view's root: `[name, folder…]`), leads, or
/// `None` if it leaves the root. Links met inside the skill are followed (a chain adds up);
/// a step into a sibling cannot be followed further here, but its `..` still counts.
fn resolve(
    store: &Store,
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
                let Some(entry) = entry_at(store, root, &pos[1..])? else {
                    continue;
                };
                if entry.kind == Kind::Symlink {
                    *hops += 1;
                    if *hops > MAX_HOPS {
                        // The kernel refuses such a chain (ELOOP) before it leads anywhere.
                        return Ok(Some(pos));
                    }
                    let next = store.blob(&entry.digest)?;
                    pos.pop();
                    match resolve(store, root, name, pos, &next, hops)? {
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
        if entry.kind == Kind::Tree && dropped.iter().any(|d| d.starts_with(&format!("{path}/"))) {
            entry.digest = without(store, writer, &store.tree(&entry.digest)?, &path, dropped)?;
        }
        entries.push(entry);
    }
    writer.put_tree(&Tree::new(entries)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cas::Entry;

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
        let (kept, dropped) = contain(&store, &skill, "a").unwrap();
        assert_eq!(dropped, ["abs", "refs/chain", "refs/escape"]);
        let tree = store.tree(&kept).unwrap();
        assert!(tree.get("self").is_some() && tree.get("abs").is_none());
        // A loop leads nowhere (the kernel says ELOOP): harmless, kept.
        assert!(tree.get("loop").is_some());
        let refs = store.tree(&tree.get("refs").unwrap().digest).unwrap();
        let names: Vec<&str> = refs.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["notes.md", "to-sibling", "up"]);
        // A clean skill is left as it is.
        let (same, none) = contain(&store, &kept, "a").unwrap();
        assert_eq!((same, none.len()), (kept, 0));
    }
}

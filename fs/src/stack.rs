//! The tier stack: turning trees in the store and directories on disk into resolver sources.
//!
//! A directory is snapshotted into the store first, so every generation is served from
//! immutable, verified objects; unchanged files cost a hash and no write.

use crate::cas::{Digest, Limits, Store};
use crate::discovery::{discover, Layout, SkillCache};
use crate::error::{Error, Result};
use crate::resolver::{Provenance, Source, Tier};
use std::path::{Path, PathBuf};

/// The folders of a project that hold its own skills (the repository tier), in order.
pub const REPOSITORY_SKILL_DIRS: [&str; 2] = [".agents/skills", ".claude/skills"];

/// A source from a tree already in the store (a bundle, the built-in tier).
pub fn tree_source(
    store: &Store,
    cache: &SkillCache,
    id: String,
    tier: Tier,
    provenance: Provenance,
    tree: Digest,
    layout: &Layout,
) -> Result<Source> {
    let discovery = discover(store, &tree, layout, cache)?;
    Ok(Source {
        id,
        tier,
        provenance,
        tree,
        discovery,
    })
}

/// A source from a folder of skills on disk, found anywhere below it. Its id is
/// `<tier>:<absolute path>`.
pub fn dir_source(store: &Store, cache: &SkillCache, tier: Tier, dir: &Path) -> Result<Source> {
    let abs = absolute(dir)?;
    let imported = store.import_dir(&abs, &Limits::default())?;
    let path = abs.to_string_lossy().into_owned();
    tree_source(
        store,
        cache,
        format!("{tier}:{path}"),
        tier,
        Provenance {
            path: Some(path),
            ..Provenance::default()
        },
        imported.digest,
        &Layout::folder(),
    )
}

/// The repository tier of the project at `root`: one source for each of its skill folders
/// that exists.
pub fn repository_sources(store: &Store, cache: &SkillCache, root: &Path) -> Result<Vec<Source>> {
    let root = absolute(root)?;
    if !root.is_dir() {
        return Err(Error::invalid(format!(
            "{} is not a project directory",
            root.display()
        )));
    }
    let mut out = Vec::new();
    for sub in REPOSITORY_SKILL_DIRS {
        let dir = root.join(sub);
        if dir.is_dir() {
            out.push(dir_source(store, cache, Tier::Repository, &dir)?);
        }
    }
    Ok(out)
}

fn absolute(dir: &Path) -> Result<PathBuf> {
    // canonicalize: the source id names the real folder, and a folder reached through a
    // symlink (a common repository-root shape) is read where it really is.
    dir.canonicalize().map_err(|e| Error::io(dir, e))
}

//! What a workspace serves stays in the store: every source tree of its current generation
//! (the built-in tier, toolkit bundles, snapshots of its live folders) is a garbage-collection
//! root, `workspaces/<id>/<n>`, from the moment it is served until the workspace closes.

use cloud_harness_error::Result;
use cloud_harness_skills::generation::Generation;
use cloud_harness_store::cas::Store;

fn prefix(id: &str) -> String {
    format!("workspaces/{id}/")
}

/// Roots the sources of `generation`, and drops the roots of sources it no longer has.
pub fn pin(store: &Store, id: &str, generation: &Generation) -> Result<()> {
    let sources = &generation.index.sources;
    for (n, source) in sources.iter().enumerate() {
        store.set_root(&format!("{}{n}", prefix(id)), &source.tree)?;
    }
    for (name, _) in store.roots()? {
        let stale = name
            .strip_prefix(&prefix(id))
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n >= sources.len());
        if stale {
            store.remove_root(&name)?;
        }
    }
    Ok(())
}

/// Drops every root of the workspace (it is closing).
pub(crate) fn unpin(store: &Store, id: &str) -> Result<()> {
    for (name, _) in store.roots()? {
        if name.starts_with(&prefix(id)) {
            store.remove_root(&name)?;
        }
    }
    Ok(())
}

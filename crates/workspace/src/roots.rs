//! What a workspace serves stays in the store: every source tree of its current generation
//! (the built-in tier, toolkit bundles, snapshots of its live folders) is a garbage-collection
//! root, `workspaces/<id>/<n>`, from the moment it is served until the workspace closes.
//! A workspace reads only its own folder of roots: an open, a generation and a close cost
//! the same with a thousand other workspaces open (reading every root made each grow with
//! them).

use cloud_harness_error::Result;
use cloud_harness_skills::generation::Generation;
use cloud_harness_store::cas::Store;

/// The workspace's folder of roots.
fn folder(id: &str) -> String {
    format!("workspaces/{id}")
}

/// Roots the sources of `generation`, and drops the roots of sources it no longer has.
pub fn pin(store: &Store, id: &str, generation: &Generation) -> Result<()> {
    let sources = &generation.index.sources;
    let folder = folder(id);
    let prefix = format!("{folder}/");
    for (n, source) in sources.iter().enumerate() {
        store.set_root(&format!("{prefix}{n}"), &source.tree)?;
    }
    for (name, _) in store.roots_in(&folder)? {
        let stale = name
            .strip_prefix(&prefix)
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n >= sources.len());
        if stale {
            store.remove_root(&name)?;
        }
    }
    Ok(())
}

/// Drops every root of the workspace, and its folder of roots (it is closing).
pub(crate) fn unpin(store: &Store, id: &str) -> Result<()> {
    let folder = folder(id);
    for (name, _) in store.roots_in(&folder)? {
        store.remove_root(&name)?;
    }
    store.remove_root_folder(&folder)
}

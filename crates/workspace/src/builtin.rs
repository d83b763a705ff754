//! The built-in tier: skills shipped inside the binary (from `presets/builtin/`).

use cloud_harness_error::Result;
use cloud_harness_skills::discovery::{Layout, SkillCache};
use cloud_harness_skills::resolver::{Provenance, Source, Tier};
use cloud_harness_skills::stack;
use cloud_harness_store::cas::{Digest, Entry, Kind, Store, Tree, Writer};
use include_dir::{include_dir, Dir, DirEntry};

static BUILTIN: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../../presets/builtin");

/// Puts the built-in skills into the store and returns their tree.
pub(crate) fn store_builtin(store: &Store) -> Result<Digest> {
    let mut writer = store.writer()?;
    let digest = put_dir(&mut writer, &BUILTIN)?;
    writer.commit()?;
    Ok(digest)
}

/// The built-in tier as a source of a stack.
pub fn source(store: &Store, cache: &SkillCache) -> Result<Source> {
    stack::tree_source(
        store,
        cache,
        "builtin".into(),
        Tier::Builtin,
        Provenance {
            toolkit: Some("cloud-harness".into()),
            ..Provenance::default()
        },
        store_builtin(store)?,
        &Layout::folder(),
    )
}

fn put_dir(writer: &mut Writer<'_>, dir: &Dir<'_>) -> Result<Digest> {
    let mut entries = Vec::new();
    for item in dir.entries() {
        let name = item
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let entry = match item {
            DirEntry::Dir(sub) => Entry {
                name,
                kind: Kind::Tree,
                size: 0,
                digest: put_dir(writer, sub)?,
            },
            DirEntry::File(file) => Entry {
                name,
                kind: Kind::File,
                size: file.contents().len() as u64,
                digest: writer.put_blob(file.contents())?,
            },
        };
        entries.push(entry);
    }
    writer.put_tree(&Tree::new(entries)?)
}

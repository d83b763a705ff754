//! Writing into the working tree: workspace-scope toolkits into `.cloud-harness/skills/`, all
//! or nothing, and handing the tree to the executor's user.

use super::WORKSPACE_SKILLS;
use cloud_harness_control::toolkit::{self, Scope};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::Acquired;
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::resolver::{self, Override, Tier};
use cloud_harness_store::cas::{self, Digest, Limits, Store};
use serde_json::json;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// Writes workspace-scope skills into `.cloud-harness/skills/`, all or nothing. Two of these
/// toolkits bringing one skill name are resolved like any same-tier collision (an operator
/// override settles it); a skill of the same name already there with other content is a
/// CONFLICT naming both digests. Returns the skills written, with their toolkits, and a
/// line for each skill its toolkit refuses for breaking the Agent Skills specification.
pub(crate) fn workspace_scope(
    store: &Store,
    repo: &Path,
    acquired: &[(toolkit::Toolkit, Acquired)],
    overrides: &[Override],
) -> Result<(BTreeMap<String, String>, Vec<String>)> {
    let target = repo.join(WORKSPACE_SKILLS);
    // The project is hostile: a `.cloud-harness` or `skills` that is a link would have these
    // writes land outside the working tree.
    for place in [".cloud-harness", WORKSPACE_SKILLS] {
        refuse_link(repo, place)?;
    }
    let cache = SkillCache::default();
    let sources = acquired
        .iter()
        .filter(|(t, _)| t.scope == Scope::Workspace)
        .map(|(t, a)| {
            cloud_harness_provision::bundle_source(
                store,
                &cache,
                Tier::Workspace,
                &t.instance_id,
                &a.record.key.url,
                &a.record.key.commit,
                a.record.bundle,
                t.layout.validation,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let index = resolver::resolve(&sources, overrides);
    if let Some(err) = index.conflict_error() {
        return Err(err);
    }
    let wanted: BTreeMap<String, (Digest, String)> = index
        .winners()
        .map(|c| {
            let toolkit = index.source(c).provenance.toolkit.clone();
            (c.name.clone(), (c.digest(), toolkit.unwrap_or_default()))
        })
        .collect();
    // Check everything before writing anything.
    let mut to_write = Vec::new();
    for (name, (digest, toolkit)) in &wanted {
        let dest = target.join(name);
        refuse_link(repo, &format!("{WORKSPACE_SKILLS}/{name}"))?;
        if fs::symlink_metadata(&dest).is_ok() {
            // The project's own folder, hostile like any: its ceilings, and what no skill can hold
            // left out.
            let existing = store.import_dir(&dest, &Limits::PROJECT)?.digest;
            if existing != *digest {
                return Err(Error::conflict(format!(
                    "skill `{name}` is already in {WORKSPACE_SKILLS} with other content ({existing}); toolkit `{toolkit}` brings {digest}; nothing was written"
                ))
                .with_details(json!({ "skill": name, "existing": existing, "incoming": digest, "toolkit": toolkit })));
            }
        } else {
            to_write.push((dest, *digest));
        }
    }
    let mut written: Vec<std::path::PathBuf> = Vec::new();
    for (dest, digest) in to_write {
        fs::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
        if let Err(e) = cas::materialize(store, &digest, &dest) {
            for done in written {
                let _ = cloud_harness_store::removal::remove_tree(&done);
            }
            return Err(e);
        }
        written.push(dest);
    }
    let refused = index
        .skipped
        .iter()
        .filter(|s| s.skipped.code == "SPEC_VIOLATION")
        .map(|s| {
            format!(
                "{}: {} is not written into {WORKSPACE_SKILLS}: {}",
                s.source, s.skipped.path, s.skipped.reason
            )
        })
        .collect();
    let written = wanted
        .into_iter()
        .map(|(name, (_, toolkit))| (name, toolkit))
        .collect();
    Ok((written, refused))
}

/// `place` (relative to the working tree) must not be a link.
fn refuse_link(repo: &Path, place: &str) -> Result<()> {
    match fs::symlink_metadata(repo.join(place)) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::new(
            Code::Forbidden,
            format!(
                "the project's {place} is a link; workspace-scope toolkits are written only into real folders of the working tree, so nothing was written"
            ),
        )
        .with_details(json!({ "path": place }))),
        _ => Ok(()),
    }
}

/// Makes `uid:gid` the owner of everything in the working tree, links included and never
/// followed, so the executor's user may change the project as its own.
pub(crate) fn hand_over(repo: &Path, uid: u32, gid: u32) -> Result<()> {
    let mut stack = vec![repo.to_path_buf()];
    while let Some(path) = stack.pop() {
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid)).map_err(|e| Error::io(&path, e))?;
        let meta = fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
        if meta.is_dir() {
            for entry in fs::read_dir(&path).map_err(|e| Error::io(&path, e))? {
                stack.push(entry.map_err(|e| Error::io(&path, e))?.path());
            }
        }
    }
    Ok(())
}

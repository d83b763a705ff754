//! A workspace's served skills as a catalogue: each skill's files with their SHA-256 digests
//! and sizes (the store names blobs by exactly that digest), and its front matter as written.
//! What the MCP Skills extension publishes; read from the store, as the mount serves it.

use super::served::Workspace;
use cloud_harness_skills::relpath;
use cloud_harness_skills::skill;
use cloud_harness_store::cas::{Digest, Kind, WalkBudget};
use serde_json::Value;

/// One file of a skill, as a read through the mount returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFile {
    /// Relative to the skill folder, `/`-separated.
    pub path: String,
    pub digest: Digest,
    pub size: u64,
}

/// One child of a skill's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FolderEntry {
    pub name: String,
    /// A file's size; `None` for a folder.
    pub size: Option<u64>,
}

impl Workspace {
    /// The served skills, in name order.
    pub fn served_names(&self) -> Vec<String> {
        self.generation()
            .index
            .winners()
            .map(|c| c.name.clone())
            .collect()
    }

    /// Every file of the served skill `name`, in path order: links that lead to a file
    /// inside the mount count as that file (a read follows them), with its digest and size
    /// as the trees give them (nothing is read: many links to one large file cost nothing);
    /// others are left out. The folders listed count against a walk's entry budget.
    pub fn skill_files(&self, name: &str) -> cloud_harness_error::Result<Vec<SkillFile>> {
        let root = self.skill(name)?;
        let mut out = Vec::new();
        let mut budget = WalkBudget::default();
        let mut pending = vec![(String::new(), root)];
        while let Some((dir, digest)) = pending.pop() {
            for e in budget.tree(&self.store, &digest)?.entries() {
                let path = relpath::join(&dir, &e.name);
                match e.kind {
                    Kind::Tree => pending.push((path, e.digest)),
                    Kind::File | Kind::Executable => out.push(SkillFile {
                        path,
                        digest: e.digest,
                        size: e.size,
                    }),
                    Kind::Symlink => {
                        let parts: Vec<&str> =
                            std::iter::once(name).chain(path.split('/')).collect();
                        if let Ok(Some((digest, size))) = self.merged.stat_path(&parts) {
                            out.push(SkillFile { path, digest, size });
                        }
                    }
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// A page of the direct children of the folder `path` (`/`-separated, empty for the
    /// skill's own folder) of the served skill `name`, in the tree's order: at most `limit`
    /// from the `from`-th entry on, and where the next page starts. `None` when there is no
    /// such folder. A link is listed as the file it leads to inside the mount, or left out;
    /// only the page's links are followed.
    pub fn skill_folder(
        &self,
        name: &str,
        path: &str,
        from: usize,
        limit: usize,
    ) -> cloud_harness_error::Result<Option<(Vec<FolderEntry>, Option<usize>)>> {
        let mut digest = self.skill(name)?;
        let mut budget = WalkBudget::default();
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        for seg in &segments {
            let tree = budget.tree(&self.store, &digest)?;
            match tree.get(seg) {
                Some(e) if e.kind == Kind::Tree => digest = e.digest,
                _ => return Ok(None),
            }
        }
        let tree = budget.tree(&self.store, &digest)?;
        let entries = tree.entries();
        let end = from.saturating_add(limit).min(entries.len());
        let mut out = Vec::new();
        for e in entries.get(from..end).unwrap_or_default() {
            let size = match e.kind {
                Kind::Tree => None,
                Kind::File | Kind::Executable => Some(e.size),
                Kind::Symlink => {
                    let parts: Vec<&str> = std::iter::once(name)
                        .chain(segments.iter().copied())
                        .chain(std::iter::once(e.name.as_str()))
                        .collect();
                    match self.merged.stat_path(&parts) {
                        Ok(Some((_, size))) => Some(size),
                        _ => continue,
                    }
                }
            };
            out.push(FolderEntry {
                name: e.name.clone(),
                size,
            });
        }
        Ok(Some((out, (end < entries.len()).then_some(end))))
    }

    /// The front matter of the served skill `name`'s SKILL.md, every field as written.
    pub fn frontmatter(&self, name: &str) -> Option<Value> {
        let (_, bytes) = self
            .merged
            .read_path(&[name, "SKILL.md"], 0, skill::MAX_SKILL_MD as u32)
            .ok()??;
        skill::frontmatter_json(&bytes)
    }

    /// The whole file `path` of the served skill `name` (`None`: no such file, or a folder or
    /// a link loop there). A store object that cannot be read is an error, not an absence.
    pub fn file_bytes(
        &self,
        name: &str,
        path: &str,
    ) -> cloud_harness_error::Result<Option<Vec<u8>>> {
        let parts = super::read::check_skill_path(path, "path")?;
        let full: Vec<&str> = std::iter::once(name).chain(parts).collect();
        match self.merged.read_path(&full, 0, u32::MAX) {
            Ok(found) => Ok(found.map(|(_, bytes)| bytes)),
            Err(nix::errno::Errno::EISDIR | nix::errno::Errno::ELOOP) => Ok(None),
            Err(e) => Err(cloud_harness_error::Error::internal(format!(
                "reading {name}/{path}: {e}"
            ))),
        }
    }
}

//! Staging: copying a fetched git tree into the store, treating it as hostile until checked.
//!
//! Every path component passes gix's validators with all protections on (`.git` in any case
//! or NTFS/HFS disguise, `..`, separators, Windows device names); names that collide under case
//! folding or Unicode normalization are refused; submodules are skipped with a warning; a
//! symlink is kept, as data, only when it resolves inside the toolkit; ceilings on files, bytes,
//! file size, depth and time apply. A breach is a TOO_LARGE, INVALID_ARGUMENT or TIMEOUT error
//! naming the path and the limit, and the caller then drops the batch: nothing is published.

use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Entry, Kind, Tree, Writer};
use gix::objs::tree::EntryKind;
use std::collections::HashMap;
use std::time::Instant;
use unicode_normalization::UnicodeNormalization;

/// Ceilings for one toolkit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_files: u64,
    pub max_bytes: u64,
    pub max_file_bytes: u64,
    pub max_depth: usize,
    pub max_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_files: 20_000,
            max_bytes: 256 << 20,
            max_file_bytes: 32 << 20,
            max_depth: 32,
            max_seconds: 120,
        }
    }
}

impl Limits {
    /// The defaults, each overridable: `CLOUD_HARNESS_MAX_FILES`, `_MAX_BYTES`,
    /// `_MAX_FILE_BYTES`, `_MAX_DEPTH`, `_FETCH_TIMEOUT` (seconds).
    pub fn from_env() -> Result<Limits> {
        let var = cloud_harness_control::config::env_number;
        let d = Limits::default();
        let max_depth = var("CLOUD_HARNESS_MAX_DEPTH", d.max_depth as u64)?;
        let ceiling = cloud_harness_store::cas::MAX_TREE_DEPTH;
        if max_depth > ceiling as u64 {
            return Err(Error::invalid(format!(
                "CLOUD_HARNESS_MAX_DEPTH: {max_depth} is more than the {ceiling} levels a tree in the store may nest"
            )));
        }
        // A toolkit's files and folders, counted by path, are walked again on every open (its
        // skills, their links): within the entry budget of such a walk, several times over.
        let max_files = var("CLOUD_HARNESS_MAX_FILES", d.max_files)?;
        let most_files = cloud_harness_store::cas::MAX_WALK_ENTRIES / 8;
        if max_files > most_files {
            return Err(Error::invalid(format!(
                "CLOUD_HARNESS_MAX_FILES: {max_files} is more than the {most_files} files a toolkit may hold (an eighth of the {} entries a walk over stored trees may list)",
                cloud_harness_store::cas::MAX_WALK_ENTRIES
            )));
        }
        Ok(Limits {
            max_files,
            max_bytes: var("CLOUD_HARNESS_MAX_BYTES", d.max_bytes)?,
            max_file_bytes: var("CLOUD_HARNESS_MAX_FILE_BYTES", d.max_file_bytes)?,
            max_depth: max_depth as usize,
            max_seconds: var("CLOUD_HARNESS_FETCH_TIMEOUT", d.max_seconds)?,
        })
    }
}

pub struct Staged {
    pub tree: Digest,
    pub warnings: Vec<String>,
}

struct Stager<'r, 'w, 's> {
    repo: &'r gix::Repository,
    writer: &'w mut Writer<'s>,
    limits: Limits,
    deadline: Instant,
    files: u64,
    /// Folders met, each counted as often as the trees name it: a tree of many entries naming
    /// one folder that names another such tree is walked as many times as it is named.
    folders: u64,
    bytes: u64,
    warnings: Vec<String>,
}

fn refuse(code: Code, path: &str, what: String) -> Error {
    Error::new(code, format!("{path}: {what}")).with_details(serde_json::json!({ "path": path }))
}

fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_owned()
    } else {
        format!("{base}/{name}")
    }
}

/// Copies the tree of `commit` below `subdirectory` into the batch `writer`.
pub fn stage(
    repo: &gix::Repository,
    commit: gix::ObjectId,
    subdirectory: &str,
    writer: &mut Writer<'_>,
    limits: Limits,
    deadline: Instant,
) -> Result<Staged> {
    let internal = |e: &dyn std::fmt::Display| {
        Error::new(Code::Upstream, format!("reading the fetched commit: {e}"))
    };
    let mut tree_id = repo
        .find_commit(commit)
        .map_err(|e| internal(&e))?
        .tree_id()
        .map_err(|e| internal(&e))?
        .detach();
    for part in subdirectory.split('/').filter(|p| !p.is_empty()) {
        let tree = repo.find_tree(tree_id).map_err(|e| internal(&e))?;
        let entry = tree
            .iter()
            .filter_map(|e| e.ok())
            .find(|e| e.filename() == part && e.mode().is_tree())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "subdirectory: {subdirectory:?} is not a folder of the repository"
                ))
                .with_details(serde_json::json!({ "field": "subdirectory" }))
            })?;
        tree_id = entry.oid().to_owned();
    }
    let mut stager = Stager {
        repo,
        writer,
        limits,
        deadline,
        files: 0,
        folders: 0,
        bytes: 0,
        warnings: Vec::new(),
    };
    let tree = stager.tree(tree_id, "", 0)?;
    Ok(Staged {
        tree,
        warnings: stager.warnings,
    })
}

impl Stager<'_, '_, '_> {
    fn tree(&mut self, id: gix::ObjectId, path: &str, depth: usize) -> Result<Digest> {
        let shown = if path.is_empty() { "." } else { path };
        if depth
            > self
                .limits
                .max_depth
                .min(cloud_harness_store::cas::MAX_TREE_DEPTH)
        {
            return Err(refuse(
                Code::TooLarge,
                shown,
                format!(
                    "nested deeper than the limit of {} levels",
                    self.limits.max_depth
                ),
            ));
        }
        if Instant::now() > self.deadline {
            return Err(refuse(
                Code::Timeout,
                shown,
                format!(
                    "staging took longer than the limit of {} s",
                    self.limits.max_seconds
                ),
            ));
        }
        let tree = self
            .repo
            .find_tree(id)
            .map_err(|e| refuse(Code::Upstream, shown, format!("unreadable tree: {e}")))?;
        let mut folded: HashMap<String, String> = HashMap::new();
        let mut entries = Vec::new();
        for entry in tree.iter() {
            let entry = entry.map_err(|e| {
                refuse(Code::InvalidArgument, shown, format!("malformed tree: {e}"))
            })?;
            if entries.len() == cloud_harness_store::cas::MAX_TREE_ENTRIES {
                return Err(refuse(
                    Code::TooLarge,
                    shown,
                    format!(
                        "a folder of more than the limit of {} entries",
                        cloud_harness_store::cas::MAX_TREE_ENTRIES
                    ),
                ));
            }
            let raw = entry.filename();
            let lossy = String::from_utf8_lossy(raw);
            let child = join(path, &lossy);
            let name = std::str::from_utf8(raw).map_err(|_| {
                refuse(
                    Code::InvalidArgument,
                    &child,
                    "the name is not valid UTF-8".into(),
                )
            })?;
            let kind = entry.mode().kind();
            let mode =
                (kind == EntryKind::Link).then_some(gix::validate::path::component::Mode::Symlink);
            gix::validate::path::component(
                raw,
                mode,
                gix::validate::path::component::Options {
                    protect_windows: true,
                    protect_hfs: true,
                    protect_ntfs: true,
                },
            )
            .map_err(|e| refuse(Code::InvalidArgument, &child, format!("refused name: {e}")))?;
            cloud_harness_store::cas::check_name(name)
                .map_err(|e| refuse(Code::InvalidArgument, &child, e.message))?;
            let key: String = name.nfc().collect::<String>().to_lowercase();
            if let Some(other) = folded.insert(key, name.to_owned()) {
                return Err(refuse(
                    Code::InvalidArgument,
                    &child,
                    format!(
                        "collides with {:?} under case folding or Unicode normalization",
                        join(path, &other)
                    ),
                ));
            }
            let oid = entry.oid().to_owned();
            let staged = match kind {
                EntryKind::Tree => {
                    self.folder(&child)?;
                    Entry {
                        name: name.to_owned(),
                        kind: Kind::Tree,
                        size: 0,
                        digest: self.tree(oid, &child, depth + 1)?,
                    }
                }
                EntryKind::Blob | EntryKind::BlobExecutable | EntryKind::Link => {
                    let data = self.read_blob(oid, &child)?;
                    let kind = match kind {
                        EntryKind::Link => {
                            check_link(&child, &data)?;
                            Kind::Symlink
                        }
                        EntryKind::BlobExecutable => Kind::Executable,
                        _ => Kind::File,
                    };
                    Entry {
                        name: name.to_owned(),
                        kind,
                        size: data.len() as u64,
                        digest: self.writer.put_blob(&data)?,
                    }
                }
                EntryKind::Commit => {
                    // Counted as a file: each one is a warning kept.
                    self.count(&child, 0)?;
                    self.warnings.push(format!("{child}: a submodule; skipped"));
                    continue;
                }
            };
            entries.push(staged);
        }
        let tree =
            Tree::new(entries).map_err(|e| refuse(Code::InvalidArgument, shown, e.message))?;
        self.writer.put_tree(&tree)
    }

    /// A folder more: at most as many as files are allowed.
    fn folder(&mut self, path: &str) -> Result<()> {
        self.folders += 1;
        if self.folders > self.limits.max_files {
            return Err(refuse(
                Code::TooLarge,
                path,
                format!(
                    "more than the limit of {} folders (CLOUD_HARNESS_MAX_FILES)",
                    self.limits.max_files
                ),
            ));
        }
        Ok(())
    }

    fn count(&mut self, path: &str, size: u64) -> Result<()> {
        if size > self.limits.max_file_bytes {
            return Err(refuse(
                Code::TooLarge,
                path,
                format!(
                    "{size} bytes, more than the limit of {} bytes per file",
                    self.limits.max_file_bytes
                ),
            ));
        }
        self.files += 1;
        self.bytes += size;
        if self.files > self.limits.max_files {
            return Err(refuse(
                Code::TooLarge,
                path,
                format!("more than the limit of {} files", self.limits.max_files),
            ));
        }
        if self.bytes > self.limits.max_bytes {
            return Err(refuse(
                Code::TooLarge,
                path,
                format!(
                    "more than the limit of {} bytes in all",
                    self.limits.max_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Reads a blob, its size checked from the object header first: an oversized blob is
    /// refused unread.
    fn read_blob(&mut self, id: gix::ObjectId, path: &str) -> Result<Vec<u8>> {
        let header = self
            .repo
            .find_header(id)
            .map_err(|e| refuse(Code::Upstream, path, format!("missing blob: {e}")))?;
        self.count(path, header.size())?;
        let mut blob = self
            .repo
            .find_blob(id)
            .map_err(|e| refuse(Code::Upstream, path, format!("unreadable blob: {e}")))?;
        Ok(std::mem::take(&mut blob.data))
    }
}

/// A symlink is kept only if, resolved from where it stands, it stays inside the toolkit.
fn check_link(path: &str, target: &[u8]) -> Result<()> {
    let outside = || {
        refuse(
            Code::InvalidArgument,
            path,
            format!(
                "a symlink to {:?}, outside the toolkit",
                String::from_utf8_lossy(target)
            ),
        )
    };
    if target.is_empty() || target.starts_with(b"/") || target.contains(&0) {
        return Err(outside());
    }
    let mut stack: Vec<&[u8]> = path.as_bytes().split(|&b| b == b'/').collect();
    stack.pop(); // the link's own name
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                if stack.pop().is_none() {
                    return Err(outside());
                }
            }
            p => stack.push(p),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_link;

    #[test]
    fn symlinks_must_stay_inside() {
        assert!(check_link("skills/a/ref.md", b"../b/ref.md").is_ok());
        assert!(check_link("skills/a/ref.md", b"../../README.md").is_ok());
        assert!(check_link("top-link", b"skills").is_ok());
        for bad in [
            &b"../../../etc/passwd"[..],
            b"/etc/passwd",
            b"../x/../../../y",
            b"",
        ] {
            assert!(check_link("skills/a/ref.md", bad).is_err(), "{bad:?}");
        }
        assert!(check_link("link", b"..").is_err());
    }
}

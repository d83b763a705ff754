//! Garbage-collection roots: named files under `<store>/roots/`, each holding one digest.
//! A root names what must be kept (a workspace, a pinned preset, a skill set).

use super::digest::Digest;
use super::store::Store;
use cloud_harness_error::{Error, Result};
use std::fs;
use std::io::Write;
use std::path::Path;

/// Root names are `/`-separated segments of letters, digits, `.`, `_` and `-`.
fn check_root_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        });
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("invalid root name {name:?}")))
    }
}

impl Store {
    /// Records (or moves) the root `name` to `digest`, atomically.
    pub fn set_root(&self, name: &str, digest: &Digest) -> Result<()> {
        check_root_name(name)?;
        let path = self.roots_dir().join(name);
        let dir = path.parent().expect("roots have a parent");
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        // A name of its own for every writer (threads of one process too); dotted, so a
        // listing of roots never takes it for one. Removed if anything fails.
        let write = || -> std::io::Result<()> {
            let mut f = tempfile::Builder::new()
                .prefix(".root-")
                .suffix(".tmp")
                .tempfile_in(dir)?;
            writeln!(f, "{digest}")?;
            f.as_file().sync_all()?;
            f.persist(&path).map_err(|e| e.error)?;
            fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| Error::io(&path, e))
    }

    pub fn remove_root(&self, name: &str) -> Result<()> {
        check_root_name(name)?;
        let path = self.roots_dir().join(name);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// The roots in the folder of roots `folder` (`workspaces/ID`, say), named as
    /// [`Store::roots`] names them, without reading any root outside it: none where the
    /// folder is not. What one owner of roots reads of its own, however many others there are.
    pub fn roots_in(&self, folder: &str) -> Result<Vec<(String, Digest)>> {
        check_root_name(folder)?;
        let dir = self.roots_dir().join(folder);
        let mut out = Vec::new();
        collect(&dir, &format!("{folder}/"), &mut out)?;
        out.sort();
        Ok(out)
    }

    /// Removes the folder of roots `folder` if it holds nothing (no root, no root being
    /// written), so that folders do not outlive what they rooted.
    pub fn remove_root_folder(&self, folder: &str) -> Result<()> {
        check_root_name(folder)?;
        let dir = self.roots_dir().join(folder);
        match fs::remove_dir(&dir) {
            Ok(()) => Ok(()),
            Err(e)
                // Not empty: ENOTEMPTY, or EEXIST where a file system says so.
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound
                        | std::io::ErrorKind::DirectoryNotEmpty
                        | std::io::ErrorKind::AlreadyExists
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(Error::io(&dir, e)),
        }
    }

    /// Every root with the digest it names. A root file that does not hold a digest is an
    /// error naming it: garbage collection must never run on a misread set of roots.
    pub fn roots(&self) -> Result<Vec<(String, Digest)>> {
        let mut out = Vec::new();
        collect(&self.roots_dir(), "", &mut out)?;
        out.sort();
        Ok(out)
    }
}

/// The roots under `dir`. A root or folder removed while it is read (a workspace closing
/// meanwhile) is left out: it was removed, not misread (a root is replaced by a rename).
fn collect(dir: &Path, prefix: &str, out: &mut Vec<(String, Digest)>) -> Result<()> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let items = match fs::read_dir(dir) {
        Err(e) if gone(&e) && !prefix.is_empty() => return Ok(()),
        items => items.map_err(|e| Error::io(dir, e))?,
    };
    for item in items {
        let item = item.map_err(|e| Error::io(dir, e))?;
        let name = item.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // a root being written
        }
        let path = item.path();
        let full = format!("{prefix}{name}");
        let kind = match item.file_type() {
            Err(e) if gone(&e) => continue,
            kind => kind.map_err(|e| Error::io(&path, e))?,
        };
        if kind.is_dir() {
            collect(&path, &format!("{full}/"), out)?;
        } else {
            let text = match fs::read_to_string(&path) {
                Err(e) if gone(&e) => continue,
                text => text.map_err(|e| Error::io(&path, e))?,
            };
            let digest = Digest::parse(text.trim())
                .map_err(|_| Error::internal(format!("root {full} does not hold a digest")))?;
            out.push((full, digest));
        }
    }
    Ok(())
}

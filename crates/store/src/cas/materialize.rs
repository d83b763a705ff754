//! Materializing a tree of the store into a new directory, whole or not at all.

use super::digest::Digest;
use super::store::{ObjectKind, Store};
use super::tree::Kind;
use cloud_harness_error::{Error, Result};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Writes the tree `digest` to `dest`, which must not exist. Everything is written under a
/// temporary sibling and renamed into place at the end, so `dest` is either complete or
/// absent. Every blob is checked against its digest on the way.
pub fn materialize(store: &Store, digest: &Digest, dest: &Path) -> Result<()> {
    if fs::symlink_metadata(dest).is_ok() {
        return Err(Error::conflict(format!(
            "{} already exists",
            dest.display()
        )));
    }
    let parent = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let staging = tempdir_in(parent, dest)?;
    let result = write_tree(store, digest, &staging)
        .and_then(|()| {
            fs::set_permissions(&staging, fs::Permissions::from_mode(Kind::Tree.mode()))
                .map_err(|e| Error::io(&staging, e))
        })
        .and_then(|()| {
            nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                &staging,
                nix::fcntl::AT_FDCWD,
                dest,
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            )
            .map_err(|errno| Error::io(dest, io::Error::from_raw_os_error(errno as i32)))
        });
    if result.is_err() {
        let _ = crate::removal::remove_tree(&staging);
    }
    result
}

fn tempdir_in(parent: &Path, dest: &Path) -> Result<PathBuf> {
    let base = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for attempt in 0..100u32 {
        let candidate = parent.join(format!(".{base}.partial-{}-{attempt}", std::process::id()));
        match fs::create_dir(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(&candidate, e)),
        }
    }
    Err(Error::internal(format!(
        "no free temporary name next to {}",
        dest.display()
    )))
}

/// Writes the tree `digest` into the empty folder `dir`, folder by folder from a stack of
/// its own (no recursion, whatever the depth of the tree).
fn write_tree(store: &Store, digest: &Digest, dir: &Path) -> Result<()> {
    let mut pending = vec![(*digest, dir.to_path_buf())];
    while let Some((digest, dir)) = pending.pop() {
        let tree = store.tree(&digest)?;
        for entry in tree.entries() {
            let path = dir.join(&entry.name);
            match entry.kind {
                Kind::Tree => {
                    fs::create_dir(&path).map_err(|e| Error::io(&path, e))?;
                    // Whatever the umask: a materialized tree looks the same everywhere.
                    fs::set_permissions(&path, fs::Permissions::from_mode(Kind::Tree.mode()))
                        .map_err(|e| Error::io(&path, e))?;
                    pending.push((entry.digest, path));
                }
                Kind::Symlink => {
                    let target = store.blob(&entry.digest)?;
                    std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
                        .map_err(|e| Error::io(&path, e))?;
                }
                Kind::File | Kind::Executable => {
                    copy_verified(store, &entry.digest, &path)?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(entry.kind.mode()))
                        .map_err(|e| Error::io(&path, e))?;
                }
            }
        }
    }
    Ok(())
}

/// Copies a blob to `path`, hashing on the way; a mismatch is an error (the caller removes
/// the partial output).
fn copy_verified(store: &Store, digest: &Digest, path: &Path) -> Result<()> {
    let src_path = store.object_path(ObjectKind::Blob, digest);
    let mut src = File::open(&src_path).map_err(|e| Error::io(&src_path, e))?;
    let mut dst = File::create(path).map_err(|e| Error::io(path, e))?;
    let (copied, _) = Digest::of_stream(&mut src, &mut dst).map_err(|e| Error::io(path, e))?;
    if copied != *digest {
        tracing::error!(object = %digest, "corrupt object");
        return Err(Error::internal(format!(
            "object {digest} is corrupt: its content does not match its digest"
        )));
    }
    Ok(())
}

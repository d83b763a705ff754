//! The guard's own side: the records it reads, and what it detaches at their end; and the
//! sweep of what a dead server left.

use crate::mount_table::{self, Mount};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{self, BufRead, Read};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// A record longer than this (a path past `PATH_MAX` and its ID) is not one of ours.
const MAX_RECORD: u64 = 4096 + 32;
/// Mounts one guard keeps at most: far beyond what a server holds (two per workspace).
const MAX_MOUNTS: usize = 1 << 20;

/// What the guard found at the end of its daemon's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Mounts still named (the daemon never said it unmounted them).
    pub named: usize,
    /// Named mounts the mount table no longer showed (fusermount's auto-unmount can be
    /// first), or showed someone else's mount at.
    pub gone: usize,
    /// Mounts and folder binds the guard detached.
    pub detached: usize,
}

/// The guard's side: reads records from `input` until end of file, then detaches every mount
/// still named.
/// A read error is no end of file: the daemon may still serve, so nothing is detached (the
/// next server's start sweeps what is left).
pub fn watch(input: impl Read) -> io::Result<Ended> {
    let (named, folders) = named(input)?;
    let still_named = named.len();
    // One read of the mount table for them all: a server's guard may name thousands.
    let table = match mount_table::mounts() {
        Ok(table) => Some(table),
        Err(e) => {
            eprintln!(
                "cloud-harness: the mount table is unreadable ({e}); detaching every mount named"
            );
            None
        }
    };
    let (mut detached, mut gone) = (0, 0);
    for (point, id) in named {
        if let Some(table) = &table {
            let now = mount_table::topmost_mount(table, &point);
            let still = match id {
                Some(id) => now.is_some_and(|m| m.id == id),
                None => now.is_some_and(Mount::is_ours),
            };
            if !still {
                gone += 1; // unmounted already (or never made), or someone else's mount now
                continue;
            }
        }
        match crate::fuse::unmount(&point) {
            Ok(()) => detached += 1,
            Err(e) => eprintln!("cloud-harness: detaching {}: {e}", point.display()),
        }
    }
    if !folders.is_empty() {
        detached += detach_folders(&folders);
    }
    Ok(Ended {
        named: still_named,
        gone,
        detached,
    })
}

/// The binds of folders onto themselves, once their mounts are gone, undone as their server
/// would (`self_bind::undo`: only this project's, holding no mount; a Docker executor's
/// shared folder stays over a restart, and the bind with it). How many.
fn detach_folders(folders: &[(PathBuf, u64)]) -> usize {
    let mut detached = 0;
    for (point, _) in folders {
        match crate::self_bind::undo(point) {
            Ok(true) => detached += 1,
            Ok(false) => {}
            Err(e) => eprintln!("cloud-harness: detaching {}: {e}", point.display()),
        }
    }
    detached
}

/// What the records name at the end of `input`: the mounts, newest first (a mount made
/// inside another goes before it), and the folders bound onto themselves.
type Named = (Vec<(PathBuf, Option<u64>)>, Vec<(PathBuf, u64)>);

fn named(input: impl Read) -> io::Result<Named> {
    // By path: when it was named, and its ID (none while only expected).
    let mut mounts: BTreeMap<PathBuf, (u64, Option<u64>)> = BTreeMap::new();
    let mut folders: BTreeMap<PathBuf, u64> = BTreeMap::new();
    let mut input = io::BufReader::new(input);
    let mut record = Vec::new();
    for seq in 0.. {
        record.clear();
        match (&mut input).take(MAX_RECORD).read_until(0, &mut record) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if record.pop() != Some(0) {
            // Too long, or cut by the end of the input: skip to the next record.
            if input.skip_until(0)? == 0 {
                break;
            }
            continue;
        }
        match parse(&record) {
            Some((sign @ (b'+' | b'?'), id, path))
                if mounts.len() < MAX_MOUNTS || mounts.contains_key(&path) =>
            {
                mounts.insert(path, (seq, (sign == b'+').then_some(id)));
            }
            Some((b'=', id, path)) if folders.len() < MAX_MOUNTS || folders.contains_key(&path) => {
                folders.insert(path, id);
            }
            Some((b'-', id, path)) if folders.get(&path) == Some(&id) => {
                folders.remove(&path);
            }
            Some((b'-', id, path))
                if mounts
                    .get(&path)
                    .is_some_and(|&(_, known)| known.unwrap_or(0) == id) =>
            {
                mounts.remove(&path);
            }
            _ => {}
        }
    }
    let mut newest_first: Vec<(u64, PathBuf, Option<u64>)> = mounts
        .into_iter()
        .map(|(path, (seq, id))| (seq, path, id))
        .collect();
    newest_first.sort_by_key(|&(seq, _, _)| std::cmp::Reverse(seq));
    Ok((
        newest_first.into_iter().map(|(_, p, id)| (p, id)).collect(),
        folders.into_iter().collect(),
    ))
}

/// `+ID PATH`, `?0 PATH`, `=ID PATH` or `-ID PATH`, the path absolute.
fn parse(record: &[u8]) -> Option<(u8, u64, PathBuf)> {
    let (&sign, rest) = record.split_first()?;
    if !matches!(sign, b'+' | b'-' | b'?' | b'=') {
        return None;
    }
    let space = rest.iter().position(|&b| b == b' ')?;
    let id = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
    let path = PathBuf::from(OsString::from_vec(rest[space + 1..].to_vec()));
    path.is_absolute().then_some((sign, id, path))
}

/// Detaches every FUSE mount of ours at or under `root` (whose daemon must be gone: a server
/// at its start, or its service after it stopped), the newest first, then the workspaces
/// folder's bind onto itself if nothing is left in it. How many.
pub fn sweep(root: &Path) -> io::Result<usize> {
    let root = std::fs::canonicalize(root)?;
    let left: Vec<Mount> = mount_table::mounts()?
        .into_iter()
        .filter(|m| m.is_ours() && m.point.starts_with(&root) && is_mount_folder(&m.point))
        .collect();
    let mut detached = 0;
    for m in left.iter().rev() {
        match crate::fuse::unmount(&m.point) {
            Ok(()) => detached += 1,
            Err(e) => {
                tracing::warn!(mountpoint = %m.point.display(), error = %e, "a mount left by a server that is gone could not be detached")
            }
        }
    }
    // The workspaces folder bound onto itself by a server (with bubblewrap, as root), once
    // nothing is mounted in it: `root` itself or the folder of that name in it.
    let folder = if root.file_name() == Some("workspaces".as_ref()) {
        root.clone()
    } else {
        root.join("workspaces")
    };
    match crate::self_bind::undo(&folder) {
        Ok(true) => detached += 1,
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(folder = %folder.display(), error = %e, "the workspaces folder's mount left by a server that is gone could not be detached")
        }
    }
    Ok(detached)
}

/// The names a workspace's FUSE mounts have (`<workspace>/mounts/{skills,owner-skills}`):
/// a sweep leaves any other mount alone, whatever made it.
pub const MOUNT_NAMES: [&str; 2] = ["skills", "owner-skills"];

fn is_mount_folder(point: &Path) -> bool {
    let name = point.file_name().and_then(|n| n.to_str());
    let parent = point.parent().and_then(|p| p.file_name());
    name.is_some_and(|n| MOUNT_NAMES.contains(&n)) && parent == Some("mounts".as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_name_mounts_until_removed_and_bad_ones_are_skipped() {
        let mut input = Vec::new();
        input.extend_from_slice(b"+7 /nowhere/a\0");
        input.extend_from_slice(b"+8 relative\0"); // not absolute: not ours
        input.extend_from_slice(&[b'+'; 5000]); // too long
        input.extend_from_slice(b"\0-7 /nowhere/a\0+9 /nowhere/b\0+11 /nowhere/d\0");
        input.extend_from_slice(b"garbage\0+10 /nowhere/c"); // cut by the end
        assert_eq!(
            named(&input[..]).unwrap().0,
            vec![
                (PathBuf::from("/nowhere/d"), Some(11)),
                (PathBuf::from("/nowhere/b"), Some(9))
            ]
        );
        // Nothing named is mounted: the guard detaches nothing and ends.
        assert_eq!(
            watch(&input[..]).unwrap(),
            Ended {
                named: 2,
                gone: 2,
                detached: 0
            }
        );
    }

    #[test]
    fn a_sweep_names_only_a_workspaces_mount_folders() {
        assert!(is_mount_folder(Path::new("/h/workspaces/w1/mounts/skills")));
        assert!(is_mount_folder(Path::new(
            "/h/workspaces/w1/mounts/owner-skills"
        )));
        assert!(!is_mount_folder(Path::new("/h/workspaces/w1/repo")));
        assert!(!is_mount_folder(Path::new(
            "/h/workspaces/w1/tree/mounts/x"
        )));
        assert!(!is_mount_folder(Path::new("/h/workspaces/w1/skills")));
    }

    #[test]
    fn a_read_error_is_no_end_of_file_and_detaches_nothing() {
        struct Failing(bool);
        impl Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if std::mem::replace(&mut self.0, true) {
                    return Err(io::Error::other("broken"));
                }
                let rec = b"+1 /nowhere/guard-test\0";
                buf[..rec.len()].copy_from_slice(rec);
                Ok(rec.len())
            }
        }
        assert!(watch(Failing(false)).is_err());
    }

    #[test]
    fn a_folder_bound_onto_itself_is_named_apart_until_removed() {
        let input = b"=3 /h/workspaces\0+4 /h/workspaces/w/mounts/skills\0=8 /h/other\0-8 /h/other\0-9 /h/workspaces\0";
        let (mounts, folders) = named(&input[..]).unwrap();
        assert_eq!(
            mounts,
            vec![(PathBuf::from("/h/workspaces/w/mounts/skills"), Some(4))]
        );
        // A removal with another ID (a late one, the ID reused) keeps it.
        assert_eq!(folders, vec![(PathBuf::from("/h/workspaces"), 3)]);
    }

    #[test]
    fn a_late_removal_of_a_reused_id_keeps_the_other_mount() {
        // A is unmounted, B mounted at once with A's freed ID, and only then is A's removal
        // sent; and a path mounted again keeps its new ID past the old one's removal.
        let input = b"+5 /w/a\0+5 /w/b\0-5 /w/a\0+6 /w/c\0+7 /w/c\0-6 /w/c\0";
        assert_eq!(
            named(&input[..]).unwrap().0,
            vec![
                (PathBuf::from("/w/c"), Some(7)),
                (PathBuf::from("/w/b"), Some(5))
            ]
        );
    }

    #[test]
    fn an_expected_mount_is_named_until_made_or_given_up() {
        // Expected and made; expected and given up; expected only (the daemon died between
        // its mount and its `+`).
        let input = b"?0 /w/a\0+4 /w/a\0?0 /w/b\0-0 /w/b\0?0 /w/c\0";
        assert_eq!(
            named(&input[..]).unwrap().0,
            vec![
                (PathBuf::from("/w/c"), None),
                (PathBuf::from("/w/a"), Some(4))
            ]
        );
    }
}

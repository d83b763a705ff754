//! A folder bound onto itself, privately, by this project: a server's workspaces folder
//! (see `cloud_harness_executor::launch_mounts`). The bind's mount ID is written next to the
//! folder (`<folder>.mount-id`), so that only a bind made here is ever taken over or undone,
//! never one an operator made of the same folder (with options of their own, say).

use crate::mount_table::{self, Mount};
use std::io;
use std::path::{Path, PathBuf};

/// Where the ID of the bind of `folder` is written.
fn record(folder: &Path) -> PathBuf {
    let mut name = folder.file_name().unwrap_or_default().to_owned();
    name.push(".mount-id");
    folder.with_file_name(name)
}

/// Binds `folder` (canonical, no mount at it) onto itself, private, and records the bind.
/// Nothing stays of it on an error.
pub fn make(folder: &Path) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    let none: Option<&str> = None;
    mount(Some(folder), folder, none, MsFlags::MS_BIND, none)?;
    let made = mount(none, folder, none, MsFlags::MS_PRIVATE, none)
        .map_err(io::Error::from)
        .and_then(|()| {
            let id = mount_table::id_at(folder)
                .ok_or_else(|| io::Error::other("the bind is not found at its folder"))?;
            // Whole or not at all: written aside, then renamed.
            let (path, aside) = (record(folder), record(folder).with_extension("new"));
            std::fs::write(&aside, id.to_string())?;
            std::fs::rename(&aside, &path)
        });
    if let Err(e) = made {
        let _ = detach(folder);
        return Err(e);
    }
    Ok(())
}

/// Whether the topmost mount at `folder` is a bind this project made of it (its ID recorded).
pub fn is_ours(table: &[Mount], folder: &Path) -> bool {
    let Some(top) = mount_table::topmost_mount(table, folder) else {
        return false;
    };
    let recorded = std::fs::read_to_string(record(folder)).ok();
    recorded.and_then(|r| r.trim().parse::<u64>().ok()) == Some(top.id)
        && mount_table::is_private_self_bind(table, folder)
}

/// Undoes a bind this project made of `folder` if nothing is mounted in it (one read of the
/// table). Whether it did.
pub fn undo(folder: &Path) -> io::Result<bool> {
    let table = mount_table::mounts()?;
    if !is_ours(&table, folder) || mount_table::has_mounts_in(&table, folder) {
        return Ok(false);
    }
    detach(folder)?;
    let _ = std::fs::remove_file(record(folder));
    Ok(true)
}

fn detach(folder: &Path) -> io::Result<()> {
    use nix::mount::MntFlags;
    nix::mount::umount2(folder, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn as_root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            assert!(std::env::var_os("CI").is_none(), "needs root");
        }
        root
    }

    #[test]
    fn only_a_bind_made_here_is_taken_or_undone_and_never_with_a_mount_in_it() {
        if !as_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let (ours, theirs) = (root.join("workspaces"), root.join("other"));
        for dir in [&ours, &theirs, &ours.join("w/mounts")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        make(&ours).unwrap();
        // An operator's own bind of a folder onto itself: the same kind of mount, no record.
        let none: Option<&str> = None;
        nix::mount::mount(
            Some(&theirs),
            &theirs,
            none,
            nix::mount::MsFlags::MS_BIND,
            none,
        )
        .unwrap();
        nix::mount::mount(none, &theirs, none, nix::mount::MsFlags::MS_PRIVATE, none).unwrap();
        let table = mount_table::mounts().unwrap();
        assert!(is_ours(&table, &ours));
        assert!(mount_table::is_private_self_bind(&table, &theirs));
        assert!(!is_ours(&table, &theirs));
        assert!(!undo(&theirs).unwrap());
        // Something mounted in it: kept.
        let inner = ours.join("w/mounts");
        nix::mount::mount(
            Some(&inner),
            &inner,
            none,
            nix::mount::MsFlags::MS_BIND,
            none,
        )
        .unwrap();
        assert!(!undo(&ours).unwrap());
        nix::mount::umount2(&inner, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert!(undo(&ours).unwrap());
        assert!(!record(&ours).exists());
        let table = mount_table::mounts().unwrap();
        assert!(mount_table::topmost_mount(&table, &ours).is_none());
        assert!(mount_table::topmost_mount(&table, &theirs).is_some());
        nix::mount::umount2(&theirs, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
}

//! This mount namespace's mount table (`/proc/self/mountinfo`): whether a folder is a mount
//! point, which mount it is, and what is mounted where.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Unique among the mounts there are now; the kernel reuses it once the mount is gone.
    pub id: u64,
    /// The ID of the mount it is on (its own for a namespace's root).
    pub parent: u64,
    pub point: PathBuf,
    /// `fuse` for a FUSE mount (`fuse.NAME` where the daemon named a subtype).
    pub fs_type: String,
    /// The source field: the FUSE daemon's `fsname`.
    pub source: String,
    /// The file system's device (`MAJOR:MINOR`) and the folder of it mounted here.
    pub device: String,
    pub root: PathBuf,
    /// In a peer group: mounts made in it, or taken off it, are in its peers too.
    pub shared: bool,
}

impl Mount {
    /// A FUSE mount this project's daemons made (`fsname=cloud-harness`).
    pub fn is_ours(&self) -> bool {
        (self.fs_type == "fuse" || self.fs_type.starts_with("fuse."))
            && self.source == "cloud-harness"
    }
}

/// The whole table, read once, in the kernel's order (a mount after the one it is on).
pub fn mounts() -> io::Result<Vec<Mount>> {
    read("/proc/self/mountinfo")
}

/// The same, of the calling thread's mount namespace (one it entered, say).
pub fn mounts_of_this_thread() -> io::Result<Vec<Mount>> {
    read("/proc/thread-self/mountinfo")
}

fn read(path: &str) -> io::Result<Vec<Mount>> {
    let table = fs::read(path)?;
    Ok(table.split(|&b| b == b'\n').filter_map(parse).collect())
}

/// `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER-OPTIONS`
fn parse(line: &[u8]) -> Option<Mount> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let number = |i: usize| std::str::from_utf8(fields.get(i)?).ok()?.parse().ok();
    let id = number(0)?;
    let parent = number(1)?;
    let point = PathBuf::from(OsString::from_vec(unescape(fields.get(4)?)));
    let dash = fields.iter().skip(6).position(|f| *f == b"-")? + 6;
    let text = |i: usize| {
        fields
            .get(i)
            .map(|f| String::from_utf8_lossy(&unescape(f)).into_owned())
    };
    Some(Mount {
        id,
        parent,
        point,
        fs_type: text(dash + 1)?,
        source: text(dash + 2)?,
        device: text(2)?,
        root: PathBuf::from(OsString::from_vec(unescape(fields.get(3)?))),
        shared: fields[6..dash].iter().any(|f| f.starts_with(b"shared:")),
    })
}

/// Whether any mount is in `dir` (not at `dir` itself).
pub fn has_mounts_in(table: &[Mount], dir: &Path) -> bool {
    table
        .iter()
        .any(|m| m.point != dir && m.point.starts_with(dir))
}

/// Whether the topmost mount at `point` is a bind of the folder under it onto itself, not
/// shared (private, or a slave): the same files show whether it is there or not.
pub fn is_private_self_bind(table: &[Mount], point: &Path) -> bool {
    let Some(top) = topmost_mount(table, point) else {
        return false;
    };
    // The mount the folder itself is on: the last made at the nearest folder above it.
    let below = point.parent().and_then(|parent| {
        parent
            .ancestors()
            .find_map(|folder| topmost_mount(table, folder))
    });
    let Some(below) = below else {
        return false;
    };
    let Ok(inside) = point.strip_prefix(&below.point) else {
        return false;
    };
    !top.shared && top.device == below.device && top.root == below.root.join(inside)
}

/// The ID of the mount at `path` (the topmost, if several are stacked there), in this mount
/// namespace; `None` also when the path cannot be resolved.
pub fn mount_id(path: &Path) -> Option<u64> {
    id_at(&fs::canonicalize(path).ok()?)
}

/// The same for a canonical path, taken as written: the last part is not followed.
///
/// Asked of the kernel (`statx` of the parent folder and of the name in it), not read from
/// the whole table: with thousands of workspaces the table is megabytes, and every open asks.
/// Nothing is looked up inside the folder itself, so no request reaches a FUSE daemon
/// mounted there (one not serving yet, or stuck). Where the kernel cannot say (before Linux
/// 5.8, a folder that cannot be opened), from the table, which needs nothing resolved.
pub fn id_at(canonical: &Path) -> Option<u64> {
    match kernel_id_at(canonical) {
        Ok(id) => id,
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(_) => topmost(&mounts().ok()?, canonical),
    }
}

/// The mount at `canonical`, if it is a mount point, from the kernel.
fn kernel_id_at(canonical: &Path) -> io::Result<Option<u64>> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    use std::os::unix::ffi::OsStrExt;
    let (Some(parent), Some(name)) = (canonical.parent(), canonical.file_name()) else {
        // `/`: a mount point of its own.
        let root = open(canonical, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?;
        return statx_mount(&root, c"").map(Some);
    };
    let name = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let dir = open(
        parent,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let above = statx_mount(&dir, c"")?;
    let here = statx_mount(&dir, &name)?;
    Ok((here != above).then_some(here))
}

/// The ID of the mount `name` (relative to `dir`; itself if empty) is on.
fn statx_mount(dir: &impl std::os::fd::AsRawFd, name: &std::ffi::CStr) -> io::Result<u64> {
    use nix::libc;
    // SAFETY: a zeroed statx is a valid value for the kernel to fill in.
    let mut out: libc::statx = unsafe { std::mem::zeroed() };
    // Cached attributes do: no request reaches a FUSE daemon for this.
    let mut flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | libc::AT_STATX_DONT_SYNC;
    if name.is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    // SAFETY: an open descriptor, a NUL-terminated name and a buffer of the kernel's layout.
    let rc = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags,
            libc::STATX_MNT_ID,
            &mut out,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if out.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    }
    Ok(out.stx_mnt_id)
}

/// The ID of the topmost mount at `point` in `table`.
pub fn topmost(table: &[Mount], point: &Path) -> Option<u64> {
    topmost_mount(table, point).map(|m| m.id)
}

/// The topmost mount at `point` in `table` (the last one made there).
pub fn topmost_mount<'a>(table: &'a [Mount], point: &Path) -> Option<&'a Mount> {
    table.iter().rev().find(|m| m.point == point)
}

/// Whether `path` is a mount point.
pub fn is_mount_point(path: &Path) -> bool {
    mount_id(path).is_some()
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' && i + 4 <= field.len() {
            let digits = std::str::from_utf8(&field[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_undone() {
        assert_eq!(unescape(br"/tmp/a\040b\134c"), br"/tmp/a b\c");
    }

    #[test]
    fn a_line_gives_its_id_point_type_and_source_past_optional_fields() {
        let line = br"812 29 0:77 / /var/lib/ch/workspaces/w\0401/mounts/skills ro,nosuid shared:5 master:2 - fuse cloud-harness ro,user_id=0";
        let m = parse(line).unwrap();
        assert_eq!((m.id, m.parent), (812, 29));
        assert_eq!(
            (m.device.as_str(), m.root.as_path(), m.shared),
            ("0:77", Path::new("/"), true)
        );
        assert_eq!(
            m.point,
            Path::new("/var/lib/ch/workspaces/w 1/mounts/skills")
        );
        assert!(m.is_ours());
        let other = parse(b"30 1 0:5 / /tmp rw - tmpfs cloud-harness rw").unwrap();
        assert!(!other.is_ours());
        assert!(parse(b"garbage").is_none());
    }

    #[test]
    fn a_bind_of_a_folder_onto_itself_is_told_from_another_file_system_there() {
        let table: Vec<Mount> = [
            &b"27 1 254:0 / / rw - ext4 /dev/vda rw"[..],
            b"40 27 254:0 /srv/h/workspaces /srv/h/workspaces rw - ext4 /dev/vda rw",
            b"41 27 254:0 /srv/k /srv/k rw - ext4 /dev/vda rw",
            b"42 27 254:0 /other /srv/k/workspaces rw - ext4 /dev/vda rw",
            b"43 27 0:50 / /srv/t/workspaces rw - tmpfs tmpfs rw",
            b"44 27 254:0 /srv/s/workspaces /srv/s/workspaces rw shared:9 - ext4 /dev/vda rw",
        ]
        .iter()
        .filter_map(|l| parse(l))
        .collect();
        assert!(is_private_self_bind(&table, Path::new("/srv/h/workspaces")));
        // A bind of another folder, another file system, a shared one, no mount at all.
        assert!(!is_private_self_bind(
            &table,
            Path::new("/srv/k/workspaces")
        ));
        assert!(!is_private_self_bind(
            &table,
            Path::new("/srv/t/workspaces")
        ));
        assert!(!is_private_self_bind(
            &table,
            Path::new("/srv/s/workspaces")
        ));
        assert!(!is_private_self_bind(
            &table,
            Path::new("/srv/x/workspaces")
        ));
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_plain_folder_is_not() {
        assert!(is_mount_point(Path::new("/")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(&dir.path().join("missing")));
        std::fs::create_dir(dir.path().join("plain")).unwrap();
        assert!(!is_mount_point(&dir.path().join("plain")));
    }

    #[test]
    fn the_kernel_names_the_same_mount_as_the_table_at_every_mount_point() {
        let table = mounts().unwrap();
        let mut compared = 0;
        for m in &table {
            let Some(top) = topmost_mount(&table, &m.point) else {
                continue;
            };
            // Where the kernel names a mount there (not a file; not where a later mount
            // over a folder above hides this one).
            if let (Ok(Some(kernel)), true) = (kernel_id_at(&m.point), top.id == m.id) {
                assert_eq!(kernel, m.id, "{}", m.point.display());
                compared += 1;
            }
        }
        // Every machine has `/` and a folder or two mounted; a kernel before 5.8 says none.
        let supported = kernel_id_at(Path::new("/")).is_ok();
        assert!(
            compared >= 1 || !supported,
            "no mount point compared: {table:?}"
        );
    }
}

//! This mount namespace's mount table (`/proc/self/mountinfo`): whether a folder is a mount
//! point, and which mount it is.

use std::fs;
use std::path::Path;

/// The ID of the mount at `path` (the topmost, if several are stacked there), in this mount
/// namespace; `None` also when the path cannot be resolved.
pub fn mount_id(path: &Path) -> Option<u64> {
    id_at(&fs::canonicalize(path).ok()?)
}

/// The same for a canonical path, taken as written: nothing is resolved, so it answers for a
/// mount whose daemon is gone (which answers `ENOTCONN` to what its caches do not hold).
pub fn id_at(canonical: &Path) -> Option<u64> {
    let wanted = canonical.to_string_lossy();
    let table = fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let id = fields.next()?.parse().ok()?;
        let point = fields.nth(3)?;
        (unescape(point) == wanted).then_some(id)
    })
}

/// Whether `path` is a mount point.
pub fn is_mount_point(path: &Path) -> bool {
    mount_id(path).is_some()
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_are_undone() {
        assert_eq!(super::unescape(r"/tmp/a\040b\134c"), r"/tmp/a b\c");
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_plain_folder_is_not() {
        assert!(super::is_mount_point(std::path::Path::new("/")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!super::is_mount_point(&dir.path().join("missing")));
    }
}

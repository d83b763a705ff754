//! The unmount guard: a small process that outlives a killed daemon and detaches its mounts.
//! fusermount's `auto_unmount` does not always: before unmounting it opens the mount point to
//! see whether the file system is gone, and once the kernel opens directories without asking
//! (zero-message opendir) that open succeeds on a dead mount, so the mount stays, answering
//! `ENOTCONN` to whatever its caches do not hold.
//!
//! One guard serves all the mounts of a process (`cloud-harness mount` has one, `serve` one
//! for every workspace's): `<program> mount-guard` reads records from a pipe that only the
//! daemon holds open — `+ID PATH` when a mount is made, `-ID` when it is unmounted, each ended
//! by a NUL — and at end of file (the daemon exited, however it died) detaches every mount
//! still named, if the mount at that path is still the one of that ID (not one made there
//! since).

use crate::mount_table;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{self, BufRead, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

/// A record longer than this (a path past `PATH_MAX` and its ID) is not one of ours.
const MAX_RECORD: u64 = 4096 + 32;
/// Mounts one guard keeps at most: far beyond what a server holds (two per workspace).
const MAX_MOUNTS: usize = 1 << 20;

/// The daemon's side: the guard process, started at the first mount it is told of.
pub struct Guards {
    program: PathBuf,
    running: Mutex<Option<Running>>,
}

struct Running {
    pipe: ChildStdin,
    child: Child,
}

impl Guards {
    /// Guards run as `program mount-guard` (this program's own binary).
    pub fn new(program: PathBuf) -> Guards {
        Guards {
            program,
            running: Mutex::new(None),
        }
    }

    /// Has the mount now at `mountpoint` detached if this process dies before [`Self::forget`];
    /// its mount ID.
    pub fn watch(&self, mountpoint: &Path) -> io::Result<u64> {
        // The folder it is in, resolved: the mount itself is not asked (it may not serve yet).
        let parent = mountpoint.parent().unwrap_or(Path::new("/"));
        let name = mountpoint
            .file_name()
            .ok_or_else(|| io::Error::other(format!("{} names no folder", mountpoint.display())))?;
        let point = std::fs::canonicalize(parent)?.join(name);
        let id = mount_table::id_at(&point)
            .ok_or_else(|| io::Error::other(format!("{} is not a mount point", point.display())))?;
        let mut record = format!("+{id} ").into_bytes();
        record.extend_from_slice(point.as_os_str().as_bytes());
        self.send(&record)?;
        Ok(id)
    }

    /// The mount of `id` was unmounted: the guard leaves that path alone from now on.
    pub fn forget(&self, id: u64) {
        if let Err(e) = self.send(format!("-{id}").as_bytes()) {
            tracing::warn!(error = %e, "the unmount guard was not told of an unmount");
        }
    }

    fn send(&self, record: &[u8]) -> io::Result<()> {
        let mut running = self.running.lock().expect("guard lock");
        if running.is_none() {
            let mut child = Command::new(&self.program)
                .arg("mount-guard")
                .current_dir("/")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()?;
            let pipe = child.stdin.take().expect("a piped stdin");
            *running = Some(Running { pipe, child });
        }
        let r = running.as_mut().expect("started above");
        let mut bytes = record.to_vec();
        bytes.push(0);
        let written = r.pipe.write_all(&bytes);
        if written.is_err() {
            // The guard is gone (killed by someone): the next record starts another, which
            // is told only of the mounts made from then on.
            if let Some(mut r) = running.take() {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
        written
    }
}

impl Drop for Guards {
    /// After the daemon's own unmounts: the guard finds nothing left to detach, and ends.
    fn drop(&mut self) {
        if let Some(Running { pipe, mut child }) =
            self.running.get_mut().ok().and_then(Option::take)
        {
            drop(pipe);
            let _ = child.wait();
        }
    }
}

/// The guard's side: reads records from `input` until end of file, then detaches every mount
/// still named. How many it detached.
pub fn watch(input: impl Read) -> io::Result<usize> {
    let mounts = named(input)?;
    let mut detached = 0;
    // The newest first: a mount made inside another goes before it.
    for (id, point) in mounts.into_iter().rev() {
        if mount_table::id_at(&point) != Some(id) {
            continue; // unmounted already, or someone else's mount now
        }
        match crate::fuse::unmount(&point) {
            Ok(()) => detached += 1,
            Err(e) => eprintln!("cloud-harness: detaching {}: {e}", point.display()),
        }
    }
    Ok(detached)
}

/// The mounts the records name at the end of `input`.
fn named(input: impl Read) -> io::Result<BTreeMap<u64, PathBuf>> {
    let mut mounts = BTreeMap::new();
    let mut input = io::BufReader::new(input);
    let mut record = Vec::new();
    loop {
        record.clear();
        match (&mut input).take(MAX_RECORD).read_until(0, &mut record) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        if record.pop() != Some(0) {
            // Too long, or cut by the end of the input: skip to the next record.
            if input.skip_until(0)? == 0 {
                break;
            }
            continue;
        }
        match parse(&record) {
            Some(Record::Add(id, path)) if mounts.len() < MAX_MOUNTS => {
                mounts.insert(id, path);
            }
            Some(Record::Remove(id)) => {
                mounts.remove(&id);
            }
            _ => {}
        }
    }
    Ok(mounts)
}

enum Record {
    Add(u64, PathBuf),
    Remove(u64),
}

fn parse(record: &[u8]) -> Option<Record> {
    let (&sign, rest) = record.split_first()?;
    match sign {
        b'+' => {
            let space = rest.iter().position(|&b| b == b' ')?;
            let id = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
            let path = PathBuf::from(OsString::from_vec(rest[space + 1..].to_vec()));
            path.is_absolute().then_some(Record::Add(id, path))
        }
        b'-' => Some(Record::Remove(
            std::str::from_utf8(rest).ok()?.parse().ok()?,
        )),
        _ => None,
    }
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
        input.extend_from_slice(b"\0-7\0+9 /nowhere/b\0");
        input.extend_from_slice(b"garbage\0+10 /nowhere/c"); // cut by the end
        assert_eq!(
            named(&input[..]).unwrap().into_iter().collect::<Vec<_>>(),
            vec![(9, PathBuf::from("/nowhere/b"))]
        );
        // Nothing named is mounted: the guard detaches nothing and ends.
        assert_eq!(watch(&input[..]).unwrap(), 0);
    }
}

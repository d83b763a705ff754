//! Importing a directory into the store.

use super::digest::Digest;
use super::hashed;
use super::store::{Store, Writer};
use super::tree::{Entry, Kind, Tree};
use crate::walk::{Listing, Place};
use cloud_harness_error::{Error, Result};
use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, OFlag};
use nix::sys::stat::Mode;
use serde::Serialize;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Ceilings for one import. A breach is a TOO_LARGE error naming the path and the limit.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Entries (files, links, folders, and what a lenient import leaves out), in all: each
    /// counted as the kernel lists it.
    pub max_files: u64,
    pub max_bytes: u64,
    pub max_file_bytes: u64,
    pub max_depth: usize,
    /// A project's own folders: what cannot be a skill's file (a FIFO, a socket, a device), a
    /// folder deeper than `max_depth` and another file system mounted inside are left out,
    /// each said in [`Imported::left_out`], instead of failing the import.
    pub lenient: bool,
}

impl Default for Limits {
    /// Generous ceilings for local directories the operator points at; toolkits fetched from
    /// the network get the tighter staging limits.
    fn default() -> Self {
        Limits {
            max_files: 200_000,
            max_bytes: 8 << 30,
            max_file_bytes: 2 << 30,
            max_depth: 64,
            lenient: false,
        }
    }
}

impl Limits {
    /// Ceilings for a project's own folders (hostile, like any third-party tree): those of a
    /// fetched toolkit, and what no skill can hold is left out.
    pub const PROJECT: Limits = Limits {
        max_files: 20_000,
        max_bytes: 256 << 20,
        max_file_bytes: 32 << 20,
        max_depth: 32,
        lenient: true,
    };
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Imported {
    pub digest: Digest,
    pub files: u64,
    pub bytes: u64,
    /// What a lenient import left out: each path (from the imported folder) and why, the
    /// first [`MAX_LEFT_OUT`] of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<(PathBuf, String)>,
    /// How many more it left out.
    #[serde(skip_serializing_if = "is_zero")]
    pub left_out_more: u64,
    /// Files not read again: unchanged since an earlier import read them.
    #[serde(skip)]
    pub unchanged: u64,
}

/// Parts left out that an import names (each becomes a warning kept with a generation);
/// past these, it counts them.
pub const MAX_LEFT_OUT: usize = 100;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Store {
    /// Imports the directory at `path` (following `path` itself if it is a symlink, nothing
    /// below it) and publishes it. Regular files keep their executable bit, symlinks are kept
    /// as data; anything else is an INVALID_ARGUMENT error naming its path (or, with
    /// [`Limits::lenient`], left out), and then nothing of the import is published.
    pub fn import_dir(&self, path: &Path, limits: &Limits) -> Result<Imported> {
        let dir = open_dir(path)?;
        self.import_fd(dir, path, limits)
    }

    /// [`Store::import_dir`] of a directory already open (`shown` names it in errors).
    pub fn import_fd(&self, dir: OwnedFd, shown: &Path, limits: &Limits) -> Result<Imported> {
        let mut writer = self.writer()?;
        let imported = import_fd(&mut writer, dir, shown, limits)?;
        writer.commit()?;
        Ok(imported)
    }
}

/// Opens the directory at `path` for an import, following `path` itself if it is a link.
pub fn open_dir(path: &Path) -> Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ENOTDIR => Error::invalid(format!("{} is not a directory", path.display())),
        e => Error::io(path, e.into()),
    })
}

/// Imports into an open batch; the caller commits.
pub fn import_dir(writer: &mut Writer<'_>, path: &Path, limits: &Limits) -> Result<Imported> {
    import_fd(writer, open_dir(path)?, path, limits)
}

/// Imports the open directory `dir` into an open batch. The walk goes by file descriptor,
/// each step `openat` with `O_NOFOLLOW` from its parent: a tree that changes meanwhile (a live
/// project an executor writes) can make the import fail, never lead it anywhere else. It keeps
/// a stack of its own (no recursion), one descriptor per level.
pub fn import_fd(
    writer: &mut Writer<'_>,
    dir: OwnedFd,
    shown: &Path,
    limits: &Limits,
) -> Result<Imported> {
    let home = Place::of(&dir).map_err(|e| Error::io(shown, e.into()))?;
    let mut walk = Walk {
        writer,
        limits,
        root: shown,
        home,
        files: 0,
        entries: 0,
        bytes: 0,
        left_out: Vec::new(),
        left_out_more: 0,
        unchanged: 0,
    };
    let digest = walk.tree(dir)?;
    Ok(Imported {
        digest,
        files: walk.files,
        bytes: walk.bytes,
        left_out: walk.left_out,
        left_out_more: walk.left_out_more,
        unchanged: walk.unchanged,
    })
}

struct Walk<'w, 's> {
    writer: &'w mut Writer<'s>,
    limits: &'w Limits,
    root: &'w Path,
    /// Where the imported folder is: a folder elsewhere is a mount inside it.
    home: Place,
    files: u64,
    entries: u64,
    bytes: u64,
    left_out: Vec<(PathBuf, String)>,
    left_out_more: u64,
    unchanged: u64,
}

/// A step of the walk found something other than what the listing said.
fn changed(path: &Path) -> Error {
    Error::invalid(format!("{}: changed during the import", path.display()))
        .with_details(serde_json::json!({ "path": path.to_string_lossy() }))
}

/// A folder being imported: what is left of its listing and the entries made so far.
struct Level {
    fd: OwnedFd,
    path: PathBuf,
    depth: usize,
    /// Its name in the level below (none for the root).
    name: Option<String>,
    /// What is left of its listing, read from the kernel as the walk goes.
    pending: Listing,
    entries: Vec<Entry>,
}

impl Walk<'_, '_> {
    /// The tree of the folder `root`, each folder's tree put once all it holds is.
    fn tree(&mut self, root: OwnedFd) -> Result<Digest> {
        let pending = self.list(&root, self.root)?;
        let mut stack = vec![Level {
            fd: root,
            path: self.root.to_path_buf(),
            depth: 0,
            name: None,
            pending,
            entries: Vec::new(),
        }];
        loop {
            let level = stack.last_mut().expect("a level");
            let next = level
                .pending
                .next_in(&level.fd)
                .transpose()
                .map_err(|e| Error::io(&level.path, e.into()))?;
            let Some((raw, ftype)) = next else {
                let done = stack.pop().expect("a level");
                let digest = self.writer.put_tree(&Tree::new(done.entries)?)?;
                match stack.last_mut() {
                    Some(parent) => parent.entries.push(Entry {
                        name: done.name.expect("a folder below the root has a name"),
                        kind: Kind::Tree,
                        size: 0,
                        digest,
                    }),
                    None => return Ok(digest),
                }
                continue;
            };
            let child = level.path.join(&raw);
            // Every entry listed counts, what is left out too: a folder of a million FIFOs
            // is refused at the limit, never walked (nor said) whole.
            self.count(&child)?;
            let name = entry_name(&raw, &child)?;
            let entry = match ftype {
                Type::Directory => {
                    let depth = level.depth + 1;
                    let max_depth = self.limits.max_depth.min(super::tree::MAX_DEPTH);
                    if depth > max_depth {
                        let why = format!("nested deeper than {max_depth} folders");
                        if self.leave_out(&child, why) {
                            continue;
                        }
                        return Err(Error::too_large(format!(
                            "{}: deeper than the limit of {max_depth} levels",
                            child.display(),
                        )));
                    }
                    let sub = match crate::walk::open_folder(&level.fd, &raw) {
                        Ok(sub) => sub,
                        Err(Errno::ELOOP | Errno::ENOTDIR) => return Err(changed(&child)),
                        Err(e) => return Err(Error::io(&child, e.into())),
                    };
                    if self.limits.lenient {
                        let place = Place::of(&sub).map_err(|e| Error::io(&child, e.into()))?;
                        if !place.same_mount(&self.home) {
                            self.leave_out(&child, "another file system is mounted there".into());
                            continue;
                        }
                    }
                    let pending = self.list(&sub, &child)?;
                    stack.push(Level {
                        fd: sub,
                        path: child,
                        depth,
                        name: Some(name),
                        pending,
                        entries: Vec::new(),
                    });
                    continue;
                }
                Type::Symlink => {
                    let target = match readlinkat(&level.fd, raw.as_os_str()) {
                        Ok(t) => t,
                        Err(Errno::EINVAL) => return Err(changed(&child)),
                        Err(e) => return Err(Error::io(&child, e.into())),
                    };
                    let bytes = target.as_bytes();
                    self.add(&child, bytes.len() as u64)?;
                    let digest = self.writer.put_blob(bytes)?;
                    Entry {
                        name,
                        kind: Kind::Symlink,
                        size: bytes.len() as u64,
                        digest,
                    }
                }
                Type::File => self.file(&level.fd, &raw, &child, name)?,
                other => {
                    let what = format!(
                        "a {} is not a regular file, directory or symlink",
                        describe(other)
                    );
                    if self.leave_out(&child, what.clone()) {
                        continue;
                    }
                    return Err(Error::invalid(format!("{}: {what}", child.display()))
                        .with_details(serde_json::json!({ "path": child.to_string_lossy() })));
                }
            };
            stack.last_mut().expect("a level").entries.push(entry);
        }
    }

    /// With [`Limits::lenient`], notes `path` as left out (and says so: true).
    fn leave_out(&mut self, path: &Path, why: String) -> bool {
        if !self.limits.lenient {
            return false;
        }
        if self.left_out.len() >= MAX_LEFT_OUT {
            self.left_out_more += 1;
            return true;
        }
        let from_root = path.strip_prefix(self.root).unwrap_or(path).to_path_buf();
        self.left_out.push((from_root, why));
        true
    }

    /// The entries of the folder `fd` (at `path`), with their types, as they are read.
    fn list(&self, fd: &OwnedFd, path: &Path) -> Result<Listing> {
        Listing::of(fd).map_err(|e| Error::io(path, e.into()))
    }

    fn file(&mut self, dir: &OwnedFd, raw: &OsStr, path: &Path, name: String) -> Result<Entry> {
        // O_NOFOLLOW: a file swapped for a symlink after the listing is refused, not followed;
        // O_NONBLOCK: one swapped for a FIFO does not hang the open.
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let file = match openat(dir, raw, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::ELOOP) => return Err(changed(path)),
            Err(e) => return Err(Error::io(path, e.into())),
        };
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(changed(path));
        }
        if meta.len() > self.limits.max_file_bytes {
            return Err(self.file_too_large(path));
        }
        self.add(path, meta.len())?;
        let kind = if meta.permissions().mode() & 0o111 != 0 {
            Kind::Executable
        } else {
            Kind::File
        };
        // Unchanged since an import read it, and its blob still stored: not read again.
        if let Some(digest) = hashed::digest_of(&meta).filter(|d| self.writer.has_blob(d)) {
            self.unchanged += 1;
            return Ok(Entry {
                name,
                kind,
                size: meta.len(),
                digest,
            });
        }
        let read_at = SystemTime::now();
        let (digest, size) = self
            .writer
            .put_blob_from(file, meta.len(), self.limits.max_file_bytes)
            .map_err(|e| match e.code {
                cloud_harness_error::Code::TooLarge => self.file_too_large(path),
                _ => e.context(path.display()),
            })?;
        if size == meta.len() {
            hashed::record(&meta, digest, read_at);
        } else {
            self.bytes = self.bytes - meta.len() + size;
        }
        Ok(Entry {
            name,
            kind,
            size,
            digest,
        })
    }

    fn file_too_large(&self, path: &Path) -> Error {
        Error::too_large(format!(
            "{}: larger than the limit of {} bytes per file",
            path.display(),
            self.limits.max_file_bytes
        ))
        .with_details(serde_json::json!({
            "path": path.to_string_lossy(),
            "limit": self.limits.max_file_bytes,
        }))
    }

    /// Counts one entry listed, whatever it is and whether it is kept.
    fn count(&mut self, path: &Path) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_files {
            return Err(Error::too_large(format!(
                "{}: more than the limit of {} files and folders",
                path.display(),
                self.limits.max_files
            ))
            .with_details(serde_json::json!({
                "path": path.to_string_lossy(),
                "limit": self.limits.max_files,
            })));
        }
        Ok(())
    }

    /// Counts a file or link kept, of `bytes`.
    fn add(&mut self, path: &Path, bytes: u64) -> Result<()> {
        self.files += 1;
        self.bytes += bytes;
        if self.bytes > self.limits.max_bytes {
            return Err(Error::too_large(format!(
                "{}: more than the limit of {} bytes in all",
                path.display(),
                self.limits.max_bytes
            )));
        }
        Ok(())
    }
}

fn entry_name(name: &OsStr, path: &Path) -> Result<String> {
    name.to_str().map(str::to_owned).ok_or_else(|| {
        Error::invalid(format!("{}: the name is not valid UTF-8", path.display()))
            .with_details(serde_json::json!({ "path": path.to_string_lossy() }))
    })
}

fn describe(ftype: Type) -> &'static str {
    match ftype {
        Type::Fifo => "FIFO",
        Type::Socket => "socket",
        Type::BlockDevice => "block device",
        Type::CharacterDevice => "character device",
        _ => "special file",
    }
}

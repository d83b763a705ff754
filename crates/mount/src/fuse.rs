//! The FUSE adapter: each handler calls one function of [`Namespace`] and translates its value
//! or errno for the kernel. Every call that would write gets `EROFS`.
//!
//! Caching, as measured on this kind of machine (see docs/benchmarks.md): long
//! entry and attribute TTLs with explicit invalidation on a generation change; negative
//! entries (inode 0) cached as long; readdirplus; parallel directory operations; several
//! worker threads with their own device fd; zero-message open for files (the kernel then keeps
//! their pages, safe because a file inode's content never changes) and for directories (the
//! kernel then caches listings, `FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`, and a warm walk sends
//! nothing); readdir offsets name their listing, so a reader keeps the listing of the
//! generation it started (`namespace::listing`).

use crate::stats::{Op, Stats, STATS};
use cloud_harness_skills::namespace::{Attr, FileKind, Invalidation, Namespace, XATTR_PREFIX};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, MountOption, Notifier, OpenFlags, ReplyAttr,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyXattr, Request, Session, SessionACL,
};
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Entries and attributes change only with a generation, which invalidates them explicitly.
const TTL: Duration = Duration::from_secs(24 * 3600);

fn errno(e: nix::errno::Errno) -> Errno {
    Errno::from_i32(e as i32)
}

pub struct SkillsFs {
    ns: Arc<Namespace>,
    /// The kernel opens directories without asking (`FUSE_NO_OPENDIR_SUPPORT`).
    no_opendir: bool,
    uid: u32,
    gid: u32,
    time: SystemTime,
}

impl SkillsFs {
    pub fn new(ns: Arc<Namespace>) -> SkillsFs {
        SkillsFs {
            ns,
            no_opendir: false,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            time: SystemTime::now(),
        }
    }

    fn attr(&self, a: Attr) -> FileAttr {
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: self.time,
            mtime: self.time,
            ctime: self.time,
            crtime: self.time,
            kind: kind_of(&a),
            perm: a.perm,
            // 1 for directories too: "unknown", so no tool skips subdirectories by link count.
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn negative(&self) -> FileAttr {
        self.attr(Attr {
            ino: 0,
            kind: FileKind::File,
            size: 0,
            perm: 0,
        })
    }
}

fn kind_of(a: &Attr) -> FileType {
    match a.kind {
        FileKind::Directory => FileType::Directory,
        FileKind::File => FileType::RegularFile,
        FileKind::Symlink => FileType::Symlink,
    }
}

impl Filesystem for SkillsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Readdirplus on every page, not only the first (`FUSE_READDIRPLUS_AUTO`): walkers
        // and searchers stat or open what they list, and an entry that came with its
        // attributes needs no lookup of its own.
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_NO_OPEN_SUPPORT
            | InitFlags::FUSE_NO_OPENDIR_SUPPORT;
        let supported = config.capabilities() & wanted;
        let _ = config.add_capabilities(supported);
        self.no_opendir = supported.contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        STATS.count(Op::Lookup);
        let Some(name) = name.to_str() else {
            Stats::add(&STATS.negative_lookups, 1);
            return reply.entry(&TTL, &self.negative(), Generation(0));
        };
        match self.ns.lookup(parent.0, name) {
            Ok(Some(a)) => reply.entry(&TTL, &self.attr(a), Generation(0)),
            Ok(None) => {
                Stats::add(&STATS.negative_lookups, 1);
                reply.entry(&TTL, &self.negative(), Generation(0))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        STATS.count(Op::Forget);
        self.ns.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        STATS.count(Op::Getattr);
        match self.ns.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &self.attr(a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        STATS.count(Op::Readlink);
        match self.ns.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Zero-message open: after this ENOSYS the kernel opens files without asking, keeping
    /// their cached pages (a file inode's content never changes).
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        STATS.count(Op::Read);
        match self.ns.read(ino.0, offset, size) {
            Ok(data) => {
                Stats::add(&STATS.read_bytes, data.len() as u64);
                reply.data(&data)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Zero-message opendir: after this ENOSYS the kernel opens directories without asking
    /// (and never sends releasedir), caching their listings. A kernel without that feature
    /// gets a handle that means nothing: listings go by offset, not by handle.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        STATS.count(Op::Opendir);
        if self.no_opendir {
            return reply.error(Errno::ENOSYS);
        }
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
        )
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        STATS.count(Op::Readdir);
        let (listing, start) = match self.ns.listing_at(ino.0, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(e)),
        };
        // Positions: 0 is ".", 1 is "..", then the children; an entry's offset is the
        // cookie of the position of the next one.
        let total = listing.children.len() as u64 + 2;
        for pos in start..total {
            let next = listing.cookie(pos + 1);
            let full = match pos {
                0 => reply.add(ino, next, FileType::Directory, "."),
                // The kernel answers ".." itself; the number here is not used.
                1 => reply.add(ino, next, FileType::Directory, ".."),
                _ => {
                    let c = &listing.children[(pos - 2) as usize];
                    reply.add(INodeNo(c.attr.ino), next, kind_of(&c.attr), &c.name)
                }
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        STATS.count(Op::Readdirplus);
        let (listing, start) = match self.ns.listing_at(ino.0, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(e)),
        };
        let total = listing.children.len() as u64 + 2;
        for pos in start..total {
            let next = listing.cookie(pos + 1);
            let full = match pos {
                0 | 1 => {
                    // The kernel links neither "." nor ".."; any directory's attributes do.
                    let attr = self
                        .ns
                        .getattr(ino.0)
                        .map(|a| self.attr(a))
                        .unwrap_or_else(|_| self.negative());
                    let name = if pos == 0 { "." } else { ".." };
                    reply.add(attr.ino, next, name, &TTL, &attr, Generation(0))
                }
                _ => {
                    let c = &listing.children[(pos - 2) as usize];
                    // Every entry the kernel receives is a lookup reference.
                    let attr = self.attr(self.ns.remember(c));
                    let full = reply.add(attr.ino, next, &c.name, &TTL, &attr, Generation(0));
                    if full {
                        self.ns.forget(attr.ino.0, 1);
                    }
                    full
                }
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// No file here is a device: "not a terminal" for every request (the kernel sends each
    /// ioctl, Python's `isatty` on every `open` among them, and does not remember the answer).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        STATS.count(Op::Ioctl);
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, self.ns.node_count() as u64, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        // No security labels, no POSIX ACLs: saying "not supported" (rather than "no such
        // attribute") lets tools such as `ls -l` stop asking for every file of the mount.
        let name_bytes = name.as_encoded_bytes();
        if name_bytes.starts_with(b"security.") || name_bytes.starts_with(b"system.") {
            return reply.error(Errno::EOPNOTSUPP);
        }
        if !name_bytes.starts_with(XATTR_PREFIX.as_bytes()) {
            return reply.error(Errno::NO_XATTR);
        }
        let attrs = match self.ns.xattrs(ino.0) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(e)),
        };
        match attrs.iter().find(|(k, _)| OsStr::new(k) == name) {
            None => reply.error(Errno::NO_XATTR),
            Some((_, v)) if size == 0 => reply.size(v.len() as u32),
            Some((_, v)) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Some((_, v)) => reply.data(v.as_bytes()),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let attrs = match self.ns.xattrs(ino.0) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(e)),
        };
        let mut names = Vec::new();
        for (k, _) in &attrs {
            names.extend_from_slice(k.as_bytes());
            names.push(0);
        }
        if size == 0 {
            reply.size(names.len() as u32);
        } else if names.len() > size as usize {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&names);
        }
    }

    // No call that would change the tree is implemented: the mount is `ro`, so the kernel
    // answers EROFS before any such request reaches this process (the mount tests try each).
}

#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Let every user read the mount (`allow_other`); otherwise root and the owner.
    pub allow_other: bool,
    pub threads: usize,
    /// fusermount's `auto_unmount`: a `fusermount3` process per mount for the mount's life,
    /// which detaches it if this process dies. Off where an unmount guard does that for all
    /// of a process's mounts (fuser never reaps those helpers: a server making thousands of
    /// mounts would keep a zombie process for each).
    pub auto_unmount: bool,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            allow_other: false,
            threads: 4,
            auto_unmount: true,
        }
    }
}

/// A mounted session, not yet serving.
pub struct Mounted {
    session: Session<SkillsFs>,
    pub notifier: Notifier,
}

/// Mounts `ns` read-only at `mountpoint`. With `auto_unmount`, fusermount unmounts it if this
/// process dies, so a killed daemon leaves no hung mount; without, the caller's unmount guard
/// must be told of it.
pub fn mount(ns: Arc<Namespace>, mountpoint: &Path, cfg: &MountConfig) -> io::Result<Mounted> {
    clear_stale_mount(mountpoint);
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName("cloud-harness".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    if cfg.auto_unmount {
        config.mount_options.push(MountOption::AutoUnmount);
    }
    config.acl = if cfg.allow_other {
        SessionACL::All
    } else {
        SessionACL::RootAndOwner
    };
    config.n_threads = Some(cfg.threads.max(1));
    config.clone_fd = true;
    let session = Session::new(SkillsFs::new(ns), mountpoint, &config)?;
    let notifier = session.notifier();
    Ok(Mounted { session, notifier })
}

impl Mounted {
    /// Serves requests until the file system is unmounted.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

/// Unmounts `mountpoint`, which ends [`Mounted::run`]. (`auto_unmount` only covers a daemon
/// that died: fusermount leaves a live file system alone.) A busy mount is detached lazily; one
/// already gone (detached by someone else, `umount -l`) is left as it is.
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    use nix::mount::{umount2, MntFlags};
    // A symlink put where the mount was is not followed to some other mount.
    let flags = MntFlags::UMOUNT_NOFOLLOW;
    match umount2(mountpoint, flags) {
        Ok(()) => Ok(()),
        // Not a mount point (any more), or no such folder: nothing is mounted there.
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
        Err(nix::errno::Errno::EBUSY) => {
            umount2(mountpoint, flags | MntFlags::MNT_DETACH).map_err(io::Error::from)
        }
        // Not root: the setuid helper may unmount what this user mounted.
        Err(nix::errno::Errno::EPERM) => {
            let status = lazy_fusermount(mountpoint)?;
            if status.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!("fusermount3 -u failed: {status}")))
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// A mount point left behind by a daemon that died without cleaning up answers ENOTCONN;
/// detach it so mounting again works.
fn clear_stale_mount(mountpoint: &Path) {
    if let Err(e) = std::fs::metadata(mountpoint) {
        if e.raw_os_error() == Some(nix::libc::ENOTCONN) {
            tracing::warn!(mountpoint = %mountpoint.display(), "detaching a stale mount");
            let _ = lazy_fusermount(mountpoint);
            let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// `fusermount3 -u -z`: the setuid helper detaches what this user mounted, even when busy.
fn lazy_fusermount(mountpoint: &Path) -> io::Result<std::process::ExitStatus> {
    std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mountpoint)
        .status()
}

/// Tells the kernel what a generation change made stale. Errors (an entry the kernel no
/// longer has) are expected and ignored.
pub fn invalidate(notifier: &Notifier, items: &[Invalidation]) {
    for item in items {
        let result = match item {
            Invalidation::Entry { parent, name } => {
                notifier.inval_entry(INodeNo(*parent), OsStr::new(name))
            }
            Invalidation::Inode { ino } => notifier.inval_inode(INodeNo(*ino), 0, 0),
        };
        if let Err(e) = result {
            tracing::debug!(?item, error = %e, "invalidation not applied");
        }
    }
}

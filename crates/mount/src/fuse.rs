//! The FUSE adapter: each request is answered by one function of [`Namespace`], its value or
//! errno put in the kernel's layout ([`crate::abi`]). Every call that would write gets
//! `EROFS`. Sessions are served by the process's one pool of threads ([`crate::pool`]).
//!
//! Caching, as measured on this kind of machine (see docs/benchmarks.md): long
//! entry and attribute TTLs with explicit invalidation on a generation change; negative
//! entries (inode 0) cached as long; readdirplus; parallel directory operations;
//! zero-message open for files (the kernel then keeps their pages, safe because a file
//! inode's content never changes) and for directories (the kernel then caches listings,
//! `FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`, and a warm walk sends nothing); readdir offsets name
//! their listing, so a reader keeps the listing of the generation it started
//! (`namespace::listing`).

use crate::abi::{self, op, Args, Attr as KAttr, Malformed, Out};
use crate::device::{self, Attach};
use crate::pool::{self, Answer, Session};
use crate::stats::{Op, Stats, STATS};
use cloud_harness_skills::generation::View;
use cloud_harness_skills::namespace::{Attr, FileKind, Invalidation, Namespace, XATTR_PREFIX};
use nix::errno::Errno;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Entries and attributes change only with a generation, which invalidates them explicitly.
const TTL: u64 = 24 * 3600;

/// The largest read the kernel may ask in one request (`max_pages`, 4 KiB pages): the
/// readahead's size.
const MAX_READ: u32 = 1 << 20;

pub struct SkillsFs {
    ns: Arc<Namespace>,
    loads: Option<Loads>,
    /// The kernel opens files without asking (`FUSE_NO_OPEN_SUPPORT`).
    no_open: AtomicBool,
    /// The kernel opens directories without asking (`FUSE_NO_OPENDIR_SUPPORT`).
    no_opendir: AtomicBool,
    uid: u32,
    gid: u32,
    time: u64,
}

impl SkillsFs {
    pub fn new(ns: Arc<Namespace>, loads: Option<Loads>) -> SkillsFs {
        let time = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        SkillsFs {
            ns,
            loads,
            no_open: AtomicBool::new(false),
            no_opendir: AtomicBool::new(false),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            time,
        }
    }

    fn attr(&self, a: Attr) -> KAttr {
        let kind = match a.kind {
            FileKind::Directory => abi::S_IFDIR,
            FileKind::File => abi::S_IFREG,
            FileKind::Symlink => abi::S_IFLNK,
        };
        KAttr {
            ino: a.ino,
            size: a.size,
            mode: kind | u32::from(a.perm),
            uid: self.uid,
            gid: self.gid,
            time: self.time,
        }
    }

    fn negative(&self) -> KAttr {
        self.attr(Attr {
            ino: 0,
            kind: FileKind::File,
            size: 0,
            perm: 0,
        })
    }
}

/// A request's answer: the reply's bytes after the header, or an errno.
type Answered = Result<Out, Errno>;

fn malformed(_: Malformed) -> Errno {
    Errno::EIO
}

impl Answer for SkillsFs {
    fn answer(&self, session: &Session, request: &[u8]) {
        let (header, mut args) = match abi::parse(request) {
            Ok(parsed) => parsed,
            Err(e) => {
                // Without a whole header there is no request to reply to.
                tracing::warn!(error = ?e, "a malformed FUSE request");
                if request.len() >= abi::IN_HEADER {
                    let unique = u64::from_ne_bytes(request[8..16].try_into().unwrap_or([0; 8]));
                    session.reply(unique, -(Errno::EIO as i32), &[]);
                }
                return;
            }
        };
        let ino = header.nodeid;
        let answered = match header.opcode {
            // No reply to these.
            op::FORGET => {
                STATS.count(Op::Forget);
                if let Ok(n) = args.u64() {
                    self.ns.forget(ino, n);
                }
                return;
            }
            op::BATCH_FORGET => {
                STATS.count(Op::Forget);
                self.batch_forget(&mut args);
                return;
            }
            op::INIT => self.init(&mut args),
            op::LOOKUP => self.lookup(ino, &mut args),
            op::GETATTR => {
                STATS.count(Op::Getattr);
                self.ns.getattr(ino).map(|a| {
                    let mut out = Out::default();
                    out.attr_out(&self.attr(a), TTL);
                    out
                })
            }
            op::READLINK => {
                STATS.count(Op::Readlink);
                match self.ns.readlink(ino) {
                    Ok(target) => Ok(Out { bytes: target }),
                    Err(e) => Err(e),
                }
            }
            op::OPEN => self.open(),
            op::READ => self.read(ino, &mut args),
            op::OPENDIR => self.opendir(),
            op::READDIR => self.readdir(ino, &mut args, false),
            op::READDIRPLUS => self.readdir(ino, &mut args, true),
            op::RELEASE | op::RELEASEDIR | op::DESTROY => Ok(Out::default()),
            // No file here is a device: "not a terminal" for every request (the kernel sends
            // each ioctl, Python's `isatty` on every `open` among them, and does not
            // remember the answer).
            op::IOCTL => {
                STATS.count(Op::Ioctl);
                Err(Errno::ENOTTY)
            }
            op::STATFS => Ok(self.statfs()),
            op::GETXATTR => self.getxattr(ino, &mut args),
            op::LISTXATTR => self.listxattr(ino, &mut args),
            // ENOSYS: the kernel stops sending interrupts (nothing here waits long).
            op::INTERRUPT => Err(Errno::ENOSYS),
            o if op::WRITING.contains(&o) => Err(Errno::EROFS),
            // Flush, fsync, locks, access, poll, lseek...: "not implemented", which the
            // kernel remembers and answers itself from then on.
            _ => Err(Errno::ENOSYS),
        };
        match answered {
            Ok(out) => session.reply(header.unique, 0, &[&out.bytes]),
            Err(e) => session.reply(header.unique, -(e as i32), &[]),
        }
    }
}

impl SkillsFs {
    fn init(&self, args: &mut Args) -> Answered {
        let init = abi::init_in(args).map_err(malformed)?;
        if init.major != abi::MAJOR || init.minor < 23 {
            tracing::error!(
                major = init.major,
                minor = init.minor,
                "the kernel's FUSE protocol is too old"
            );
            return Err(Errno::EPROTO);
        }
        use abi::init_flag::*;
        // Readdirplus on every page, not only the first (no `FUSE_READDIRPLUS_AUTO`):
        // walkers and searchers stat or open what they list, and an entry that came with its
        // attributes needs no lookup of its own.
        let wanted = ASYNC_READ
            | BIG_WRITES
            | DO_READDIRPLUS
            | PARALLEL_DIROPS
            | CACHE_SYMLINKS
            | NO_OPEN_SUPPORT
            | NO_OPENDIR_SUPPORT
            | MAX_PAGES;
        let flags = init.flags & wanted;
        self.no_open
            .store(flags & NO_OPEN_SUPPORT != 0, Ordering::Relaxed);
        self.no_opendir
            .store(flags & NO_OPENDIR_SUPPORT != 0, Ordering::Relaxed);
        let mut out = Out::default();
        out.init(&abi::InitOut {
            max_readahead: init.max_readahead.min(MAX_READ),
            flags,
            max_write: 4096,
            max_pages: (MAX_READ / 4096) as u16,
        });
        Ok(out)
    }

    fn lookup(&self, parent: u64, args: &mut Args) -> Answered {
        STATS.count(Op::Lookup);
        let name = args.name().map_err(malformed)?;
        let mut out = Out::default();
        let Some(name) = name.to_str() else {
            Stats::add(&STATS.negative_lookups, 1);
            out.entry(&self.negative(), TTL);
            return Ok(out);
        };
        match self.ns.lookup(parent, name) {
            Ok(Some(a)) => out.entry(&self.attr(a), TTL),
            Ok(None) => {
                Stats::add(&STATS.negative_lookups, 1);
                out.entry(&self.negative(), TTL)
            }
            Err(e) => return Err(e),
        };
        Ok(out)
    }

    fn batch_forget(&self, args: &mut Args) {
        let Ok(count) = args.u32() else { return };
        if args.u32().is_err() {
            return;
        }
        // As many as the request holds, whatever its count says.
        for _ in 0..count {
            let (Ok(ino), Ok(n)) = (args.u64(), args.u64()) else {
                return;
            };
            self.ns.forget(ino, n);
        }
    }

    fn read(&self, ino: u64, args: &mut Args) -> Answered {
        STATS.count(Op::Read);
        let r = abi::read_in(args).map_err(malformed)?;
        let data = self.ns.read(ino, r.offset, r.size.min(MAX_READ))?;
        Stats::add(&STATS.read_bytes, data.len() as u64);
        if let (0, Some(loads)) = (r.offset, &self.loads) {
            if let Some((view, skill, rel)) = self.ns.skill_file(ino) {
                (loads.0)(view, &skill, &rel);
            }
        }
        Ok(Out { bytes: data })
    }

    /// Zero-message open: after this ENOSYS the kernel opens files without asking, keeping
    /// their cached pages (a file inode's content never changes). A kernel without that
    /// feature gets a handle that means nothing, and keeps the pages all the same.
    fn open(&self) -> Answered {
        if self.no_open.load(Ordering::Relaxed) {
            return Err(Errno::ENOSYS);
        }
        let mut out = Out::default();
        out.u64(0).u32(abi::FOPEN_KEEP_CACHE).u32(0);
        Ok(out)
    }

    /// Zero-message opendir: after this ENOSYS the kernel opens directories without asking
    /// (and never sends releasedir), caching their listings. A kernel without that feature
    /// gets a handle that means nothing: listings go by offset, not by handle.
    fn opendir(&self) -> Answered {
        STATS.count(Op::Opendir);
        if self.no_opendir.load(Ordering::Relaxed) {
            return Err(Errno::ENOSYS);
        }
        let mut out = Out::default();
        out.u64(0)
            .u32(abi::FOPEN_KEEP_CACHE | abi::FOPEN_CACHE_DIR)
            .u32(0);
        Ok(out)
    }

    fn readdir(&self, ino: u64, args: &mut Args, plus: bool) -> Answered {
        STATS.count(if plus { Op::Readdirplus } else { Op::Readdir });
        let r = abi::read_in(args).map_err(malformed)?;
        let limit = r.size.min(MAX_READ) as usize;
        let (listing, start) = self.ns.listing_at(ino, r.offset)?;
        let mut out = Out::default();
        // Positions: 0 is ".", 1 is "..", then the children; an entry's offset is the
        // cookie of the position of the next one.
        let total = listing.children.len() as u64 + 2;
        for pos in start..total {
            let next = listing.cookie(pos + 1);
            let added = match pos {
                0 | 1 => {
                    let name: &[u8] = if pos == 0 { b"." } else { b".." };
                    if plus {
                        // The kernel links neither "." nor ".."; any directory's attributes do.
                        let attr = self
                            .ns
                            .getattr(ino)
                            .map(|a| self.attr(a))
                            .unwrap_or_else(|_| self.negative());
                        out.direntplus(&attr, TTL, next, name, limit)
                    } else {
                        // The kernel answers ".." itself; the number here is not used.
                        out.dirent(ino, next, abi::S_IFDIR >> 12, name, limit)
                    }
                }
                _ => {
                    let c = &listing.children[(pos - 2) as usize];
                    if plus {
                        // Every entry the kernel receives is a lookup reference.
                        let attr = self.attr(self.ns.remember(c));
                        let added = out.direntplus(&attr, TTL, next, c.name.as_bytes(), limit);
                        if !added {
                            self.ns.forget(attr.ino, 1);
                        }
                        added
                    } else {
                        let attr = self.attr(c.attr);
                        out.dirent(attr.ino, next, attr.mode >> 12, c.name.as_bytes(), limit)
                    }
                }
            };
            if !added {
                break;
            }
        }
        Ok(out)
    }

    fn statfs(&self) -> Out {
        let mut out = Out::default();
        // blocks, free, available, files, free files
        out.u64(0).u64(0).u64(0);
        out.u64(self.ns.node_count() as u64).u64(0);
        // block size, longest name, fragment size, padding, spare
        out.u32(4096).u32(255).u32(4096).u32(0);
        out.bytes.extend_from_slice(&[0u8; 24]);
        out
    }

    fn getxattr(&self, ino: u64, args: &mut Args) -> Answered {
        let size = args.u32().map_err(malformed)?;
        args.u32().map_err(malformed)?;
        let name = args.name().map_err(malformed)?.as_encoded_bytes();
        // No security labels, no POSIX ACLs: saying "not supported" (rather than "no such
        // attribute") lets tools such as `ls -l` stop asking for every file of the mount.
        if name.starts_with(b"security.") || name.starts_with(b"system.") {
            return Err(Errno::EOPNOTSUPP);
        }
        if !name.starts_with(XATTR_PREFIX.as_bytes()) {
            return Err(Errno::ENODATA);
        }
        let attrs = self.ns.xattrs(ino)?;
        let value = attrs
            .iter()
            .find(|(k, _)| k.as_bytes() == name)
            .map(|(_, v)| v.as_bytes())
            .ok_or(Errno::ENODATA)?;
        sized(value, size)
    }

    fn listxattr(&self, ino: u64, args: &mut Args) -> Answered {
        let size = args.u32().map_err(malformed)?;
        let attrs = self.ns.xattrs(ino)?;
        let mut names = Vec::new();
        for (k, _) in &attrs {
            names.extend_from_slice(k.as_bytes());
            names.push(0);
        }
        sized(&names, size)
    }
}

/// An attribute's value (or list of names) for a caller with room for `size` bytes: with
/// none, only its length (`struct fuse_getxattr_out`).
fn sized(value: &[u8], size: u32) -> Answered {
    let mut out = Out::default();
    if size == 0 {
        out.u32(value.len() as u32).u32(0);
    } else if value.len() > size as usize {
        return Err(Errno::ERANGE);
    } else {
        out.bytes.extend_from_slice(value);
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Let every user read the mount (`allow_other`); otherwise root and the owner.
    pub allow_other: bool,
    /// The most of the pool's threads that answer this mount at once.
    pub threads: usize,
    /// fusermount's `auto_unmount`: a `fusermount3` process per mount for the mount's life,
    /// which detaches it if this process dies. Off where an unmount guard does that for all
    /// of a process's mounts.
    pub auto_unmount: bool,
    /// Told of each file's load ([`Loads`]), where usage is counted.
    pub loads: Option<Loads>,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            allow_other: false,
            threads: 4,
            auto_unmount: true,
            loads: None,
        }
    }
}

/// Told of each read of a skill's file from its start (offset 0) that reaches the daemon: its
/// view, skill and path inside the skill. The kernel keeps a file's pages once read (they
/// never change), so this is the file's load into the mount's cache, not each open: the
/// repeats cost nothing and are not seen.
#[derive(Clone)]
pub struct Loads(pub Arc<LoadHook>);

/// What [`Loads`] calls: the file's view, its skill and its path inside the skill.
pub type LoadHook = dyn Fn(View, &str, &str) + Send + Sync;

impl std::fmt::Debug for Loads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Loads")
    }
}

/// A mounted file system, served by the pool from the moment it is mounted.
pub struct Mounted {
    session: Arc<Session>,
}

/// Mounts `ns` read-only at `mountpoint`. With `auto_unmount`, fusermount unmounts it if this
/// process dies, so a killed daemon leaves no hung mount; without, the caller's unmount guard
/// must be told of it.
pub fn mount(ns: Arc<Namespace>, mountpoint: &Path, cfg: &MountConfig) -> io::Result<Mounted> {
    device::clear_stale(mountpoint);
    let how = Attach {
        allow_other: cfg.allow_other,
        auto_unmount: cfg.auto_unmount,
    };
    let device = device::attach(mountpoint, &how)?;
    let fs = SkillsFs::new(ns, cfg.loads.clone());
    match pool::serve(device, Box::new(fs), cfg.threads) {
        Ok(session) => Ok(Mounted { session }),
        Err(e) => {
            // Mounted, but nothing would serve it: not left hanging.
            let _ = unmount(mountpoint);
            Err(e)
        }
    }
}

impl Mounted {
    /// What tells the kernel of changes (a generation's invalidations).
    pub fn notifier(&self) -> Notifier {
        Notifier {
            session: self.session.clone(),
        }
    }

    /// Whether the kernel still sends it requests (false once unmounted).
    pub fn is_served(&self) -> bool {
        self.session.is_served()
    }

    /// Waits up to `wait` (forever: `None`) for the file system to be unmounted; whether it
    /// was.
    pub fn wait_end(&self, wait: Option<Duration>) -> bool {
        self.session.wait_end(wait)
    }
}

/// Unmounts `mountpoint`, which ends its session. A busy mount is detached lazily; one
/// already gone is left as it is.
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    device::detach(mountpoint)
}

/// Tells a mount's kernel side what changed.
#[derive(Clone)]
pub struct Notifier {
    session: Arc<Session>,
}

/// Tells the kernel what a generation change made stale. Errors (an entry the kernel no
/// longer has) are expected and ignored.
pub fn invalidate(notifier: &Notifier, items: &[Invalidation]) {
    for item in items {
        let result = match item {
            Invalidation::Entry { parent, name } => {
                // `struct fuse_notify_inval_entry_out`, then the name and its NUL.
                let mut out = Out::default();
                out.u64(*parent).u32(name.len() as u32).u32(0);
                notifier.session.notify(
                    abi::NOTIFY_INVAL_ENTRY,
                    &[&out.bytes, name.as_bytes(), b"\0"],
                )
            }
            Invalidation::Inode { ino } => {
                // `struct fuse_notify_inval_inode_out`: the whole of its cached data.
                let mut out = Out::default();
                out.u64(*ino).u64(0).u64(0);
                notifier
                    .session
                    .notify(abi::NOTIFY_INVAL_INODE, &[&out.bytes])
            }
        };
        if let Err(e) = result {
            tracing::debug!(?item, error = %e, "invalidation not applied");
        }
    }
}

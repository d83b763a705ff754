//! The kernel's FUSE protocol, as much of it as a read-only file system speaks: the request
//! header and the arguments of the requests answered, and the replies' layouts
//! (`include/uapi/linux/fuse.h`, protocol 7.31). Requests come from the kernel, but are
//! parsed as untrusted bytes all the same: a short or malformed one is an error, never a
//! panic or a read past its end.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

pub const MAJOR: u32 = 7;
/// The protocol minor this side speaks: readdirplus, no-open, no-opendir, cached symlinks and
/// max_pages are all older.
pub const MINOR: u32 = 31;

/// The request header, `struct fuse_in_header`.
pub const IN_HEADER: usize = 40;
/// The reply header, `struct fuse_out_header`.
pub const OUT_HEADER: usize = 16;

pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const READLINK: u32 = 5;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const READDIRPLUS: u32 = 44;
    /// Requests that would change the tree: the mount is read-only, so the kernel refuses
    /// them before they are sent; answered `EROFS` should one arrive.
    pub const WRITING: [u32; 15] = [4, 6, 8, 9, 10, 11, 12, 13, 16, 21, 24, 35, 43, 45, 47];
}

pub mod init_flag {
    pub const ASYNC_READ: u32 = 1 << 0;
    pub const BIG_WRITES: u32 = 1 << 5;
    pub const DO_READDIRPLUS: u32 = 1 << 13;
    pub const NO_OPEN_SUPPORT: u32 = 1 << 17;
    pub const PARALLEL_DIROPS: u32 = 1 << 18;
    pub const MAX_PAGES: u32 = 1 << 22;
    pub const CACHE_SYMLINKS: u32 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u32 = 1 << 24;
}

pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;

pub const NOTIFY_INVAL_INODE: i32 = 2;
pub const NOTIFY_INVAL_ENTRY: i32 = 3;

/// Why a request could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than its header, or than the arguments of its operation.
    Short,
    /// The header's length is not the length read.
    Length,
    /// A name with no terminating NUL.
    Unterminated,
}

/// `struct fuse_in_header`.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
}

/// Reads little fields from a request's bytes, each bounds-checked.
pub struct Args<'a> {
    bytes: &'a [u8],
}

impl<'a> Args<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Args { bytes }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.bytes.len() < n {
            return Err(Malformed::Short);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub fn u32(&mut self) -> Result<u32, Malformed> {
        let b = self.take(4)?;
        Ok(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, Malformed> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_ne_bytes(a))
    }

    pub fn skip(&mut self, n: usize) -> Result<(), Malformed> {
        self.take(n).map(|_| ())
    }

    /// A NUL-terminated name.
    pub fn name(&mut self) -> Result<&'a OsStr, Malformed> {
        let end = self
            .bytes
            .iter()
            .position(|&b| b == 0)
            .ok_or(Malformed::Unterminated)?;
        let name = &self.bytes[..end];
        self.bytes = &self.bytes[end + 1..];
        Ok(OsStr::from_bytes(name))
    }
}

/// Splits a request read from the device into its header and its arguments.
pub fn parse(request: &[u8]) -> Result<(Header, Args<'_>), Malformed> {
    let mut args = Args::new(request);
    let len = args.u32()?;
    let opcode = args.u32()?;
    let unique = args.u64()?;
    let nodeid = args.u64()?;
    args.skip(IN_HEADER - 24)?; // uid, gid, pid, extension length, padding
    if len as usize != request.len() {
        return Err(Malformed::Length);
    }
    Ok((
        Header {
            opcode,
            unique,
            nodeid,
        },
        args,
    ))
}

/// `struct fuse_read_in`: the file or folder read, where and how much.
pub struct Read {
    pub offset: u64,
    pub size: u32,
}

pub fn read_in(args: &mut Args) -> Result<Read, Malformed> {
    let _fh = args.u64()?;
    let offset = args.u64()?;
    let size = args.u32()?;
    Ok(Read { offset, size })
}

/// `struct fuse_init_in`: the kernel's version, readahead and what it can do.
pub struct Init {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
}

pub fn init_in(args: &mut Args) -> Result<Init, Malformed> {
    Ok(Init {
        major: args.u32()?,
        minor: args.u32()?,
        max_readahead: args.u32()?,
        flags: args.u32()?,
    })
}

/// What this side agreed to, `struct fuse_init_out`.
pub struct InitOut {
    pub max_readahead: u32,
    pub flags: u32,
    pub max_write: u32,
    pub max_pages: u16,
}

/// A reply's bytes after its header, built field by field in the kernel's layout.
#[derive(Default)]
pub struct Out {
    pub bytes: Vec<u8>,
}

impl Out {
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_ne_bytes());
        self
    }

    pub fn init(&mut self, o: &InitOut) -> &mut Self {
        self.u32(MAJOR).u32(MINOR).u32(o.max_readahead).u32(o.flags);
        self.u16(16).u16(12); // max_background, congestion_threshold
        self.u32(o.max_write).u32(1); // max_write, time granularity (ns)
        self.u16(o.max_pages).u16(0); // max_pages, map_alignment
        self.u32(0).u32(0); // flags2, max_stack_depth
        self.bytes.extend_from_slice(&[0u8; 24]);
        self
    }

    /// `struct fuse_attr`.
    pub fn attr(&mut self, a: &Attr) -> &mut Self {
        self.u64(a.ino).u64(a.size).u64(a.size.div_ceil(512));
        self.u64(a.time).u64(a.time).u64(a.time); // atime, mtime, ctime
        self.u32(0).u32(0).u32(0); // their nanoseconds
        self.u32(a.mode).u32(1); // mode; links: 1 for folders too ("unknown")
        self.u32(a.uid).u32(a.gid).u32(0).u32(4096).u32(0) // rdev, blksize, flags
    }

    /// `struct fuse_entry_out`: a lookup's answer, valid for `ttl` seconds (inode 0: a
    /// negative entry, cached as long).
    pub fn entry(&mut self, a: &Attr, ttl: u64) -> &mut Self {
        self.u64(a.ino).u64(0).u64(ttl).u64(ttl).u32(0).u32(0);
        self.attr(a)
    }

    /// `struct fuse_attr_out`.
    pub fn attr_out(&mut self, a: &Attr, ttl: u64) -> &mut Self {
        self.u64(ttl).u32(0).u32(0);
        self.attr(a)
    }

    /// `struct fuse_dirent` with its name, padded to 8 bytes; false (and nothing added) if
    /// it would not fit in `limit` bytes in all.
    pub fn dirent(&mut self, ino: u64, next: u64, kind: u32, name: &[u8], limit: usize) -> bool {
        let len = (24 + name.len()).next_multiple_of(8);
        if self.bytes.len() + len > limit {
            return false;
        }
        self.u64(ino).u64(next).u32(name.len() as u32).u32(kind);
        self.bytes.extend_from_slice(name);
        self.bytes
            .resize(self.bytes.len() + len - 24 - name.len(), 0);
        true
    }

    /// `struct fuse_direntplus`: an entry with its attributes (a lookup reference).
    pub fn direntplus(&mut self, a: &Attr, ttl: u64, next: u64, name: &[u8], limit: usize) -> bool {
        let len = 128 + (24 + name.len()).next_multiple_of(8);
        if self.bytes.len() + len > limit {
            return false;
        }
        self.entry(a, ttl);
        self.dirent(a.ino, next, a.mode >> 12, name, usize::MAX)
    }
}

/// A node's attributes as the kernel sees them.
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// File type and permission bits, as in `st_mode`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch, for all three times.
    pub time: u64,
}

/// The file-type bits of a mode, which are also a `fuse_dirent`'s type (`mode >> 12`).
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

/// The reply header for a request `unique` whose reply is `len` bytes after it; `error` is a
/// negative errno, or 0.
pub fn out_header(len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&((OUT_HEADER + len) as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(opcode: u32, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&((IN_HEADER + body.len()) as u32).to_ne_bytes());
        r.extend_from_slice(&opcode.to_ne_bytes());
        r.extend_from_slice(&7u64.to_ne_bytes());
        r.extend_from_slice(&1u64.to_ne_bytes());
        r.extend_from_slice(&[0u8; 16]);
        r.extend_from_slice(body);
        r
    }

    #[test]
    fn a_request_is_read_within_its_bytes_and_a_malformed_one_is_refused() {
        let r = request(op::LOOKUP, b"SKILL.md\0");
        let (h, mut args) = parse(&r).unwrap();
        assert_eq!((h.opcode, h.unique, h.nodeid), (op::LOOKUP, 7, 1));
        assert_eq!(args.name().unwrap(), "SKILL.md");

        assert_eq!(parse(&r[..20]).err(), Some(Malformed::Short));
        let mut long = r.clone();
        long.push(0);
        assert_eq!(parse(&long).err(), Some(Malformed::Length));
        let r = request(op::LOOKUP, b"no-end");
        assert_eq!(
            parse(&r).unwrap().1.name().err(),
            Some(Malformed::Unterminated)
        );
        let r = request(op::READ, &[0u8; 10]);
        assert_eq!(
            read_in(&mut parse(&r).unwrap().1).err(),
            Some(Malformed::Short)
        );
    }

    #[test]
    fn replies_have_the_kernels_layouts() {
        let a = Attr {
            ino: 5,
            size: 1000,
            mode: S_IFREG | 0o644,
            uid: 1,
            gid: 2,
            time: 3,
        };
        assert_eq!(Out::default().attr(&a).bytes.len(), 88);
        assert_eq!(Out::default().entry(&a, 1).bytes.len(), 128);
        assert_eq!(Out::default().attr_out(&a, 1).bytes.len(), 104);
        let init = InitOut {
            max_readahead: 0,
            flags: 0,
            max_write: 0,
            max_pages: 0,
        };
        assert_eq!(Out::default().init(&init).bytes.len(), 64);
        let mut out = Out::default();
        assert!(out.dirent(5, 1, S_IFREG >> 12, b"a", 32));
        assert_eq!(out.bytes.len(), 32);
        assert!(
            !out.dirent(6, 2, S_IFREG >> 12, b"b", 63),
            "a second does not fit in 63"
        );
        assert_eq!(out.bytes.len(), 32);
        let mut out = Out::default();
        assert!(out.direntplus(&a, 1, 1, b"name-of-9", 168));
        assert_eq!(out.bytes.len(), 128 + 40);
        assert_eq!(
            &out_header(8, -2, 9)[..8],
            &[24, 0, 0, 0, 254, 255, 255, 255]
        );
    }
}

//! Attaching a FUSE file system: a `/dev/fuse` descriptor for the session, mounted read-only
//! at a folder — by `mount(2)` as root, by the setuid `fusermount3` otherwise (or wherever
//! its `auto_unmount` is wanted: it detaches the mount when this process dies) — and
//! detaching it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// How a session's mount was made.
pub struct Attach {
    pub allow_other: bool,
    /// fusermount's `auto_unmount`: its helper stays for the mount's life and detaches the
    /// mount if this process dies.
    pub auto_unmount: bool,
}

/// A mounted session's device (non-blocking), and fusermount's helper where it stays
/// (`auto_unmount`), with the socket whose closing tells it this side is gone.
pub struct Device {
    pub fd: OwnedFd,
    pub helper: Option<(OwnedFd, Child)>,
}

impl Drop for Device {
    /// The helper's socket closed, the helper sees this side gone and ends (detaching the
    /// mount if it is still there): reaped here, so no helper stays a zombie.
    fn drop(&mut self) {
        if let Some((socket, mut child)) = self.helper.take() {
            drop(socket);
            let _ = child.wait();
        }
    }
}

const OPTIONS: &str = "ro,nodev,nosuid,noatime,default_permissions";
const NAME: &str = "cloud-harness";

/// Mounts a new FUSE session at `mountpoint`; its requests are read from the returned device.
pub fn attach(mountpoint: &Path, how: &Attach) -> io::Result<Device> {
    let device = if nix::unistd::geteuid().is_root() && !how.auto_unmount {
        mount_as_root(mountpoint, how.allow_other)?
    } else {
        with_fusermount(mountpoint, how)?
    };
    // Mounted by now: a failure from here on must not leave it attached and unserved.
    if let Err(e) = non_blocking(&device.fd) {
        drop(device);
        let _ = detach(mountpoint);
        return Err(e);
    }
    Ok(device)
}

fn non_blocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

fn mount_as_root(mountpoint: &Path, allow_other: bool) -> io::Result<Device> {
    use nix::fcntl::{open, OFlag};
    use nix::mount::{mount, MsFlags};
    use nix::sys::stat::Mode;
    let fd = open("/dev/fuse", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
        fd.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid(),
    );
    if allow_other {
        data.push_str(",allow_other");
    }
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_NOSUID | MsFlags::MS_NOATIME;
    mount(
        Some(NAME),
        mountpoint,
        Some("fuse"),
        flags,
        Some(data.as_str()),
    )?;
    Ok(Device { fd, helper: None })
}

/// fusermount3's protocol: it mounts, then sends the device over the socket named by
/// `_FUSE_COMMFD`; with `auto_unmount` it stays, waiting for that socket to close.
fn with_fusermount(mountpoint: &Path, how: &Attach) -> io::Result<Device> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let mut options = format!("{OPTIONS},fsname={NAME}");
    if how.allow_other {
        options.push_str(",allow_other");
    }
    if how.auto_unmount {
        options.push_str(",auto_unmount");
    }
    let theirs_fd = theirs.as_raw_fd();
    let mut command = Command::new("fusermount3");
    command
        .args(["-o", &options, "--"])
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs_fd.to_string())
        .stdin(Stdio::null());
    // fusermount, and no other child, gets the socket.
    crate::inherit::to_child(&mut command, theirs_fd);
    let mut child = command.spawn()?;
    drop(theirs);
    let received = receive_fd(ours.as_raw_fd());
    let fd = match received {
        Ok(fd) => fd,
        Err(e) => {
            drop(ours);
            let status = child.wait()?;
            return Err(io::Error::other(format!(
                "fusermount3 mounted nothing ({status}): {e}"
            )));
        }
    };
    if how.auto_unmount {
        return Ok(Device {
            fd,
            helper: Some((ours, child)),
        });
    }
    let status = child.wait()?;
    if !status.success() {
        // It sent a device, so it may have mounted: not left attached.
        drop(fd);
        let _ = detach(mountpoint);
        return Err(io::Error::other(format!("fusermount3 failed: {status}")));
    }
    Ok(Device { fd, helper: None })
}

/// The one descriptor fusermount3 sends (`SCM_RIGHTS`), or why there is none.
fn receive_fd(socket: RawFd) -> io::Result<OwnedFd> {
    loop {
        match receive_once(socket) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(Some(fd)) => return Ok(fd),
            Ok(None) => return Err(io::Error::other("no device was sent")),
        }
    }
}

fn receive_once(socket: RawFd) -> nix::Result<Option<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let flags = MsgFlags::MSG_CMSG_CLOEXEC;
    let msg = recvmsg::<()>(socket, &mut iov, Some(&mut space), flags)?;
    let mut received = None;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: a descriptor just received is this process's, owned by no one else
                // (any beyond the first is closed when dropped).
                received = Some(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok(received)
}

/// Detaches `mountpoint`, which ends its session. (`auto_unmount` only covers a daemon that
/// died: fusermount leaves a live file system alone.) A busy mount is detached lazily; one
/// already gone (detached by someone else, `umount -l`) is left as it is.
pub fn detach(mountpoint: &Path) -> io::Result<()> {
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
pub fn clear_stale(mountpoint: &Path) {
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
    Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mountpoint)
        .status()
}

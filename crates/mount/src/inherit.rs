//! Handing one descriptor to one child: it stays close-on-exec in this process (no other
//! child, started meanwhile by another thread, gets it) and is made inheritable only in the
//! child, between fork and exec.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// `command`'s child, and no other, inherits `fd` (which the caller keeps open until the
/// child has started).
pub(crate) fn to_child(command: &mut Command, fd: RawFd) {
    // SAFETY: between fork and exec, one async-signal-safe system call on a descriptor this
    // process holds open.
    unsafe {
        command.pre_exec(move || {
            if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

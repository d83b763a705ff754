//! What starts bubblewrap: this program again (`executor-launch`), a small process of its
//! own, which joins the sandbox's cgroup, narrows its mount namespace
//! ([`launch_mounts::Narrowing`]), puts the agent's socket where bubblewrap expects it,
//! closes everything else, and execs bubblewrap.
//!
//! The server does none of it between a fork and an exec of its own: a fork copies the whole
//! server's page tables (50 ms at 1.2 GiB, the server of 1,000 workspaces), and the copy is
//! torn down again at the exec (another 60 ms), on every sandbox's start. The launcher is
//! started by `posix_spawn` (no copy). Its standard input is a socket: the server sends the
//! descriptors over it, and the launcher answers on it why it could not start bubblewrap, or
//! nothing (the socket closes at the exec).
//!
//! [`launch_mounts::Narrowing`]: super::launch_mounts::Narrowing

use std::ffi::{CString, OsString};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::launch_mounts::Narrowing;

/// The command line's first argument: `executor-launch [--narrow FOLDER] -- BWRAP ARGS…`,
/// `FOLDER` the workspace's own folder (canonical) when the server narrows its start.
pub const COMMAND: &str = "executor-launch";

/// What the server hands the launcher: the agent's socket, maybe bubblewrap's information
/// pipe, and the cgroup files to join. At most this many descriptors.
const MAX_FDS: usize = 8;

/// The first byte of the server's message: this launcher's version of it.
const MAGIC: u8 = b'L';

/// The descriptors bubblewrap finds its agent's socket and its information pipe at.
pub(crate) const AGENT_FD: RawFd = 3;
pub(crate) const INFO_FD: RawFd = 4;

/// The server's side: sends the launcher (its `stdin` the other end of `socket`) the agent's
/// socket `agent`, bubblewrap's information pipe `info` and the cgroup files to join.
pub fn hand(
    socket: &OwnedFd,
    agent: RawFd,
    info: Option<RawFd>,
    joins: &[RawFd],
) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut fds = vec![agent];
    fds.extend(info);
    fds.extend_from_slice(joins);
    if fds.len() > MAX_FDS {
        return Err(io::Error::other("too many descriptors for the launcher"));
    }
    let mut header = vec![MAGIC, u8::from(info.is_some()), joins.len() as u8];
    header.extend_from_slice(&std::process::id().to_le_bytes());
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[std::io::IoSlice::new(&header)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

/// The server's side, once the descriptors are sent: what the launcher answered by the time
/// its socket closed (at bubblewrap's exec): nothing, or why it could not start it.
pub async fn answer(socket: OwnedFd) -> io::Result<()> {
    use tokio::io::AsyncReadExt;
    let socket = std::os::unix::net::UnixStream::from(socket);
    socket.set_nonblocking(true)?;
    let mut socket = tokio::net::UnixStream::from_std(socket)?;
    let mut said = Vec::new();
    let mut limited = (&mut socket).take(4096);
    let read = limited.read_to_end(&mut said);
    match tokio::time::timeout(START_WAIT, read).await {
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "bubblewrap's launcher did not start it in time",
        )),
        Ok(Err(e)) => Err(e),
        Ok(Ok(_)) if said.is_empty() => Ok(()),
        Ok(Ok(_)) => Err(io::Error::other(
            String::from_utf8_lossy(&said).trim().to_owned(),
        )),
    }
}

/// How long the launcher may take to exec bubblewrap.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The launcher's entry: never returns but with an error (its exit status 127), which it
/// also answers on its standard input's socket.
pub fn main(args: &[OsString]) -> i32 {
    // SAFETY: a copy of this process's standard input, owned from here on.
    let status = unsafe {
        let fd = nix::libc::fcntl(0, nix::libc::F_DUPFD_CLOEXEC, 10);
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd))
    };
    match launch(args) {
        Ok(never) => match never {},
        Err(e) => {
            let said = format!("executor-launch: {e}");
            eprintln!("{said}");
            if let Some(status) = status {
                let _ = std::fs::File::from(status).write_all(said.as_bytes());
            }
            127
        }
    }
}

fn launch(args: &[OsString]) -> io::Result<std::convert::Infallible> {
    use nix::libc;
    let (narrow, argv) = match args {
        [flag, own, dash, argv @ ..] if flag == "--narrow" && dash == "--" => (Some(own), argv),
        [dash, argv @ ..] if dash == "--" => (None, argv),
        _ => {
            return Err(io::Error::other(
                "usage: executor-launch [--narrow FOLDER] -- BWRAP ARGS…",
            ))
        }
    };
    if argv.is_empty() {
        return Err(io::Error::other("no program to start"));
    }
    // Killed with the server from now on (bubblewrap's --die-with-parent takes over at its
    // start), and not started at all for one gone already.
    // SAFETY: a prctl with plain integers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let Received {
        agent,
        info,
        joins,
        server,
    } = received()?;
    if nix::unistd::getppid().as_raw() as u32 != server {
        return Err(io::Error::other("the server is gone"));
    }
    super::cgroup::join(&joins.iter().map(AsRawFd::as_raw_fd).collect::<Vec<_>>())
        .map_err(|e| io::Error::other(format!("joining the sandbox's cgroup: {e}")))?;
    drop(joins);
    std::env::set_current_dir("/")?;
    if let Some(own) = narrow {
        match Narrowing::at(Path::new(own)) {
            // SAFETY: this process has one thread, and execs next.
            Ok(narrowing) => unsafe { narrowing.apply() }.map_err(|e| {
                io::Error::other(format!("putting {} back: {e}", own.to_string_lossy()))
            })?,
            // Gone meanwhile (a close): the start fails on its own, as it would have.
            Err(e) => eprintln!("executor-launch: not narrowed: {e}"),
        }
    }
    // Out of the way first (either may be the other's number), then in place.
    let agent = high(agent)?;
    let info = info.map(high).transpose()?;
    dup2(agent.as_raw_fd(), AGENT_FD)?;
    if let Some(info) = &info {
        dup2(info.as_raw_fd(), INFO_FD)?;
    }
    let null = std::fs::File::open("/dev/null")?;
    dup2(null.as_raw_fd(), 0)?;
    // Nothing else reaches the sandbox.
    close_from(if info.is_some() {
        INFO_FD + 1
    } else {
        AGENT_FD + 1
    })?;
    let argv: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| io::Error::other("an argument with a NUL"))?;
    // As the server's fork left it: Rust's start-up ignores SIGPIPE.
    // SAFETY: the default disposition of one signal, in a process of one thread.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let err = nix::unistd::execv(&argv[0], &argv).unwrap_err();
    Err(io::Error::other(format!(
        "starting {}: {err}",
        argv[0].to_string_lossy()
    )))
}

struct Received {
    agent: OwnedFd,
    info: Option<OwnedFd>,
    joins: Vec<OwnedFd>,
    /// The server's pid, which must be this process's parent.
    server: u32,
}

/// The descriptors the server sent on standard input: the agent's socket, the information
/// pipe if any, the cgroup files.
fn received() -> io::Result<Received> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut header = [0u8; 7];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut fds: Vec<OwnedFd> = Vec::new();
    let (bytes, truncated) = {
        let mut iov = [std::io::IoSliceMut::new(&mut header)];
        let msg = recvmsg::<()>(0, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = cmsg {
                // SAFETY: descriptors the kernel just installed in this process, each owned
                // once.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC))
    };
    if bytes == 0 {
        return Err(io::Error::other("the server sent nothing"));
    }
    let joins = usize::from(header[2]);
    let well_formed = bytes == header.len()
        && !truncated
        && header[0] == MAGIC
        && header[1] <= 1
        && fds.len() == 1 + usize::from(header[1]) + joins;
    if !well_formed {
        return Err(io::Error::other(
            "the server's message is not this launcher's (another version of the program?)",
        ));
    }
    let server = u32::from_le_bytes(header[3..7].try_into().expect("four bytes"));
    let mut fds = fds.into_iter();
    let agent = fds.next().expect("counted");
    let info = if header[1] == 1 { fds.next() } else { None };
    Ok(Received {
        agent,
        info,
        joins: fds.collect(),
        server,
    })
}

/// A copy of `fd` above the descriptors bubblewrap expects (close-on-exec).
fn high(fd: OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: a copy of a descriptor this process owns, owned in turn.
    unsafe {
        let high = nix::libc::fcntl(fd.as_raw_fd(), nix::libc::F_DUPFD_CLOEXEC, 10);
        if high < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(high))
    }
}

/// `to` a copy of `from`, open across the exec.
fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: `to` is standard input or a descriptor bubblewrap expects, replaced.
    if unsafe { nix::libc::dup2(from, to) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Every descriptor from `first` on closes at the exec.
fn close_from(first: RawFd) -> io::Result<()> {
    use nix::libc;
    // SAFETY: marks descriptors of this process close-on-exec.
    let all = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            4, // CLOSE_RANGE_CLOEXEC
        )
    };
    if all == 0 {
        return Ok(());
    }
    // Before Linux 5.11: each one open, as the kernel lists them.
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd >= first)
        .collect();
    for fd in open {
        // SAFETY: marks a descriptor of this process close-on-exec.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

//! One run's relay, on a thread of its own: the run's output to its socket as frames, its
//! standard input from it, its exit once the reaper has it, and a kill of its group when the
//! harness ends its end. Nothing here blocks but `poll`: output is read only while what the
//! harness has not taken yet is small, and input only while the run takes it, so neither
//! side can make the agent hold more than a few chunks per run.

use super::spawn::Spawned;
use super::{Agent, Running};
use crate::wire::{self, Frame, Kind};
use nix::libc;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// What waits for the harness before output is read again.
const OUT_PENDING: usize = wire::CHUNK;
/// What waits for the run's standard input before more is read from the harness.
const IN_PENDING: usize = wire::CHUNK;

fn nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor this thread owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
    )
}

/// A pollfd, or one `poll` ignores (a negative descriptor).
fn watch(fd: RawFd, events: i16, on: bool) -> libc::pollfd {
    libc::pollfd {
        fd: if on { fd } else { -1 },
        events,
        revents: 0,
    }
}

/// Relays run `run` until it is over for both sides: its output closed, its exit said and
/// taken, or the harness gone.
pub(super) fn relay(
    agent: &Arc<Agent>,
    run: u32,
    mut socket: UnixStream,
    child: Spawned,
    running: &Arc<Running>,
) {
    let Spawned {
        pid,
        mut stdin,
        mut stdout,
        mut stderr,
    } = child;
    for fd in [socket.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()] {
        nonblocking(fd);
    }
    if let Some(s) = &stdin {
        nonblocking(s.as_raw_fd());
    }
    let (mut out_open, mut err_open) = (true, true);
    let (mut end_said, mut exit_said) = (false, false);
    // The harness may still send (input); once it ends its end, the run is killed.
    let mut harness_sends = true;
    let mut killed = false;
    let mut to_harness: Vec<u8> = Vec::new();
    let mut from_harness = wire::Frames::default();
    let mut to_run: Vec<u8> = Vec::new();
    let mut close_input = false;
    let mut exited = false;
    let mut buf = vec![0u8; wire::CHUNK];
    let kill = |killed: &mut bool| {
        if !*killed {
            *killed = true;
            agent.kill(pid, running);
        }
    };
    loop {
        if !out_open && !err_open && !end_said {
            end_said = true;
            wire::append(&mut to_harness, Kind::End, run, &[]);
        }
        if exited && !exit_said {
            if let Some(exit) = super::lock(&running.exited).take() {
                exit_said = true;
                to_harness.extend(Frame::json(Kind::Exit, run, &exit).encode());
            }
        }
        if end_said && exit_said && to_harness.is_empty() {
            return;
        }
        if close_input && to_run.is_empty() {
            stdin = None;
        }
        let read_more = to_harness.len() < OUT_PENDING;
        let mut fds = [
            watch(stdout.as_raw_fd(), libc::POLLIN, out_open && read_more),
            watch(stderr.as_raw_fd(), libc::POLLIN, err_open && read_more),
            // Once the harness has ended its end, only what is left to say to it is watched
            // for (a shut end stays readable: watched, it would wake poll at every turn);
            // POLLHUP, its close, is reported whatever is asked. Input is read while the run
            // takes it (what is read and not yet a frame is under one frame's length).
            watch(
                socket.as_raw_fd(),
                match (harness_sends, to_run.len() < IN_PENDING) {
                    (true, true) => libc::POLLRDHUP | libc::POLLIN,
                    (true, false) => libc::POLLRDHUP,
                    (false, _) => 0,
                } | if to_harness.is_empty() {
                    0
                } else {
                    libc::POLLOUT
                },
                true,
            ),
            watch(
                stdin.as_ref().map_or(-1, |s| s.as_raw_fd()),
                libc::POLLOUT,
                !to_run.is_empty(),
            ),
            watch(running.wake.as_raw_fd(), libc::POLLIN, !exited),
        ];
        // SAFETY: poll of descriptors this thread owns, into `fds`.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if ready < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            kill(&mut killed);
            return;
        }
        let revents = |i: usize| fds[i].revents;
        let readable = libc::POLLIN | libc::POLLHUP | libc::POLLERR;
        // Output: a chunk per stream per turn, as frames.
        for (i, kind) in [(0, Kind::Stdout), (1, Kind::Stderr)] {
            if revents(i) & readable == 0 {
                continue;
            }
            let (stream, open) = if i == 0 {
                (&mut stdout, &mut out_open)
            } else {
                (&mut stderr, &mut err_open)
            };
            match stream.read(&mut buf) {
                Ok(0) => *open = false,
                Ok(n) => wire::append(&mut to_harness, kind, run, &buf[..n]),
                Err(e) if would_block(&e) => {}
                Err(_) => *open = false,
            }
        }
        if revents(4) & libc::POLLIN != 0 {
            let mut count = [0u8; 8];
            // SAFETY: an 8-byte read of this run's eventfd.
            unsafe { libc::read(running.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
            exited = true;
        }
        let from = revents(2);
        if from & libc::POLLIN != 0 {
            from_harness.compact();
            match socket.read(&mut buf) {
                Ok(0) => harness_sends = false,
                Ok(n) => from_harness.buf.extend_from_slice(&buf[..n]),
                Err(e) if would_block(&e) => {}
                Err(_) => harness_sends = false,
            }
            loop {
                match from_harness.take() {
                    Ok(Some(frame)) if frame.kind == Kind::Stdin => {
                        if frame.payload.is_empty() {
                            close_input = true;
                        } else if stdin.is_some() && !close_input {
                            to_run.extend(frame.payload);
                        }
                    }
                    Ok(None) => break,
                    // Not the harness's to say: the run ends.
                    Ok(Some(_)) | Err(_) => {
                        harness_sends = false;
                        break;
                    }
                }
            }
        }
        if from & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 || !harness_sends {
            harness_sends = false;
            kill(&mut killed);
        }
        // Closed both ways, or broken: nothing queued can reach anyone any more.
        if from & (libc::POLLHUP | libc::POLLERR) != 0 {
            return;
        }
        if from & libc::POLLOUT != 0 {
            match socket.write(&to_harness) {
                Ok(n) => {
                    to_harness.drain(..n);
                }
                Err(e) if would_block(&e) => {}
                // The harness is gone: nothing more to say to it.
                Err(_) => {
                    kill(&mut killed);
                    return;
                }
            }
        }
        if revents(3) != 0 {
            if let Some(s) = stdin.as_mut() {
                match s.write(&to_run) {
                    Ok(n) => {
                        to_run.drain(..n);
                    }
                    Err(e) if would_block(&e) => {}
                    // The run closed its input: what is left of it goes nowhere.
                    Err(_) => {
                        to_run.clear();
                        stdin = None;
                    }
                }
            }
        }
    }
}

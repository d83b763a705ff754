//! The harness's end of one run's socket ([`crate::wire`]): the frames the agent sends, read
//! by the task that waits on the run, as the runner's [`Event`]s; and the run's standard
//! input. Ending it ends the run: the agent kills the run's group when this end is shut
//! down or closed.

use crate::event::{Event, Exit, Stream};
use crate::wire::{self, Exited, Frame, Kind, Refused, Started};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// Frames from the agent, read as they come.
pub struct RunStream {
    read: OwnedReadHalf,
    /// Bytes read and not yet taken as frames.
    frames: wire::Frames,
    closed: bool,
    exited: bool,
    /// The socket ended (or broke): what is still unsaid is said as lost.
    ended: bool,
}

/// What the agent said of a start.
pub enum Start {
    Started,
    Refused(String),
    /// The socket ended first.
    Ended,
}

impl RunStream {
    pub fn new(read: OwnedReadHalf) -> RunStream {
        RunStream {
            read,
            frames: wire::Frames::default(),
            closed: false,
            exited: false,
            ended: false,
        }
    }

    /// The next whole frame; `None` once the socket ended. Cancel-safe: bytes read are kept
    /// in `frames` until they make a frame.
    async fn frame(&mut self) -> Option<Frame> {
        loop {
            match self.frames.take() {
                Ok(Some(frame)) => return Some(frame),
                Ok(None) => {}
                Err(_) => return None,
            }
            self.frames.compact();
            self.frames.buf.reserve(wire::CHUNK);
            match self.read.read_buf(&mut self.frames.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Whether the agent started the run.
    pub async fn started(&mut self) -> Start {
        match self.frame().await {
            Some(f) if f.kind == Kind::Started && f.parse::<Started>().is_ok() => Start::Started,
            Some(f) if f.kind == Kind::Refused => Start::Refused(
                f.parse::<Refused>()
                    .map(|r| r.message)
                    .unwrap_or_else(|e| e.to_string()),
            ),
            _ => {
                self.ended = true;
                Start::Ended
            }
        }
    }

    /// The run's next event; `None` once its output closed and its exit is known. An end of
    /// the socket before either is said is the output's end and a lost exit.
    pub async fn next(&mut self) -> Option<Event> {
        while !self.ended {
            let Some(frame) = self.frame().await else {
                self.ended = true;
                break;
            };
            match frame.kind {
                Kind::Stdout if !self.closed => {
                    return Some(Event::Output(Stream::Stdout, frame.payload))
                }
                Kind::Stderr if !self.closed => {
                    return Some(Event::Output(Stream::Stderr, frame.payload))
                }
                Kind::End if !self.closed => {
                    self.closed = true;
                    return Some(Event::Closed);
                }
                Kind::Exit if !self.exited => {
                    self.exited = true;
                    let exited = frame.parse::<Exited>().unwrap_or_default();
                    return Some(Event::Exited(Exit {
                        code: exited.code,
                        signal: exited.signal,
                        lost: false,
                    }));
                }
                // Anything else is not the agent's to say now: the run is over for us.
                _ => self.ended = true,
            }
        }
        if !self.closed {
            self.closed = true;
            return Some(Event::Closed);
        }
        if !self.exited {
            self.exited = true;
            return Some(Event::Exited(Exit {
                lost: true,
                ..Exit::default()
            }));
        }
        None
    }
}

/// A run's standard input: bytes as frames; empty bytes close it. Dropped, it leaves the
/// socket as it is (a shutdown would end the run).
pub struct RunInput {
    write: Option<OwnedWriteHalf>,
    run: u32,
}

impl RunInput {
    pub(crate) fn new(write: OwnedWriteHalf, run: u32) -> RunInput {
        RunInput {
            write: Some(write),
            run,
        }
    }

    /// Not cancel-safe: a send cut short leaves half a frame, and the agent ends the run.
    pub async fn send(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        let frame = Frame {
            kind: Kind::Stdin,
            run: self.run,
            payload: bytes,
        };
        match self.write.as_mut() {
            Some(write) => write.write_all(&frame.encode()).await,
            None => Ok(()),
        }
    }
}

impl Drop for RunInput {
    fn drop(&mut self) {
        if let Some(write) = self.write.take() {
            write.forget();
        }
    }
}

/// Ends the run when asked to: a shutdown of the run's socket, which the agent answers by
/// killing the run's group (through a descriptor of its own, so the run's input held
/// elsewhere does not keep the run going).
#[derive(Clone)]
pub struct Ender(pub(crate) Arc<std::os::unix::net::UnixStream>);

impl Ender {
    /// No more from the harness: the agent kills the run, and still says how it ended.
    pub fn kill(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Write);
    }

    /// The harness is gone from the run altogether.
    pub fn end(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

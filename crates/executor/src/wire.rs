//! What the harness and an executor's run agent exchange.
//!
//! Each run has a socket of its own: the harness makes a pair, hands one end to the agent
//! over the agent's control socket (one byte carrying the descriptor, `SCM_RIGHTS`), and
//! speaks frames on the other. So a run's output never waits behind another run's reader,
//! and the harness's task that waits on a run reads its socket itself (no thread between).
//! The harness ending its end (a shutdown, or the close when it drops the run) kills the run.
//!
//! A frame is a 4-byte big-endian length, then a kind byte, a 4-byte run id and the payload
//! (at most [`MAX_PAYLOAD`] bytes). Starts and exits carry JSON; output and input, raw bytes.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// The largest payload either side accepts; longer frames end the connection.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Output is sent in chunks of at most this many bytes.
pub const CHUNK: usize = 64 << 10;
const HEADER: usize = 4 + 1 + 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Harness → agent: start a run ([`Start`]); the first frame on a run's socket.
    Start = 1,
    /// Harness → agent: bytes for the run's standard input; an empty one closes it.
    Stdin = 2,
    /// Agent → harness: the run started ([`Started`]).
    Started = 10,
    Stdout = 11,
    Stderr = 12,
    /// Agent → harness: both output streams of the run closed.
    End = 13,
    /// Agent → harness: the run's first process exited ([`Exited`]).
    Exit = 14,
    /// Agent → harness: the run was not started ([`Refused`]).
    Refused = 15,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Start,
            2 => Kind::Stdin,
            10 => Kind::Started,
            11 => Kind::Stdout,
            12 => Kind::Stderr,
            13 => Kind::End,
            14 => Kind::Exit,
            15 => Kind::Refused,
            _ => return None,
        })
    }
}

/// What a run is: the command, its whole environment, and its limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Start {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// The user and group the run's processes are (the agent's own when it is not root).
    pub uid: u32,
    pub gid: u32,
    pub limits: Limits,
    /// Whether the run reads standard input from [`Kind::Stdin`] frames (else `/dev/null`).
    pub stdin: bool,
}

/// The rlimits of each process of a run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Limits {
    pub cpu_seconds: Option<u64>,
    pub memory: Option<u64>,
    pub processes: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Started {
    /// The run's first process, in the executor's pid namespace.
    pub pid: i32,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Exited {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refused {
    pub message: String,
}

/// One frame, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub run: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn json<T: Serialize>(kind: Kind, run: u32, value: &T) -> Frame {
        Frame {
            kind,
            run,
            payload: serde_json::to_vec(value).expect("frames serialize"),
        }
    }

    pub fn parse<T: for<'de> Deserialize<'de>>(&self) -> std::io::Result<T> {
        serde_json::from_slice(&self.payload).map_err(|e| invalid(format!("{:?}: {e}", self.kind)))
    }

    /// The frame as bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.payload.len());
        append(&mut out, self.kind, self.run, &self.payload);
        out
    }

    /// A frame from its length-prefixed body (the bytes after the length).
    fn decode(body: Vec<u8>) -> std::io::Result<Frame> {
        let kind = Kind::from_byte(body[0]).ok_or_else(|| invalid("unknown frame kind"))?;
        let run = u32::from_be_bytes(body[1..5].try_into().expect("four bytes"));
        Ok(Frame {
            kind,
            run,
            payload: body[5..].to_vec(),
        })
    }
}

fn invalid(message: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.into())
}

fn body_length(prefix: [u8; 4]) -> std::io::Result<usize> {
    let n = u32::from_be_bytes(prefix) as usize;
    if !(5..=5 + MAX_PAYLOAD).contains(&n) {
        return Err(invalid(format!("a frame of {n} bytes")));
    }
    Ok(n)
}

/// Reads one frame; `Ok(None)` at a clean end of the stream.
pub fn read(r: &mut impl Read) -> std::io::Result<Option<Frame>> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; body_length(prefix)?];
    r.read_exact(&mut body)?;
    Frame::decode(body).map(Some)
}

pub fn write(w: &mut impl Write, frame: &Frame) -> std::io::Result<()> {
    w.write_all(&frame.encode())
}

/// Appends a frame of `payload` to `out`, as [`Frame::encode`] would make it (without a
/// copy of the payload of its own).
pub fn append(out: &mut Vec<u8>, kind: Kind, run: u32, payload: &[u8]) {
    out.extend_from_slice(&((1 + 4 + payload.len()) as u32).to_be_bytes());
    out.push(kind as u8);
    out.extend_from_slice(&run.to_be_bytes());
    out.extend_from_slice(payload);
}

/// Bytes read from a stream, taken off as whole frames. What is taken is dropped from the
/// front once per [`Frames::compact`], not per frame (many small frames cost no more than
/// one large one).
#[derive(Default)]
pub struct Frames {
    pub buf: Vec<u8>,
    taken: usize,
}

impl Frames {
    /// The next whole frame, if the bytes hold one.
    pub fn take(&mut self) -> std::io::Result<Option<Frame>> {
        let rest = &self.buf[self.taken..];
        let Some(prefix) = rest.first_chunk::<4>() else {
            return Ok(None);
        };
        let n = body_length(*prefix)?;
        if rest.len() < 4 + n {
            return Ok(None);
        }
        let body = rest[4..4 + n].to_vec();
        self.taken += 4 + n;
        Frame::decode(body).map(Some)
    }

    /// Drops the bytes taken, before more are read.
    pub fn compact(&mut self) {
        self.buf.drain(..self.taken);
        self.taken = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_lengths_are_refused() {
        let start = Start {
            argv: vec!["sh".into(), "-c".into(), "echo ok".into()],
            env: vec![("PATH".into(), "/usr/bin".into())],
            cwd: "/workspace".into(),
            uid: 10001,
            gid: 10001,
            limits: Limits {
                cpu_seconds: Some(5),
                memory: None,
                processes: 64,
            },
            stdin: false,
        };
        let mut bytes = Frame::json(Kind::Start, 7, &start).encode();
        bytes.extend(
            Frame {
                kind: Kind::Stdout,
                run: 7,
                payload: b"ok\n".to_vec(),
            }
            .encode(),
        );
        let mut r = std::io::Cursor::new(bytes);
        let first = read(&mut r).unwrap().unwrap();
        assert_eq!((first.kind, first.run), (Kind::Start, 7));
        assert_eq!(first.parse::<Start>().unwrap(), start);
        assert_eq!(read(&mut r).unwrap().unwrap().payload, b"ok\n");
        assert!(read(&mut r).unwrap().is_none());

        for bad in [0u32, 4, (5 + MAX_PAYLOAD + 1) as u32, u32::MAX] {
            let mut r = std::io::Cursor::new(bad.to_be_bytes().to_vec());
            assert!(read(&mut r).is_err(), "{bad}");
        }
        let mut unknown = Frame {
            kind: Kind::End,
            run: 1,
            payload: vec![],
        }
        .encode();
        unknown[4] = 99;
        assert!(read(&mut std::io::Cursor::new(unknown.clone())).is_err());
        let mut frames = Frames {
            buf: unknown,
            taken: 0,
        };
        assert!(frames.take().is_err());
    }

    #[test]
    fn frames_are_taken_whole_from_what_was_read_so_far() {
        let mut wire = Frame::json(Kind::Exit, 3, &Exited::default()).encode();
        wire.extend(
            Frame {
                kind: Kind::End,
                run: 3,
                payload: vec![],
            }
            .encode(),
        );
        let mut frames = Frames::default();
        let mut taken = Vec::new();
        // A byte at a time, as a socket may hand them.
        for byte in wire {
            frames.compact();
            frames.buf.push(byte);
            while let Some(frame) = frames.take().unwrap() {
                taken.push(frame.kind);
            }
        }
        assert_eq!(taken, [Kind::Exit, Kind::End]);
        frames.compact();
        assert!(frames.buf.is_empty());
    }
}

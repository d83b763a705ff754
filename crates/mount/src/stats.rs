//! Counters of the mounts' work since the process started: the requests the kernel made of
//! each mount, the names it asked for that do not exist, the bytes read. The server's metrics
//! read them; nothing here depends on who reads.

use std::sync::atomic::{AtomicU64, Ordering};

/// The FUSE requests counted, as the metrics name them.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Lookup,
    Getattr,
    Readlink,
    Read,
    Opendir,
    Readdir,
    Readdirplus,
    Forget,
    /// Asked of every open by some programs (Python's `open` asks whether a file is a
    /// terminal); FUSE sends each one to the daemon, so each costs a round trip.
    Ioctl,
}

impl Op {
    pub const ALL: [Op; 9] = [
        Op::Lookup,
        Op::Getattr,
        Op::Readlink,
        Op::Read,
        Op::Opendir,
        Op::Readdir,
        Op::Readdirplus,
        Op::Forget,
        Op::Ioctl,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Readlink => "readlink",
            Op::Read => "read",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Readdirplus => "readdirplus",
            Op::Forget => "forget",
            Op::Ioctl => "ioctl",
        }
    }
}

pub struct Stats {
    ops: [AtomicU64; 9],
    /// Lookups answered "no such name" (cached by the kernel as negative entries).
    pub negative_lookups: AtomicU64,
    pub read_bytes: AtomicU64,
}

pub static STATS: Stats = Stats {
    ops: [const { AtomicU64::new(0) }; 9],
    negative_lookups: AtomicU64::new(0),
    read_bytes: AtomicU64::new(0),
};

impl Stats {
    pub fn count(&self, op: Op) {
        self.ops[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn ops(&self, op: Op) -> u64 {
        self.ops[op as usize].load(Ordering::Relaxed)
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

//! What a process and the processes it owns hold, read from `/proc`: memory, threads, open
//! descriptors, inotify instances and watches, and the mounts under a folder.

use std::collections::HashMap;
use std::path::Path;

#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// The server's resident memory, KiB.
    pub rss_kib: u64,
    pub threads: u64,
    /// Open descriptors other than store objects.
    pub fds: u64,
    /// Open store objects: the views' bounded cache of open files.
    pub object_fds: u64,
    pub inotify_instances: u64,
    pub inotify_watches: u64,
    /// Every process whose chain of parents reaches the server.
    pub owned_processes: u64,
    pub owned_rss_kib: u64,
    /// Their proportional set size: each shared page divided among the processes sharing
    /// it (the same binary mapped in every executor agent is counted once in all).
    pub owned_pss_kib: u64,
    pub owned_threads: u64,
}

impl Usage {
    /// Memory of the server (resident) and of every process it owns (its share), KiB.
    pub fn memory_kib(&self) -> u64 {
        self.rss_kib + self.owned_pss_kib
    }

    pub fn total_threads(&self) -> u64 {
        self.threads + self.owned_threads
    }
}

fn status_field(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn status(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default()
}

/// Every process's parent.
fn parents() -> HashMap<u32, u32> {
    let mut parents = HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(pp) = ppid {
            parents.insert(p, pp);
        }
    }
    parents
}

/// The processes whose chain of parents reaches `pid`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let parents = parents();
    parents
        .keys()
        .copied()
        .filter(|&p| {
            let mut at = p;
            for _ in 0..64 {
                match parents.get(&at) {
                    Some(&pp) if pp == pid => return true,
                    Some(&pp) if pp > 1 => at = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// What `pid` and the processes it owns hold now.
pub fn usage(pid: u32) -> Usage {
    let own = status(pid);
    let mut u = Usage {
        rss_kib: status_field(&own, "VmRSS:"),
        threads: status_field(&own, "Threads:"),
        ..Usage::default()
    };
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        if target.contains("/store/objects/") {
            u.object_fds += 1;
            continue;
        }
        u.fds += 1;
        if target == "anon_inode:inotify" {
            u.inotify_instances += 1;
            let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
            let info = std::fs::read_to_string(info).unwrap_or_default();
            u.inotify_watches += info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count() as u64;
        }
    }
    for p in descendants(pid) {
        let s = status(p);
        u.owned_processes += 1;
        u.owned_rss_kib += status_field(&s, "VmRSS:");
        let rollup = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).unwrap_or_default();
        u.owned_pss_kib += status_field(&rollup, "Pss:");
        u.owned_threads += status_field(&s, "Threads:");
    }
    u
}

/// Mounts in this process's mount table whose mount point is under `dir`, and of those the
/// FUSE file systems.
pub fn mounts_under(dir: &Path) -> (u64, u64) {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().into_owned();
    let (mut all, mut fuse) = (0, 0);
    for line in table.lines() {
        let mut fields = line.split(' ');
        let Some(point) = fields.nth(4) else { continue };
        if !point.starts_with(&prefix) {
            continue;
        }
        all += 1;
        let kind = line.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        if kind.is_some_and(|k| k.starts_with("fuse")) {
            fuse += 1;
        }
    }
    (all, fuse)
}

/// Names, each with how many have it.
pub type Counted = Vec<(String, usize)>;

/// The names of `pid`'s threads and of the processes it owns, each with its count: what is
/// left when a figure is not back where it started.
pub fn names(pid: u32) -> (Counted, Counted) {
    let comm = |path: std::path::PathBuf| {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let count = |names: Vec<String>| {
        let mut counted = std::collections::BTreeMap::new();
        for n in names {
            *counted.entry(n).or_insert(0) += 1;
        }
        counted.into_iter().collect()
    };
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|t| comm(t.path().join("comm")))
        .collect();
    let processes = descendants(pid)
        .into_iter()
        .map(|p| comm(format!("/proc/{p}/comm").into()))
        .collect();
    (count(threads), count(processes))
}

//! The processes a test's server runs, read from /proc.

use std::path::PathBuf;

/// Every process now: its pid and its folder in /proc.
pub fn all() -> impl Iterator<Item = (u32, PathBuf)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((pid, entry.path()))
        })
}

/// A process's children: (pid, name, state), zombies included.
pub fn children_of(pid: u32) -> Vec<(u32, String, char)> {
    let mut found = Vec::new();
    for (p, dir) in all() {
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().and_then(|s| s.chars().next()).unwrap_or('?');
        if rest.next().and_then(|v| v.parse::<u32>().ok()) == Some(pid) {
            found.push((p, stat[open + 1..close].to_owned(), state));
        }
    }
    found
}

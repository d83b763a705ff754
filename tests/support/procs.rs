//! The processes a test's server runs, read from /proc.

/// A process's children: (pid, name, state), zombies included.
pub fn children_of(pid: u32) -> Vec<(u32, String, char)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
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

//! What each principal uses of its limits now: open workspaces (from the workspaces), MCP
//! sessions (from the HTTP endpoint serving now) and what the quotas count. Read by the API's
//! `whoami` and `usage`, the dashboard's tokens page and `/metrics`; above all three sources,
//! so none of them depends on another to be counted.

use cloud_harness_workspace::Workspaces;

/// Every principal that uses anything, with what it uses.
pub fn all(workspaces: &Workspaces) -> Vec<(String, Vec<(&'static str, u64)>)> {
    let quotas = cloud_harness_control::limits::quotas();
    let mut open: std::collections::BTreeMap<String, u64> = Default::default();
    for w in workspaces.open_workspaces() {
        *open.entry(w.owner().to_owned()).or_default() += 1;
    }
    let sessions = cloud_harness_mcp::sessions::per_principal();
    let mut who: Vec<String> = quotas.principals();
    who.extend(open.keys().cloned());
    who.extend(sessions.keys().cloned());
    who.retain(|w| !w.is_empty());
    who.sort();
    who.dedup();
    who.into_iter()
        .map(|p| {
            let mut used = vec![
                ("workspaces", open.get(&p).copied().unwrap_or(0)),
                ("sessions", sessions.get(&p).copied().unwrap_or(0) as u64),
            ];
            used.extend(quotas.usage(&p));
            (p, used)
        })
        .collect()
}

/// What the principal `who` uses of its limits now.
pub fn of(workspaces: &Workspaces, who: &str) -> Vec<(&'static str, u64)> {
    let open = workspaces.open_count_of(who);
    let sessions = cloud_harness_mcp::sessions::per_principal();
    let mut used = vec![
        ("workspaces", open),
        ("sessions", sessions.get(who).copied().unwrap_or(0) as u64),
    ];
    used.extend(cloud_harness_control::limits::quotas().usage(who));
    used
}

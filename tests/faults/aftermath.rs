//! What must hold after a kill: before the restart, nothing of the dead server goes on (no
//! mount, no process); after it, nothing half-made stays (objects, rows, folders, mounts).

use super::site::{processes_naming, Site};
use crate::support::http::Running;
use cloud_harness_control::params;
use std::path::Path;
use std::time::{Duration, Instant};

/// FUSE mounts of the harness under `root`, from this namespace's mount table.
pub fn fuse_mounts_under(root: &Path) -> Vec<String> {
    let root = root.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(" - fuse") && l.contains("cloud-harness"))
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|point| point.starts_with(&root))
        .collect()
}

/// Within a few seconds of a kill: no mount of the dead server (its unmount guard detached
/// them) and no process of it (sandboxes, agents, the guard itself) is left.
pub fn settled(site: &Site, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mounts = fuse_mounts_under(site.root.path());
        let processes = processes_naming(site.root.path());
        if mounts.is_empty() && processes.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: left after the kill: mounts {mounts:?}, processes {processes:?}; the server and its guard said: {}",
            site.last_log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// After a restart, with the server `running`: every object whole, every workspace row open
/// and backed by its folder and its two mounts, every folder a workspace's, no import left
/// running (those queued run to their end), the SQLite file sound.
pub fn whole(site: &Site, running: &Running, what: &str) {
    let (ok, out) = site.cli(&["cas", "verify"]);
    assert!(ok, "{what}: cas verify: {out}");
    let db = cloud_harness_control::state::Db::open_sqlite(&site.home()).unwrap();
    let check: String = db
        .with(|c| c.query_row("PRAGMA integrity_check", params![], |r| r.get(0)))
        .unwrap();
    assert_eq!(check, "ok", "{what}");
    let rows: Vec<(String, String)> = db
        .with(|c| {
            c.query_map("SELECT id, state FROM workspaces", params![], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect()
        })
        .unwrap();
    let dir = site.home().join("workspaces");
    let mut folders: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    folders.sort();
    let mut open: Vec<String> = rows
        .iter()
        .filter(|(_, state)| state == "open")
        .map(|(id, _)| id.clone())
        .collect();
    open.sort();
    assert_eq!(
        rows.len(),
        open.len(),
        "{what}: rows of opens that never finished: {rows:?}"
    );
    assert_eq!(
        folders,
        open,
        "{what}: the workspace folders are not the open workspaces' (log: {})",
        running.log.lock().unwrap()
    );
    // No import left running by the dead server: the restart fails those, and runs the
    // queued ones (which then end), so within a while none is queued or running.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let unfinished: i64 = db
            .with(|c| {
                c.query_row(
                    "SELECT COUNT(*) FROM imports WHERE state IN ('queued', 'running')",
                    params![],
                    |r| r.get(0),
                )
            })
            .unwrap();
        if unfinished == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: an import is still queued or running a minute after the restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // No container but an open workspace's.
    for dir in containers_under(&site.home()) {
        let id = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            open.contains(&id),
            "{what}: a container of {} that is not open",
            dir.display()
        );
    }
    // Two mounts per open workspace, none else (restoring mounts them again).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mounts = fuse_mounts_under(site.root.path());
        if mounts.len() == 2 * open.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: mounts {mounts:?} for workspaces {open:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The workspace folders under `home` that Docker containers are labelled with.
pub fn containers_under(home: &Path) -> Vec<std::path::PathBuf> {
    let Ok(out) = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=io.cloud-harness.workspace-dir",
        ])
        .args(["--format", "{{.Label \"io.cloud-harness.workspace-dir\"}}"])
        .output()
    else {
        return Vec::new(); // no Docker here: no container either
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(std::path::PathBuf::from)
        .filter(|d| d.starts_with(home))
        .collect()
}

/// Once the last server is stopped: no mount, no process, and a collection sweeps what the
/// dead writers left in the store's scratch space, after which every object is whole.
pub fn swept(site: &Site) {
    settled(site, "the end");
    let (ok, out) = site.cli(&["cas", "gc", "--grace", "0"]);
    assert!(ok, "cas gc: {out}");
    let tmp = site.store().join("tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left in {}: {left:?}", tmp.display());
    let (ok, out) = site.cli(&["cas", "verify"]);
    assert!(ok, "cas verify after gc: {out}");
}

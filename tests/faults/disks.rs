//! Full disks: the store, a workspace's tree and the home with its state database each on a
//! small file system of their own (tmpfs, as root), filled. A call that needs the space gets
//! RESOURCE_EXHAUSTED naming ENOSPC and the path, nothing is published half, the server keeps
//! serving what it has (and `/readyz` says the disk is nearly full), and the same call
//! succeeds once space returns.

use super::site::{api, open, session, tool, Random, Site};
use super::toolkits::{workspace_of, Toolkits};
use crate::support::{dir, file, Repo};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmpfs of `mib` MiB at `at`, unmounted when dropped.
struct SmallDisk {
    at: PathBuf,
}

impl SmallDisk {
    /// `None` where this process may not mount (not root): skipped then, except under CI.
    fn mount(at: &Path, mib: u64) -> Option<SmallDisk> {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "the full-disk tests need root"
            );
            return None;
        }
        std::fs::create_dir_all(at).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs at {}", at.display());
        Some(SmallDisk { at: at.to_owned() })
    }

    /// Fills it but for `spare` bytes.
    fn fill(&self, spare: u64) {
        let vfs = nix::sys::statvfs::statvfs(&self.at).unwrap();
        let free = vfs.blocks_available() as u64 * vfs.fragment_size() as u64;
        let ballast = std::fs::File::create(self.ballast()).unwrap();
        ballast.set_len(0).unwrap();
        let mut left = free.saturating_sub(spare);
        // tmpfs allocates on write: write zeros, a MiB at a time.
        let chunk = vec![0u8; 1 << 20];
        let mut f = ballast;
        use std::io::Write;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if f.write_all(&chunk[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
    }

    /// Space again.
    fn free(&self) {
        std::fs::remove_file(self.ballast()).unwrap();
    }

    fn ballast(&self) -> PathBuf {
        self.at.join(".ballast")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

fn refused_for_space(result: &Value, path_part: &str) {
    assert_eq!(result["isError"], json!(true), "{result}");
    let e = &result["structuredContent"];
    assert_eq!(e["code"], "RESOURCE_EXHAUSTED", "{result}");
    assert_eq!(e["details"]["condition"], "ENOSPC", "{result}");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(path_part) && message.contains("ENOSPC"),
        "{result}"
    );
}

/// `/readyz` comes to say `disk space` is `ok` (or not).
fn readiness_says(site_addr: std::net::SocketAddr, ok: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body: Value = super::site::client()
            .get(format!("http://{site_addr}/readyz"))
            .send()
            .and_then(|r| r.text())
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        let said = body["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["check"] == "disk space"))
            .map(|c| c["ok"] == json!(true));
        if said == Some(ok) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "readyz never said disk space ok={ok}: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The store's disk fills: a cold open is refused naming the store and ENOSPC, nothing of it
/// is published, the open workspace keeps being served, and the same open succeeds later.
#[test]
fn a_full_store_refuses_a_cold_open_and_keeps_serving() {
    let kits = Toolkits::new();
    let mut env = kits.env("none");
    env.push(("CLOUD_HARNESS_MIN_FREE_MIB", "2".into()));
    let mut site = Site::new(&env, Random::unprinted());
    let Some(disk) = SmallDisk::mount(&site.store(), 32) else {
        return;
    };
    let running = site.serve();
    let kept = workspace_of(
        &open(
            &running,
            &json!({"idempotencyKey": "kept", "toolkits": [kits.commit(0)]}),
        )
        .unwrap(),
    );
    readiness_says(running.addr, true);
    disk.fill(64 << 10);
    let request = json!({"idempotencyKey": "later", "toolkits": [kits.commit(1)]});
    let refused = open(&running, &request).unwrap();
    refused_for_space(&refused, &site.store().display().to_string());
    readiness_says(running.addr, false);
    // Still serving what it has.
    let s = session(&running).unwrap();
    let read = tool(
        &running,
        &s,
        "skills_read",
        json!({"workspace": kept, "skill": "skill-2"}),
    )
    .unwrap();
    assert_ne!(read["isError"], json!(true), "{read}");
    let (ok, out) = site.cli(&["cas", "verify"]);
    assert!(ok, "{out}");
    let folders = std::fs::read_dir(site.home().join("workspaces"))
        .unwrap()
        .count();
    assert_eq!(folders, 1, "a refused open left a folder");
    disk.free();
    readiness_says(running.addr, true);
    let opened = open(&running, &request).unwrap();
    workspace_of(&opened);
    site.stop(running);
}

/// The workspaces' disk fills: an open whose project does not fit is refused naming the
/// workspace's tree and ENOSPC, leaves no folder, and succeeds with the same key later.
#[test]
fn a_full_workspace_tree_refuses_the_open_and_leaves_no_folder() {
    let kits = Toolkits::new();
    // A project of 6 MiB, on a disk of 4.
    let project = Repo::create(&kits.repos(), "project.git", false);
    let big: String = (0..6 << 20)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    project.commit(dir(vec![
        ("README.md", file("# project")),
        ("data.txt", file(&big)),
    ]));
    let mut site = Site::new(&kits.env("none"), Random::unprinted());
    let workspaces = site.home().join("workspaces");
    let Some(_disk) = SmallDisk::mount(&workspaces, 4) else {
        return;
    };
    let running = site.serve();
    let request = json!({"idempotencyKey": "project", "repositoryUrl": kits.url("project.git")});
    let refused = open(&running, &request).unwrap();
    refused_for_space(&refused, &workspaces.display().to_string());
    let left: Vec<_> = std::fs::read_dir(&workspaces)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left: {left:?}");
    // Space again: a larger disk.
    let status = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&workspaces)
        .status()
        .unwrap();
    assert!(status.success());
    let opened = open(&running, &request).unwrap();
    workspace_of(&opened);
    site.stop(running);
}

/// The home fills, its state database with it: a write of the control plane is refused
/// (507, RESOURCE_EXHAUSTED, ENOSPC, the database named), reads go on, nothing of the write
/// is kept, and the same write succeeds once space returns.
#[test]
fn a_full_home_refuses_a_write_of_the_state_database_and_keeps_reading() {
    let kits = Toolkits::new();
    let mut site = Site::new(&kits.env("none"), Random::unprinted());
    let Some(disk) = SmallDisk::mount(&site.home(), 16) else {
        return;
    };
    let running = site.serve();
    let member = kits.commit(0);
    api(
        &running,
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "first", "members": [member]})),
    )
    .unwrap();
    disk.fill(0);
    let body = json!({"id": "second", "members": [member]});
    let (status, answer) = api(&running, "POST", "/api/v1/sets", Some(body.clone())).unwrap();
    assert_eq!(status, 507, "{answer}");
    assert_eq!(answer["code"], "RESOURCE_EXHAUSTED", "{answer}");
    assert_eq!(answer["details"]["condition"], "ENOSPC", "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("state.db"),
        "{answer}"
    );
    let (status, sets) = api(&running, "GET", "/api/v1/sets", None).unwrap();
    assert_eq!(status, 200, "{sets}");
    let ids: Vec<&str> = sets["sets"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, ["first"], "{sets}");
    disk.free();
    let (status, answer) = api(&running, "POST", "/api/v1/sets", Some(body)).unwrap();
    assert!((200..300).contains(&status), "{status} {answer}");
    site.stop(running);
}

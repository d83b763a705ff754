//! The unmount guard of `serve`, as a service manager treats it: a guard killed on its own is
//! replaced and told every mount; a guard killed with its server (systemd's final SIGKILL to
//! the unit) leaves mounts that `mount-guard --sweep` (the unit's `ExecStopPost=`) and the
//! next start detach, after which the workspace serves again.

use crate::faults::aftermath::fuse_mounts_under;
use crate::support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::api::{world_of, World, BIN};
use support::http::server_mounting;

fn mounting_available() -> bool {
    let ok = nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "the mount tests need root and /dev/fuse"
        );
        eprintln!("skipped: needs root and /dev/fuse");
    }
    ok
}

/// A server that mounts its workspaces, over a warm one-skill toolkit; the toolkit's spec.
fn mounting_world() -> (World, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/kit");
    support::materialize(
        &src,
        &support::dir(vec![("lint", support::skill("lint", "Lint it."))]),
    );
    let kit = serde_json::to_value(support::warm_toolkit(&store, &src, "kit")).unwrap();
    let w = world_of(server_mounting(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
        ],
    ));
    (w, kit)
}

/// Opens a workspace; its merged mount, checked to serve the toolkit's skill.
fn open(w: &World, session: &str, key: &str, kit: &Value) -> PathBuf {
    let opened = w.tool(
        session,
        "workspace_open",
        json!({"idempotencyKey": key, "toolkits": [kit]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let ws = opened["structuredContent"]["workspace"].as_str().unwrap();
    let mount = w.home().join("workspaces").join(ws).join("mounts/skills");
    assert!(std::fs::read_to_string(mount.join("lint/SKILL.md"))
        .unwrap()
        .contains("Lint it."));
    mount
}

/// The server's unmount guard: its one live child process named like it.
fn guard_of(server: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let guards: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let Some(close) = stat.rfind(')') else {
                    return false;
                };
                let mut rest = stat[close + 1..].split_whitespace();
                let state = rest.next().unwrap_or("Z");
                let parent = rest.next().and_then(|p| p.parse::<u32>().ok());
                stat.contains("(cloud-harness)") && state != "Z" && parent == Some(server)
            })
            .collect();
        if guards.len() == 1 {
            return guards[0];
        }
        assert!(Instant::now() < deadline, "unmount guards: {guards:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_guard_killed_on_its_own_is_replaced_and_told_every_mount() {
    if !mounting_available() {
        return;
    }
    let (mut w, kit) = mounting_world();
    let session = w.session();
    open(&w, &session, "before", &kit);
    let server = w.server.child.id();
    let first = guard_of(server);
    kill(first);
    // The next mount finds the guard gone, and starts another told of the earlier mounts.
    open(&w, &session, "after", &kit);
    let second = guard_of(server);
    assert_ne!(first, second);
    let workspaces = w.home().join("workspaces");
    assert_eq!(fuse_mounts_under(&workspaces).len(), 4);
    kill(server);
    w.server.child.wait().unwrap();
    wait_until("the new guard detaches all four mounts", || {
        fuse_mounts_under(&workspaces).is_empty()
    });
}

#[test]
fn mounts_left_by_a_server_killed_with_its_guard_are_swept_and_served_again() {
    if !mounting_available() {
        return;
    }
    let (mut w, kit) = mounting_world();
    let session = w.session();
    let mount = open(&w, &session, "kept", &kit);
    let workspaces = w.home().join("workspaces");
    let server = w.server.child.id();
    // As systemd's final SIGKILL to the unit: the guard with the server.
    kill(guard_of(server));
    kill(server);
    w.server.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        fuse_mounts_under(&workspaces).len(),
        2,
        "the premise: mounts left"
    );

    // The unit's ExecStopPost=.
    let swept = Command::new(BIN)
        .args(["mount-guard", "--sweep"])
        .arg(&workspaces)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&swept.stderr);
    assert!(swept.status.success(), "{said}");
    assert!(said.contains("detached 2 mount(s)"), "{said}");
    assert!(fuse_mounts_under(&workspaces).is_empty());
    // Nothing left: a second sweep detaches nothing, and says nothing.
    let again = Command::new(BIN)
        .args(["mount-guard", "--sweep"])
        .arg(&workspaces)
        .output()
        .unwrap();
    assert!(again.status.success() && again.stderr.is_empty());

    // Killed the same way again, without the sweep: the next start detaches what is left
    // before it restores the workspace, whose mount serves again.
    let root = w.server.tmp.path().to_owned();
    let env = [
        ("CLOUD_HARNESS_EXECUTOR", "none"),
        ("CLOUD_HARNESS_CONTAINERS", "off"),
        ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
    ];
    let mut restarted = support::http::start(&root, &[], &env).unwrap();
    wait_until("the workspace is served again", || {
        std::fs::read_to_string(mount.join("lint/SKILL.md")).is_ok_and(|t| t.contains("Lint it."))
    });
    kill(guard_of(restarted.child.id()));
    kill(restarted.child.id());
    restarted.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(fuse_mounts_under(&workspaces).len(), 2);
    let mut last = support::http::start(&root, &[], &env).unwrap();
    wait_until("the workspace is served after the start's sweep", || {
        std::fs::read_to_string(mount.join("lint/SKILL.md")).is_ok_and(|t| t.contains("Lint it."))
    });
    let log = last.log.lock().unwrap().clone();
    assert!(
        log.contains("detached the mounts a server that is gone left behind"),
        "{log}"
    );
    assert_eq!(fuse_mounts_under(&workspaces).len(), 2);
    kill(last.child.id());
    last.child.wait().unwrap();
    wait_until("the guard detaches them", || {
        fuse_mounts_under(&workspaces).is_empty()
    });
}

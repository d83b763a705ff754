//! The unmount guard of `serve`, as a service manager treats it: a guard killed on its own is
//! replaced and told every mount; a guard killed with its server (systemd's final SIGKILL to
//! the unit) leaves mounts that `mount-guard --sweep` (the unit's `ExecStopPost=`) and the
//! next start detach, after which the workspace serves again.

use crate::faults::aftermath::fuse_mounts_under;
use crate::support;

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::api::{world_of, World, BIN};
use support::http::server_mounting;

/// A server that mounts its workspaces, over a warm one-skill toolkit; the toolkit's spec.
fn mounting_world() -> (World, Value) {
    mounting_world_with("none")
}

/// The same, its workspaces' executors of `kind`.
fn mounting_world_with(kind: &str) -> (World, Value) {
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
            ("CLOUD_HARNESS_EXECUTOR", kind),
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
    let guards = || -> Vec<u32> {
        support::procs::children_of(server)
            .into_iter()
            .filter(|(_, name, state)| name == "cloud-harness" && *state != 'Z')
            .map(|(pid, _, _)| pid)
            .collect()
    };
    let found = std::cell::Cell::new(0);
    support::wait::until("one unmount guard", Duration::from_secs(10), || {
        let now = guards();
        found.set(now.first().copied().unwrap_or(0));
        now.len() == 1
    });
    found.get()
}

fn kill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

#[test]
fn a_guard_killed_on_its_own_is_replaced_and_told_every_mount() {
    if !support::wait::mounting_available() {
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
    support::wait::until(
        "the new guard detaches all four mounts",
        Duration::from_secs(15),
        || fuse_mounts_under(&workspaces).is_empty(),
    );
}

#[test]
fn mounts_left_by_a_server_killed_with_its_guard_are_swept_and_served_again() {
    if !support::wait::mounting_available() {
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

    // The unit's ExecStopPost=, its home from the configuration (here the variable).
    let swept = Command::new(BIN)
        .args(["mount-guard", "--sweep"])
        .env("CLOUD_HARNESS_HOME", w.home())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&swept.stderr);
    assert!(swept.status.success(), "{said}");
    assert!(said.contains("detached 2 mount(s)"), "{said}");
    assert!(fuse_mounts_under(&workspaces).is_empty());
    // Nothing left: a second sweep detaches nothing, and says nothing.
    let again = Command::new(BIN)
        .args(["mount-guard", "--sweep", "--home"])
        .arg(w.home())
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
    support::wait::until(
        "the workspace is served again",
        Duration::from_secs(15),
        || {
            std::fs::read_to_string(mount.join("lint/SKILL.md"))
                .is_ok_and(|t| t.contains("Lint it."))
        },
    );
    kill(guard_of(restarted.child.id()));
    kill(restarted.child.id());
    restarted.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(fuse_mounts_under(&workspaces).len(), 2);
    let mut last = support::http::start(&root, &[], &env).unwrap();
    support::wait::until(
        "the workspace is served after the start's sweep",
        Duration::from_secs(15),
        || {
            std::fs::read_to_string(mount.join("lint/SKILL.md"))
                .is_ok_and(|t| t.contains("Lint it."))
        },
    );
    let log = last.log.lock().unwrap().clone();
    assert!(
        log.contains("detached the mounts a server that is gone left behind"),
        "{log}"
    );
    assert_eq!(fuse_mounts_under(&workspaces).len(), 2);
    kill(last.child.id());
    last.child.wait().unwrap();
    support::wait::until("the guard detaches them", Duration::from_secs(15), || {
        fuse_mounts_under(&workspaces).is_empty()
    });
}

/// A guard reads no configuration: one the daemon could not read (or one broken since the
/// daemon started) must not leave its mounts unguarded. It says it is ready, and with its
/// daemon gone at once, ends having detached nothing.
#[test]
fn the_guard_starts_and_says_so_whatever_the_configuration() {
    let out = Command::new(BIN)
        .arg("mount-guard")
        .env("CLOUD_HARNESS_CONFIG", "/nonexistent/config.toml")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"R");
}

/// A second server on a served home is refused before it touches anything: the first's
/// mounts stay mounted and serving.
#[test]
fn a_second_server_on_the_same_home_is_refused_and_leaves_the_first_serving() {
    if !support::wait::mounting_available() {
        return;
    }
    let (w, kit) = mounting_world();
    let session = w.session();
    let mount = open(&w, &session, "first", &kit);
    let root = w.server.tmp.path().to_owned();
    let env = [
        ("CLOUD_HARNESS_EXECUTOR", "none"),
        ("CLOUD_HARNESS_CONTAINERS", "off"),
    ];
    let said = match support::http::start(&root, &[], &env) {
        Err(early) => early,
        Ok(mut second) => {
            let status = second.child.wait().unwrap();
            assert!(!status.success(), "the second server ran");
            let log = second.log.lock().unwrap().clone();
            log
        }
    };
    assert!(said.contains("another server serves the home"), "{said}");
    // Nor does a sweep (the unit's ExecStopPost= after that refused start) touch them.
    let swept = Command::new(BIN)
        .args(["mount-guard", "--sweep", "--home"])
        .arg(w.home())
        .output()
        .unwrap();
    let told = String::from_utf8_lossy(&swept.stderr);
    assert!(swept.status.success(), "{told}");
    assert!(
        told.contains("served by a running server: nothing swept"),
        "{told}"
    );
    assert!(std::fs::read_to_string(mount.join("lint/SKILL.md"))
        .unwrap()
        .contains("Lint it."));
    assert_eq!(
        fuse_mounts_under(&w.home().join("workspaces")).len(),
        2,
        "the first server's mounts"
    );
}

/// The mounts under `root`, by mount point (the folder of all workspaces among them).
fn mounts_under(root: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(PathBuf::from))
        .filter(|point| point.starts_with(root))
        .collect()
}

/// With bubblewrap sandboxes (as root), the folder of all workspaces is a mount of the
/// server's own while it runs (a sandbox starts without the other workspaces' mounts). A
/// server killed alone leaves nothing under its home once its guard has run; one killed with
/// its guard leaves that mount, which `mount-guard --sweep` detaches after the workspaces';
/// the next start serves its workspace in a new one, and undoes it when it stops.
#[test]
fn a_bubblewrap_servers_folder_mount_goes_with_it_however_it_ends() {
    if !support::executors::available(cloud_harness_executor::Kind::Bwrap) {
        return;
    }
    let (mut w, kit) = mounting_world_with("bwrap");
    let root = std::fs::canonicalize(w.server.tmp.path()).unwrap();
    let env = [
        ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
        ("CLOUD_HARNESS_CONTAINERS", "off"),
        ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
    ];
    let session = w.session();
    let mount = open(&w, &session, "kept", &kit);
    let folder = std::fs::canonicalize(w.home().join("workspaces")).unwrap();
    let at_folder = || {
        mounts_under(&root)
            .iter()
            .filter(|point| **point == folder)
            .count()
    };
    assert_eq!(at_folder(), 1, "{:?}", mounts_under(&root));

    kill(w.server.child.id());
    w.server.child.wait().unwrap();
    support::wait::until(
        "the guard detaches the mounts and the folder's",
        Duration::from_secs(15),
        || mounts_under(&root).is_empty(),
    );
    // And forgets the bind as its server would have.
    assert!(!w.home().join("workspaces.mount-id").exists());

    let served = || {
        std::fs::read_to_string(mount.join("lint/SKILL.md")).is_ok_and(|t| t.contains("Lint it."))
    };
    let mut restarted = support::http::start(&root, &[], &env).unwrap();
    support::wait::until("served again", Duration::from_secs(15), served);
    kill(guard_of(restarted.child.id()));
    kill(restarted.child.id());
    restarted.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(at_folder(), 1, "the premise: the folder's mount left");
    // The unit's ExecStopPost=: the workspaces' mounts, then the folder's.
    let swept = Command::new(BIN)
        .args(["mount-guard", "--sweep", "--home"])
        .arg(root.join("home"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&swept.stderr);
    assert!(swept.status.success(), "{said}");
    assert!(said.contains("detached 3 mount(s)"), "{said}");
    assert!(mounts_under(&root).is_empty(), "{:?}", mounts_under(&root));

    let mut last = support::http::start(&root, &[], &env).unwrap();
    support::wait::until("served after a restart", Duration::from_secs(15), served);
    assert_eq!(at_folder(), 1, "{:?}", mounts_under(&root));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(last.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(last.child.wait().unwrap().success());
    assert!(mounts_under(&root).is_empty(), "{:?}", mounts_under(&root));
}

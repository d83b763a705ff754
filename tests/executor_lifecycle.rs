//! Executors over a workspace's life, on both backends: one stopped or removed behind the
//! harness's back, closing a workspace while a script runs or while its mount is busy, and a
//! start that finds what an open cut short.
//!
//! Needs root, `/dev/fuse`, and per backend a Docker engine or bubblewrap: without them the
//! tests say so and pass, except when `CI` is set.

use crate::support;

use cloud_harness_executor::{Kind, Settings};
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::Workspaces;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::executors::{available, harness};

#[test]
fn an_executor_stopped_or_removed_behind_the_harness_back() {
    if !available(Kind::Docker) {
        return;
    }
    let h = harness(Kind::Docker);
    let result = h.open("gone");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    let container = result["executor"]["id"].as_str().unwrap();
    // A stopped container (a reboot, an operator) is started again on the next command.
    let stopped = Command::new("docker")
        .args(["stop", "-t", "1", container])
        .output()
        .unwrap();
    assert!(stopped.status.success());
    let (code, out, err) = h.exec(
        &ws,
        &["cat", "/opt/cloud-harness/skills/alpha/SKILL.md"],
        b"",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Alpha."), "{out}");
    let removed = Command::new("docker")
        .args(["rm", "-f", container])
        .output()
        .unwrap();
    assert!(removed.status.success());
    let (code, _, err) = h.exec(&ws, &["true"], b"");
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("is gone") && err.contains(&ws), "{err}");
    let digest = support::skill_digest(&result, "alpha");
    h.approve(&digest);
    let e = h.run(&ws, "scripts/hello.sh").unwrap_err();
    assert_eq!(e.code, cloud_harness_error::Code::Upstream, "{e}");
    assert!(e.message.contains("is gone"), "{e}");
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

fn close_while_running(kind: Kind) {
    let h = Arc::new(harness(kind));
    let result = h.open("busy");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    let digest = support::skill_digest(&result, "alpha");
    h.approve(&digest);
    let running = {
        let (h, ws) = (h.clone(), ws.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            (h.run(&ws, "scripts/long.sh"), started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    h.workspaces.close(&ws).unwrap();
    let (outcome, took) = running.join().unwrap();
    assert!(
        took < Duration::from_secs(30),
        "the run outlived its workspace: {took:?}"
    );
    let outcome = outcome.unwrap();
    assert!(
        outcome["cancelled"] == true || outcome["exitCode"] != 0,
        "{outcome}"
    );
    h.assert_nothing_left();
}

#[test]
fn closing_a_workspace_stops_its_running_script_on_docker() {
    if available(Kind::Docker) {
        close_while_running(Kind::Docker);
    }
}

#[test]
fn closing_a_workspace_stops_its_running_script_on_bwrap() {
    if available(Kind::Bwrap) {
        close_while_running(Kind::Bwrap);
    }
}

/// Closing never hangs on a busy mount: a file held open in the skills mount makes the
/// unmount lazy, and closing returns anyway.
#[test]
fn closing_with_a_busy_mount_does_not_hang() {
    if !available(Kind::Bwrap) {
        return;
    }
    let h = harness(Kind::Bwrap);
    let result = h.open("busy-mount");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    let held = std::fs::File::open(
        h.home()
            .join("workspaces")
            .join(&ws)
            .join("mounts/skills/alpha/SKILL.md"),
    )
    .unwrap();
    // On a thread, so a regression fails here instead of hanging the suite.
    let (done, closed) = std::sync::mpsc::channel();
    let workspaces = h.workspaces.clone();
    std::thread::spawn(move || done.send(workspaces.close(&ws)).unwrap());
    let outcome = closed
        .recv_timeout(Duration::from_secs(20))
        .expect("closing waited for the mount's last user");
    outcome.unwrap();
    drop(held);
}

/// A server killed in the middle of an open leaves a folder (and a container) without a
/// record; the next start removes them.
#[test]
fn a_start_removes_what_an_open_cut_short_left() {
    if !available(Kind::Docker) {
        return;
    }
    let h = harness(Kind::Docker);
    let result = h.open("cut-short");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    let dir = h.home().join("workspaces").join(&ws);
    // As if the server died before writing the record.
    std::fs::remove_file(dir.join("workspace.json")).unwrap();
    h.workspaces.shutdown();
    let store = Store::open(h.tmp.path().join("store")).unwrap();
    let again = Workspaces::with_executors(
        h.home(),
        support::warm_provisioner(&store),
        true,
        Settings::with_kind(Kind::Docker),
    )
    .unwrap();
    assert!(!dir.exists(), "the half-made workspace is still there");
    drop(again);
    h.assert_nothing_left();
}

/// The containers under `home` (by the workspace folder each is labelled with).
fn containers_under(home: &std::path::Path) -> Vec<(String, String)> {
    let out = Command::new("docker")
        .args(["ps", "-a", "--no-trunc", "--format"])
        .arg("{{.ID}} {{.Label \"io.cloud-harness.workspace-dir\"}}")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, dir)| std::path::Path::new(dir).starts_with(home))
        .map(|(id, dir)| (id.to_owned(), dir.to_owned()))
        .collect()
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < Duration::from_secs(60), "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Docker executors made ahead: an open takes one that was running before it; two opens get
/// two, each bound to its own workspace's folders only, sharing nothing; spares are made
/// again, one removed behind the harness's back is not handed out, and a stop removes them.
#[test]
fn spare_docker_executors_are_taken_by_opens_and_never_shared() {
    if !available(Kind::Docker) {
        return;
    }
    let settings = Settings {
        spares: 2,
        ..Settings::with_kind(Kind::Docker)
    };
    let h = support::executors::harness_with(settings, support::warm_provisioner);
    wait_for("two spares", || h.workspaces.spare_executors() == 2);
    let before: Vec<String> = containers_under(&h.home())
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(before.len(), 2, "{before:?}");

    let a = h.open("spare-a");
    let b = h.open("spare-b");
    let (wa, wb) = (
        a["workspace"].as_str().unwrap().to_owned(),
        b["workspace"].as_str().unwrap().to_owned(),
    );
    let (ca, cb) = (
        a["executor"]["id"].as_str().unwrap().to_owned(),
        b["executor"]["id"].as_str().unwrap().to_owned(),
    );
    assert_ne!(ca, cb);
    assert!(before.contains(&ca) && before.contains(&cb), "{a}\n{b}");
    // Each container is labelled with, and binds, its own workspace's folders only.
    for (ws, container, other) in [(&wa, &ca, &wb), (&wb, &cb, &wa)] {
        let labelled = containers_under(&h.home());
        let dir = &labelled.iter().find(|(id, _)| id == container).unwrap().1;
        assert!(dir.ends_with(ws.as_str()), "{dir}");
        let out = Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{range .Mounts}}{{.Source}} {{end}}",
                container,
            ])
            .output()
            .unwrap();
        let sources = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(sources.contains(ws.as_str()), "{sources}");
        assert!(!sources.contains(other.as_str()), "{sources}");
    }
    // What one workspace's runs write, the other's never see.
    let (code, _, err) = h.exec(&wa, &["sh", "-c", "echo a > /tmp/mark; echo a > mark"], b"");
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = h.exec(
        &wb,
        &["sh", "-c", "cat /tmp/mark mark 2>/dev/null; echo seen"],
        b"",
    );
    assert_eq!((code, out.as_str()), (0, "seen\n"), "{err}");
    let (code, out, _) = h.exec(&wa, &["cat", "/tmp/mark", "mark"], b"");
    assert_eq!((code, out.as_str()), (0, "a\na\n"));

    wait_for("the spares made again", || {
        h.workspaces.spare_executors() == 2
    });
    // Spares whose containers went away behind the harness's back are not handed out.
    for (id, _) in containers_under(&h.home()) {
        if id != ca && id != cb {
            let removed = Command::new("docker")
                .args(["rm", "-f", &id])
                .output()
                .unwrap();
            assert!(removed.status.success());
        }
    }
    let c = h.open("spare-c");
    let wc = c["workspace"].as_str().unwrap().to_owned();
    let (code, out, err) = h.exec(&wc, &["echo", "ok"], b"");
    assert_eq!((code, out.as_str()), (0, "ok\n"), "{err}");
    for ws in [&wa, &wb, &wc] {
        h.workspaces.close(ws).unwrap();
    }
    h.workspaces.stop_spares();
    h.assert_nothing_left();
}

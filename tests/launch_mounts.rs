//! The mounts a bubblewrap sandbox starts from (`cloud_harness_executor::launch_mounts`):
//! as root, the workspaces folder is a private mount of itself while the server runs, and a
//! sandbox starts without the other workspaces' mounts in view.
//!
//! Needs root, `/dev/fuse` and bubblewrap: without them the test says so and passes, except
//! when `CI` is set.

use crate::support;

use cloud_harness_executor::Kind;
use serde_json::Value;
use support::executors::{available, harness, Harness};

/// A bubblewrap sandbox starts from a namespace without the other workspaces' mounts
/// (bubblewrap reads the mount table once per bind: each mount on the host made every start
/// slower): its own workspace's are there, no other's, not even of one opened since. The
/// namespace bubblewrap's own process stays in is emptied once the sandbox is up (it would
/// keep the host's mounts of then alive). The host keeps every workspace's mounts, which still
/// serve their runs; once every workspace is closed and the server gone, no mount is left
/// under the home (the workspaces folder's own mount goes with the server).
#[test]
fn a_sandbox_starts_without_the_other_workspaces_mounts() {
    if !available(Kind::Bwrap) {
        return;
    }
    let h = harness(Kind::Bwrap);
    let first = h.open("first");
    h.approve(&support::skill_digest(&first, "alpha"));
    let second = h.open("second");
    let dir = |open: &Value| {
        let id = open["workspace"].as_str().unwrap();
        let dir = h.home().join("workspaces").join(id);
        std::fs::canonicalize(dir).unwrap().display().to_string()
    };
    let (first_dir, second_dir) = (dir(&first), dir(&second));
    // A sandbox starts at its workspace's first run.
    h.ran(first["workspace"].as_str().unwrap(), "scripts/hello.sh");
    h.ran(second["workspace"].as_str().unwrap(), "scripts/hello.sh");
    let workspaces = std::fs::canonicalize(h.home().join("workspaces")).unwrap();
    let workspaces = workspaces.display().to_string();
    // A workspace opened since is not in a namespace started now either (the workspaces
    // folder is private on the host).
    let third = h.open("third");
    let third_dir = dir(&third);
    let own = std::path::Path::new(&second_dir);
    let own = cloud_harness_executor::launch_mounts::Narrowing::wanted(own)
        .expect("the workspaces folder is narrowed from");
    // What the sandbox's bubblewrap is started as, starting `cat` instead.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut cat = std::process::Command::new(support::executors::BIN);
    cat.arg(cloud_harness_executor::launcher::COMMAND)
        .arg("--narrow")
        .arg(&own)
        .args(["--", "/bin/cat", "/proc/self/mountinfo"])
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let started = cat.spawn().unwrap();
    let agent = std::os::unix::net::UnixStream::pair().unwrap().0;
    cloud_harness_executor::launcher::hand(
        &std::os::fd::OwnedFd::from(ours),
        std::os::fd::AsRawFd::as_raw_fd(&agent),
        None,
        &[],
    )
    .unwrap();
    let out = started.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let seen = String::from_utf8(out.stdout).unwrap();
    assert!(
        seen.contains(&format!("{second_dir}/mounts/skills ")),
        "{seen}"
    );
    assert!(!seen.contains(&first_dir), "{seen}");
    assert!(!seen.contains(&third_dir), "{seen}");
    for line in seen.lines() {
        let point = line.split(' ').nth(4).unwrap_or_default();
        if point.starts_with(&workspaces) {
            assert!(point.starts_with(&second_dir), "{line}");
        }
    }
    // bubblewrap's own process: in a namespace not the host's, emptied soon after.
    let me = std::process::id().to_string();
    let bwrap = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1));
            let program = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            program.ends_with(b"/bwrap")
                && String::from_utf8_lossy(&cmdline).contains(&second_dir)
                && ppid == Some(me.as_str())
        })
        .expect("the bubblewrap of the second workspace");
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(ns(&bwrap.to_string()), ns("self"));
    let left = || std::fs::read_to_string(format!("/proc/{bwrap}/mountinfo")).unwrap();
    support::wait::until(
        "bubblewrap's namespace emptied",
        std::time::Duration::from_secs(10),
        || left().lines().count() <= 2,
    );
    assert!(!left().contains(&second_dir), "{}", left());
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(host.contains(&format!("{first_dir}/mounts/skills ")));
    assert!(host.contains(&format!("{first_dir}/mounts/owner-skills ")));
    let ws = first["workspace"].as_str().unwrap();
    let hello = h.ran(ws, "scripts/hello.sh");
    assert_eq!(hello["stdout"], "hello from /workspace\n", "{hello}");
    let (code, out, err) = h.exec(
        ws,
        &["cat", "/opt/cloud-harness/skills/alpha/SKILL.md"],
        b"",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("The alpha skill."), "{out}");
    // The workspaces folder is a mount of its own while the server runs.
    assert!(
        host.lines()
            .any(|line| line.split(' ').nth(4) == Some(workspaces.as_str())),
        "{host}"
    );
    for open in [&first, &second, &third] {
        h.workspaces
            .close(open["workspace"].as_str().unwrap())
            .unwrap();
    }
    h.assert_nothing_left();
    // With the server, its mount goes too.
    let Harness {
        tmp, workspaces, ..
    } = h;
    drop(workspaces);
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let home = tmp.path().display().to_string();
    assert!(!host.contains(&home), "{host}");
}

/// bubblewrap's launcher answers on its socket why it could not start the program, and
/// refuses a message not of its own version; it exits 127 either way.
#[test]
fn the_launcher_says_why_it_could_not_start() {
    use std::io::{Read, Write};
    let launch = |program: &str| {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let child = std::process::Command::new(support::executors::BIN)
            .arg(cloud_harness_executor::launcher::COMMAND)
            .args(["--", program])
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                theirs,
            )))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        (ours, child)
    };
    let agent = std::os::unix::net::UnixStream::pair().unwrap().0;
    let (ours, mut child) = launch("/nonexistent/bwrap");
    let ours = std::os::fd::OwnedFd::from(ours);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&agent);
    cloud_harness_executor::launcher::hand(&ours, fd, None, &[]).unwrap();
    let mut said = String::new();
    std::fs::File::from(ours).read_to_string(&mut said).unwrap();
    assert!(
        said.contains("starting /nonexistent/bwrap") && said.contains("No such file"),
        "{said}"
    );
    assert_eq!(child.wait().unwrap().code(), Some(127));

    // Another version's message (or anything else): refused, nothing started.
    let (mut ours, mut child) = launch("/bin/true");
    ours.write_all(b"garbage").unwrap();
    let mut said = String::new();
    ours.read_to_string(&mut said).unwrap();
    assert!(said.contains("not this launcher's"), "{said}");
    assert_eq!(child.wait().unwrap().code(), Some(127));
}

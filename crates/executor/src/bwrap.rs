//! The bubblewrap executor: a fresh sandbox per command, with the layout of every executor.
//!
//! New pid, ipc, uts, cgroup and network namespaces (the network one has only its own
//! loopback), the host's userland read-only, a read-only root, a private `/tmp`, the process
//! dies with its parent. As root, bubblewrap runs privileged and the command drops to the
//! executor's uid with `setpriv` (no capabilities, an empty bounding set, no new privileges);
//! otherwise bubblewrap makes a user namespace and the command keeps this user's uid.

use super::userland::{self, Entry};
use super::{Places, Spec, ROOT, WORKSPACE};
use cloud_harness_error::Error;

/// Processes the executor's user may have at once.
const NPROC: u32 = 1024;
const TMP_BYTES: u64 = 1 << 30;

fn as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether bubblewrap (and, as root, `setpriv`) is installed.
pub fn available() -> bool {
    let runs = std::process::Command::new("bwrap")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    runs && (!as_root() || std::path::Path::new("/usr/bin/setpriv").exists())
}

/// A sandbox that could not start, said with what to install.
pub fn explain(e: Error) -> Error {
    if e.code == cloud_harness_error::Code::NotFound {
        Error::new(
            cloud_harness_error::Code::Forbidden,
            format!(
                "the bubblewrap executor needs `bwrap` (Debian: apt-get install bubblewrap): {}",
                e.message
            ),
        )
    } else {
        e
    }
}

/// The command line running `command` in a sandbox of `places`, with exactly `env` and, if
/// given, a run's limits (set by the `prlimit` that already bounds the processes).
pub fn argv(
    places: &Places,
    spec: &Spec,
    command: &[String],
    env: &[(String, String)],
    limits: Option<super::rlimits::RunLimits>,
) -> Vec<String> {
    let mut a: Vec<String> = [
        "bwrap",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "executor",
        "--die-with-parent",
        "--new-session",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    if as_root() {
        // Kept only long enough for setpriv to become the executor's user.
        push(&["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]);
    } else {
        push(&["--unshare-user", "--disable-userns"]);
    }
    // Folders bubblewrap makes on its own are 0700 when it runs as root: make the parents of
    // every mount point first, readable by the executor's user.
    let mut parents = std::collections::BTreeSet::new();
    let mut dest = |a: &mut Vec<String>, path: &str| {
        let mut prefix = std::path::PathBuf::from("/");
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            prefix.push(part);
            let dir = prefix.display().to_string();
            if parents.insert(dir.clone()) {
                a.extend(["--perms", "0755", "--dir"].iter().map(|s| s.to_string()));
                a.push(dir);
            }
        }
    };
    for entry in userland::entries() {
        match &entry {
            Entry::Bind(path) => {
                dest(&mut a, path);
                a.extend(["--ro-bind", path, path].iter().map(|s| s.to_string()));
            }
            Entry::Symlink(path, target) => {
                dest(&mut a, path);
                a.extend(["--symlink", target, path].iter().map(|s| s.to_string()));
            }
        }
    }
    for (name, _) in userland::identity(spec.uid, spec.gid) {
        let host = places.etc.join(name).display().to_string();
        let inside = format!("/etc/{name}");
        dest(&mut a, &inside);
        a.extend(["--ro-bind".to_owned(), host, inside]);
    }
    let repo = places.repo.display().to_string();
    let mounts = places.mounts.display().to_string();
    dest(&mut a, ROOT);
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    push(&["--proc", "/proc", "--dev", "/dev"]);
    push(&[
        "--perms",
        "1777",
        "--size",
        &TMP_BYTES.to_string(),
        "--tmpfs",
        "/tmp",
    ]);
    push(&["--bind", &repo, WORKSPACE, "--ro-bind", &mounts, ROOT]);
    push(&["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]);
    for (k, v) in env {
        push(&["--setenv", k, v]);
    }
    push(&["--"]);
    if as_root() {
        push(&[
            "/usr/bin/setpriv",
            &format!("--reuid={}", spec.uid),
            &format!("--regid={}", spec.gid),
            "--clear-groups",
            "--no-new-privs",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--",
        ]);
    }
    push(&["/usr/bin/prlimit", &format!("--nproc={NPROC}")]);
    if let Some(l) = limits {
        push(&[
            &format!("--cpu={}", l.cpu_seconds),
            &format!("--data={}", l.memory),
        ]);
    }
    push(&["--"]);
    a.extend(command.iter().cloned());
    a
}

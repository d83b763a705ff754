//! The bubblewrap executor: one sandbox per workspace, made at its first run and kept, whose
//! pid 1 is the run agent; every run of the workspace is the agent's child.
//!
//! New pid, ipc, uts, cgroup and network namespaces (the network one has only its own
//! loopback), the host's userland read-only, a read-only root, a private `/tmp`, the sandbox
//! dies with the harness. As root, bubblewrap runs privileged and the agent keeps only the
//! capabilities it needs to start runs as the executor's uid (setuid, setgid, setpcap to
//! empty the runs' bounding set, kill for their groups); a run keeps none. Otherwise
//! bubblewrap makes a user namespace, and runs keep this user's uid. The agent talks to the
//! harness over an inherited socket with no name.

use super::link::Link;
use super::userland::{self, Entry};
use super::{Places, ROOT, WORKSPACE};
use cloud_harness_error::Error;

const TMP_BYTES: u64 = 1 << 30;

fn as_root() -> bool {
    nix::unistd::geteuid().is_root()
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

/// Where the agent's binary is inside every executor.
pub(crate) const AGENT: &str = "/run/cloud-harness/agent";

/// The command line of a sandbox of `places` whose pid 1 is the agent at `agent` (a host
/// path), talking on descriptor 3.
pub fn argv(places: &Places, agent: &std::path::Path) -> Vec<String> {
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
        "--as-pid-1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    if as_root() {
        for cap in ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL"] {
            push(&["--cap-add", cap]);
        }
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
    for name in userland::IDENTITY {
        let host = places.etc.join(name).display().to_string();
        let inside = format!("/etc/{name}");
        dest(&mut a, &inside);
        a.extend(["--ro-bind".to_owned(), host, inside]);
    }
    let repo = places.repo.display().to_string();
    let mounts = places.mounts.display().to_string();
    dest(&mut a, ROOT);
    dest(&mut a, AGENT);
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
    push(&["--ro-bind", &agent.display().to_string(), AGENT]);
    push(&["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]);
    for (name, value) in crate::agent::ENV {
        push(&["--setenv", name, value]);
    }
    push(&["--"]);
    push(&[
        AGENT,
        crate::agent::COMMAND,
        "--fd",
        &super::launcher::AGENT_FD.to_string(),
    ]);
    a
}

/// Starts the sandbox of `places` in `group` (if any), with a way out through the egress
/// proxy when `egress` has its policy, and links to its agent. On the links' runtime.
pub async fn start(
    places: &Places,
    agent: &std::path::Path,
    group: Option<super::cgroup::Group>,
    egress: Option<std::sync::Arc<cloud_harness_provision::egress::EgressPolicy>>,
) -> cloud_harness_error::Result<Link> {
    use std::os::fd::AsRawFd;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| Error::internal(format!("a socket for the executor's agent: {e}")))?;
    let mut argv = argv(places, agent);
    // bubblewrap says the pid of the sandbox's first process there: the proxy's listener is
    // made in its network namespace.
    let info = match egress {
        Some(_) => {
            let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| Error::internal(format!("a pipe for bubblewrap: {e}")))?;
            argv.insert(1, super::launcher::INFO_FD.to_string());
            argv.insert(1, "--info-fd".to_owned());
            Some((read, write))
        }
        None => None,
    };
    // Started by the launcher (this program again), which `posix_spawn` starts: nothing of
    // the server's is copied (see `launcher`).
    let program = bwrap_program().ok_or_else(|| {
        explain(Error::new(
            cloud_harness_error::Code::NotFound,
            "cannot start bwrap: it is on no folder of PATH",
        ))
    })?;
    let own = places.repo.parent().unwrap_or(std::path::Path::new("/"));
    let narrowed = super::launch_mounts::Narrowing::wanted(own);
    let (launcher, given) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| Error::internal(format!("a socket for bubblewrap's launcher: {e}")))?;
    let program_of_launcher = launcher_program(agent);
    // Reaped by the links' runtime, whichever runtime (if any) the caller is on. The command
    // goes right after: it holds a copy of the launcher's socket, whose end says it started.
    let child = {
        let mut cmd = tokio::process::Command::new(&program_of_launcher);
        cmd.arg(super::launcher::COMMAND);
        if let Some(own) = &narrowed {
            cmd.arg("--narrow").arg(own);
        }
        cmd.arg("--")
            .arg(program)
            .args(&argv[1..])
            .env_clear()
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(given)))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        let _inside = super::link::runtime().enter();
        cmd.spawn()
    }
    .map_err(|e| {
        Error::internal(format!(
            "cannot start bubblewrap's launcher {}: {e}",
            program_of_launcher.display()
        ))
    })?;
    let joins = group
        .as_ref()
        .map(super::cgroup::Group::join_fds)
        .unwrap_or_default();
    let info_fd = info.as_ref().map(|(_, w)| w.as_raw_fd());
    let launcher = std::os::fd::OwnedFd::from(launcher);
    super::launcher::hand(&launcher, theirs.as_raw_fd(), info_fd, &joins)
        .map_err(|e| Error::internal(format!("bubblewrap's launcher: {e}")))?;
    drop(theirs);
    super::launcher::answer(launcher)
        .await
        .map_err(|e| Error::internal(format!("starting bubblewrap: {e}")))?;
    let monitor = child.id().filter(|_| narrowed.is_some());
    let mut link = Link::new(ours, Some(child))?.with_group(group);
    if let Some(pid) = monitor {
        link = link.narrowed(pid);
    }
    let (Some(policy), Some((read, write))) = (egress, info) else {
        return Ok(link);
    };
    drop(write);
    let pid = first_pid(read).await?;
    // Off the links' one thread: it enters a namespace and may wait for its loopback.
    let listener = tokio::task::spawn_blocking(move || super::egress::listen_in(pid))
        .await
        .map_err(|e| Error::internal(format!("the sandbox's egress proxy: {e}")))??;
    Ok(link.with_task(super::egress::serve(listener, policy)?))
}

/// The host pid of the sandbox's first process, as bubblewrap writes it (`{"child-pid": N}`).
async fn first_pid(read: std::os::fd::OwnedFd) -> cloud_harness_error::Result<u32> {
    use tokio::io::AsyncReadExt;
    let failed = |why: String| Error::internal(format!("bubblewrap's information: {why}"));
    let mut pipe =
        tokio::net::unix::pipe::Receiver::from_owned_fd(read).map_err(|e| failed(e.to_string()))?;
    let mut text = Vec::new();
    let mut chunk = [0u8; 512];
    let read = async {
        // Its first object is all that is needed (bubblewrap closes the descriptor after it).
        loop {
            let n = pipe.read(&mut chunk).await?;
            text.extend_from_slice(&chunk[..n]);
            if n == 0 || text.contains(&b'}') || text.len() > 4096 {
                return Ok::<_, std::io::Error>(());
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .map_err(|_| failed("none within 10 s".into()))?
        .map_err(|e| failed(e.to_string()))?;
    #[derive(serde::Deserialize)]
    struct Info {
        #[serde(rename = "child-pid")]
        child_pid: u32,
    }
    let end = text
        .iter()
        .position(|&b| b == b'}')
        .map_or(text.len(), |i| i + 1);
    serde_json::from_slice::<Info>(&text[..end])
        .map(|i| i.child_pid)
        .map_err(|e| failed(format!("{e}: {}", String::from_utf8_lossy(&text))))
}

/// Where `bwrap` is: the first program of that name in an absolute folder of this process's
/// `PATH`.
fn bwrap_program() -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("bwrap"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The program that starts bubblewrap (`executor-launch`): this one when it is the
/// `cloud-harness` binary, the same version as the server; else (a test's or a benchmark's
/// binary) the run agent's, which is.
fn launcher_program(agent: &std::path::Path) -> std::path::PathBuf {
    std::env::current_exe()
        .ok()
        .filter(|me| me.file_name().is_some_and(|n| n == "cloud-harness"))
        .unwrap_or_else(|| agent.to_owned())
}

//! The idle sweep: what runs left behind, killed once none is going.

use nix::libc;

/// How often the idle sweep signals again, for processes that forked meanwhile.
const SWEEP_PASSES: usize = 1024;

/// Kills every process of `uid` in this pid namespace but the agent: a child of the agent
/// becomes `uid` (as root) and signals every process it may (`kill(-1)`, which spares itself
/// and the namespace's init, the agent) until none is left. Waited for here, by the reaper,
/// which holds the table: no run starts meanwhile.
pub(super) fn sweep(uid: u32) {
    // Most runs leave nothing: a look costs less than a fork.
    if !any_left(uid) {
        return;
    }
    let root = nix::unistd::getuid().is_root();
    // SAFETY: the child calls only async-signal-safe system calls, then _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe {
            if root && libc::setresuid(uid, uid, uid) != 0 {
                libc::_exit(1);
            }
            for _ in 0..SWEEP_PASSES {
                if libc::kill(-1, libc::SIGKILL) != 0 {
                    libc::_exit(0);
                }
            }
            libc::_exit(0);
        }
    }
    if pid > 0 {
        // Stopped by a process it was to kill (it is their user), it would be waited for
        // forever with the table held: killed instead.
        loop {
            let mut status = 0;
            // SAFETY: waits for the one child just made, and signals only it.
            unsafe {
                if libc::waitpid(pid, &mut status, libc::WUNTRACED) < 0 {
                    return;
                }
                if !libc::WIFSTOPPED(status) {
                    return;
                }
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Whether a live process of `uid` other than the agent is in this pid namespace.
fn any_left(uid: u32) -> bool {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            return false;
        };
        if pid == me || pid == 1 {
            return false;
        }
        // Gone meanwhile: not left.
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return false;
        };
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
        };
        field("State:") != Some("Z") && field("Uid:").and_then(|u| u.parse().ok()) == Some(uid)
    })
}

//! What a run's first process does between the agent's fork and its exec: it is in the
//! child of a multi-threaded process, so only system calls.

use crate::wire::Limits;
use nix::libc;

/// What a run's first process does before it execs: a session (and group) of its own; as
/// root, the run's user with no capability in any set (the bounding set dropped while it
/// still may); the run's rlimits; no new privileges.
pub(super) fn enter(user: Option<(u32, u32)>, limits: Limits) -> std::io::Result<()> {
    use nix::sys::resource::{setrlimit, Resource};
    let check = |r: libc::c_long| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    nix::unistd::setsid()?;
    // SAFETY (each call below): system calls with integer arguments or pointers to locals.
    unsafe {
        for cap in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        if let Some((uid, gid)) = user {
            check(libc::setgroups(0, std::ptr::null()) as libc::c_long)?;
            check(libc::setresgid(gid, gid, gid) as libc::c_long)?;
            check(libc::setresuid(uid, uid, uid) as libc::c_long)?;
        }
        // The inheritable set survives a change of user: empty it (and so the ambient one).
        let mut header = CapHeader {
            version: 0x2008_0522,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        check(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()))?;
    }
    // No higher than the hard limit this process has (raising it takes a capability runs
    // never have): "as many as allowed" is the inherited limit.
    let (_, hard) = nix::sys::resource::getrlimit(Resource::RLIMIT_NPROC)?;
    let processes = limits.processes.min(hard);
    setrlimit(Resource::RLIMIT_NPROC, processes, processes)?;
    if let Some(cpu) = limits.cpu_seconds {
        // SIGXCPU at the limit (so the run's end names it), SIGKILL a second later.
        setrlimit(Resource::RLIMIT_CPU, cpu, cpu.saturating_add(1))?;
    }
    if let Some(memory) = limits.memory {
        setrlimit(Resource::RLIMIT_DATA, memory, memory)?;
    }
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as libc::c_long)?;
    Ok(())
}

/// `capset`'s header and data (version 3: two data words), which libc does not define.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

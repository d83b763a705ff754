//! What a run's first process does between its clone and its exec ([`super::spawn`]): it
//! shares the agent's memory and its calling thread's libc state, so it makes raw system
//! calls only, on what the parent prepared, and reports a failure in `errno`.
//!
//! In order: every signal back to its default and unblocked last (a handler of the agent's
//! must never run here); the standard streams; the working folder; a session (and group) of
//! its own; as root, the run's user with no capability in any set (the bounding set is the
//! agent's, emptied at its start); the run's rlimits; no new privileges; then `execve`.

use crate::wire::Limits;
use nix::libc::{self, c_char, c_int, c_long};
use std::os::fd::RawFd;

/// What the child reads (and, for `errno`, writes) in its parent's memory.
pub(super) struct Entry {
    /// The program, looked up in the run's `PATH` already.
    pub program: *const c_char,
    pub argv: *const *const c_char,
    /// `/bin/sh`, the program, then the run's arguments: what runs a file the kernel does
    /// not know how to run (no `#!`), as `execvp` does.
    pub sh_argv: *const *const c_char,
    pub envp: *const *const c_char,
    pub cwd: *const c_char,
    /// Moved onto 0, 1 and 2.
    pub fds: [RawFd; 3],
    pub user: Option<(u32, u32)>,
    pub limits: Limits,
    /// Why it did not exec (0 until then).
    pub errno: c_int,
}

/// The kernel's `struct sigaction` as x86_64 has it (handler, flags, restorer, mask). Only
/// ever all zeros (SIG_DFL, no flags, an empty mask), so the field order of another
/// architecture cannot matter; the kernel reads no more than its own struct's size.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// `prlimit64`'s limits.
#[repr(C)]
#[derive(Default)]
struct Rlimit {
    current: u64,
    max: u64,
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

/// Sets the calling thread's signal mask with the raw system call (glibc's wrappers keep
/// their own two signals unblocked); the mask it had.
pub(super) fn set_signal_mask(mask: u64) -> u64 {
    let mut old = 0u64;
    // SAFETY: the kernel's mask of this thread, from and into locals (8-byte sets).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &mask as *const u64,
            &mut old as *mut u64,
            8,
        )
    };
    old
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno (the parent thread's, which waits meanwhile).
    unsafe { *libc::__errno_location() }
}

/// A raw system call's result: its value, or the errno it set.
fn check(r: c_long) -> Result<c_long, c_int> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// Runs in the child: never returns (execs or exits 127 with `errno` set).
pub(super) fn run(entry: &mut Entry) -> c_int {
    let why = match prepare(entry) {
        Ok(()) => exec(entry),
        Err(e) => e,
    };
    // SAFETY: a write to the parent's `Entry`, which waits for this child's exit; then the
    // child's own exit (exit_group of its one thread).
    unsafe {
        std::ptr::write_volatile(&mut entry.errno, if why == 0 { libc::EIO } else { why });
        libc::syscall(libc::SYS_exit_group, 127);
    }
    127
}

fn prepare(e: &Entry) -> Result<(), c_int> {
    // SAFETY (each call below): raw system calls with integer arguments, pointers to locals,
    // or pointers the parent prepared and keeps alive until this child execs or exits.
    unsafe {
        let default = KernelSigaction {
            handler: 0, // SIG_DFL
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        for signal in 1..=64 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    &default as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    8,
                );
            }
        }
        for (target, &fd) in e.fds.iter().enumerate() {
            let target = target as c_int;
            if fd == target {
                check(libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFD, 0))?;
            } else {
                check(libc::syscall(libc::SYS_dup3, fd, target, 0))?;
            }
        }
        check(libc::syscall(libc::SYS_chdir, e.cwd))?;
        check(libc::syscall(libc::SYS_setsid))?;
        if let Some((uid, gid)) = e.user {
            check(libc::syscall(
                libc::SYS_setgroups,
                0,
                std::ptr::null::<libc::gid_t>(),
            ))?;
            check(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
            // The saved uid stays root until the exec (which sets it to the effective one):
            // no process of the run's user may trace or open the memory of this child, which
            // is still the agent's, whatever the system's `suid_dumpable`.
            check(libc::syscall(libc::SYS_setresuid, uid, uid, 0))?;
            // The change of user set the memory's dumpable flag to `suid_dumpable`: not
            // dumpable again (the agent sets it again too, once the child has exec'd).
            check(libc::syscall(
                libc::SYS_prctl,
                libc::PR_SET_DUMPABLE,
                0,
                0,
                0,
                0,
            ))?;
        }
        // The inheritable set survives a change of user: empty it (and so the ambient one).
        let mut header = CapHeader {
            version: 0x2008_0522,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        check(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()))?;
        // No higher than the hard limit this process has (raising it takes a capability runs
        // never have): "as many as allowed" is the inherited limit.
        let mut nproc = Rlimit::default();
        check(libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NPROC,
            std::ptr::null::<Rlimit>(),
            &mut nproc as *mut Rlimit,
        ))?;
        let processes = e.limits.processes.min(nproc.max);
        set_limit(libc::RLIMIT_NPROC as c_int, processes, processes)?;
        if let Some(cpu) = e.limits.cpu_seconds {
            // SIGXCPU at the limit (so the run's end names it), SIGKILL a second later.
            set_limit(libc::RLIMIT_CPU as c_int, cpu, cpu.saturating_add(1))?;
        }
        if let Some(memory) = e.limits.memory {
            set_limit(libc::RLIMIT_DATA as c_int, memory, memory)?;
        }
        check(libc::syscall(
            libc::SYS_prctl,
            libc::PR_SET_NO_NEW_PRIVS,
            1,
            0,
            0,
            0,
        ))?;
    }
    set_signal_mask(0);
    Ok(())
}

fn set_limit(resource: c_int, current: u64, max: u64) -> Result<(), c_int> {
    let limit = Rlimit { current, max };
    // SAFETY: prlimit64 of this process, reading a local.
    check(unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            resource,
            &limit as *const Rlimit,
            std::ptr::null_mut::<Rlimit>(),
        )
    })
    .map(|_| ())
}

/// Runs the program; a file without `#!` is run by `/bin/sh`, as `execvp` does. Returns why
/// it did not run.
fn exec(e: &Entry) -> c_int {
    // SAFETY: execve with null-terminated arrays the parent prepared; on success it never
    // returns.
    unsafe {
        libc::syscall(libc::SYS_execve, e.program, e.argv, e.envp);
        if errno() == libc::ENOEXEC {
            libc::syscall(libc::SYS_execve, c"/bin/sh".as_ptr(), e.sh_argv, e.envp);
        }
    }
    errno()
}

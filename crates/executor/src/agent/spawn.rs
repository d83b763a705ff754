//! Starting a run's first process without copying the agent: `clone(CLONE_VM | CLONE_VFORK)`,
//! as `posix_spawn` does. A `fork` copied the agent's page tables (megabytes of relocated
//! data of a large binary) and made every later write of the agent's a copy-on-write fault,
//! at every run; the child here borrows the agent's memory until its `execve`, while the
//! calling thread waits.
//!
//! The child shares the agent's memory, so between clone and exec it only reads what the
//! parent prepared and makes raw system calls ([`super::entry`]): no allocation, no lock, no
//! libc wrapper that keeps state for the whole process (glibc's `setresuid` would change the
//! credentials of the agent's other threads). It does not share the signal handlers, and
//! resets every signal to its default before anything else.

use super::entry::{self, Entry};
use crate::wire::Limits;
use nix::libc;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicI32;

/// The child's stack, above a guard page: ample for a handful of system calls.
const STACK: usize = 64 * 1024;

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// A run's first process, and the agent's ends of its standard streams.
pub(super) struct Spawned {
    pub pid: i32,
    pub stdin: Option<File>,
    pub stdout: File,
    pub stderr: File,
}

/// What a run's first process is: the program, its arguments and environment, where it starts
/// and as whom.
pub(super) struct Plan<'a> {
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: &'a str,
    pub user: Option<(u32, u32)>,
    pub limits: Limits,
    pub stdin: bool,
}

fn c_string(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "an argument, variable or path holds a NUL byte",
        )
    })
}

/// A null-terminated array of pointers into `strings` (which must outlive it).
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// A pipe whose both ends close on exec (the child's end is moved onto 0, 1 or 2).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just made and are owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A stack for the child: an anonymous mapping with its lowest page left inaccessible, so
/// an overflow faults instead of writing into the agent's memory.
struct Stack {
    base: *mut libc::c_void,
    size: usize,
}

impl Stack {
    fn new() -> std::io::Result<Stack> {
        let page = page_size();
        let size = STACK.next_multiple_of(page) + page;
        // SAFETY: a fresh private mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Stack { base, size };
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// Where the child's stack starts (stacks grow down on every target this builds for).
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping, 16-byte aligned as a page boundary is.
        unsafe { self.base.cast::<u8>().add(self.size).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the child no longer runs on it (it exec'd or
        // exited before clone returned).
        unsafe { libc::munmap(self.base, self.size) };
    }
}

/// Blocks every signal of the calling thread while it lives, so that no handler of the
/// agent's runs in the child before the child resets them.
struct Blocked(u64);

impl Blocked {
    fn all() -> Blocked {
        Blocked(entry::set_signal_mask(u64::MAX))
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        entry::set_signal_mask(self.0);
    }
}

extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Entry` of `spawn`, whose frame waits (CLONE_VFORK) until this
    // child has exec'd or exited.
    let entry = unsafe { &mut *arg.cast::<Entry>() };
    entry::run(entry)
}

/// Starts `plan` as a child of this process; the kernel writes its pid into `pid` as it
/// makes it (before it runs). Returns once it runs the program, or with why it could not
/// (nothing of it is left then but a zombie the reaper collects).
pub(super) fn spawn(plan: &Plan, pid: &AtomicI32) -> std::io::Result<Spawned> {
    let program = plan
        .argv
        .first()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "an empty command"))?;
    let program = c_string(&crate::process::absolute(
        program,
        &crate::process::lookup_path(plan.env),
    ))?;
    let argv = plan
        .argv
        .iter()
        .map(|a| c_string(a))
        .collect::<std::io::Result<Vec<_>>>()?;
    let envp = plan
        .env
        .iter()
        .map(|(k, v)| c_string(&format!("{k}={v}")))
        .collect::<std::io::Result<Vec<_>>>()?;
    let cwd = c_string(plan.cwd)?;
    let (argv_ptrs, envp_ptrs) = (pointers(&argv), pointers(&envp));
    // `/bin/sh`, the program, the arguments.
    let mut sh_argv: Vec<*const libc::c_char> = vec![c"/bin/sh".as_ptr(), program.as_ptr()];
    sh_argv.extend_from_slice(&argv_ptrs[1..]);

    let (stdin_read, stdin_write) = if plan.stdin {
        let (r, w) = pipe()?;
        (r, Some(w))
    } else {
        let null = File::open("/dev/null")?;
        (OwnedFd::from(null), None)
    };
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let stack = Stack::new()?;
    let mut entry = Entry {
        program: program.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        sh_argv: sh_argv.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        cwd: cwd.as_ptr(),
        fds: [
            std::os::fd::AsRawFd::as_raw_fd(&stdin_read),
            std::os::fd::AsRawFd::as_raw_fd(&stdout_write),
            std::os::fd::AsRawFd::as_raw_fd(&stderr_write),
        ],
        user: plan.user,
        limits: plan.limits,
        errno: 0,
    };
    let pid = {
        let _blocked = Blocked::all();
        // SAFETY: the child runs `child` on its own stack with this process's memory while
        // this thread is suspended (CLONE_VFORK); it only reads `entry` and makes system
        // calls, then execs or exits. SIGCHLD: the reaper waits for it as for any child.
        // CLONE_PARENT_SETTID: its pid, into `pid`.
        unsafe {
            libc::clone(
                child,
                stack.top(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PARENT_SETTID | libc::SIGCHLD,
                std::ptr::addr_of_mut!(entry).cast::<libc::c_void>(),
                pid.as_ptr(),
            )
        }
    };
    // The child's change of user set the memory's dumpable flag, the agent's until the
    // child's exec, to the system's `suid_dumpable`: the agent's own again.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    drop(stack);
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the child wrote `errno` (if at all) before it exited, and clone returned after.
    let errno = unsafe { std::ptr::read_volatile(&entry.errno) };
    if errno != 0 {
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    Ok(Spawned {
        pid,
        stdin: stdin_write.map(File::from),
        stdout: File::from(stdout_read),
        stderr: File::from(stderr_read),
    })
}

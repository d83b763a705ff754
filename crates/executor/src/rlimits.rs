//! The limits of one run, as rlimits (`[limits]` `run_cpu_seconds`, `run_memory`).

/// What one run's processes may use, as rlimits each process it starts inherits: CPU seconds
/// (RLIMIT_CPU: SIGXCPU, then SIGKILL) and bytes of memory (RLIMIT_DATA: the heap and private
/// writable mappings; an allocation past it fails). Per process, not per run: a run's whole
/// tree is bounded by the executor's own limits (the process count, a container's memory).
/// Set by the run agent on a run's first process (both sandboxes), or by the harness as the
/// command starts (host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub cpu_seconds: u64,
    pub memory: u64,
}

impl RunLimits {
    /// The limits every run gets now (`[limits]`).
    pub fn current() -> RunLimits {
        let limits = cloud_harness_control::limits::quotas().limits;
        RunLimits {
            cpu_seconds: limits.run_cpu_seconds,
            memory: limits.run_memory,
        }
    }

    /// Sets them on the calling process (a child before it execs).
    pub fn apply(&self) -> std::io::Result<()> {
        use nix::sys::resource::{setrlimit, Resource};
        setrlimit(Resource::RLIMIT_CPU, self.cpu_seconds, self.cpu_seconds)?;
        setrlimit(Resource::RLIMIT_DATA, self.memory, self.memory)?;
        Ok(())
    }
}

//! Runs in an executor, on both backends, through its run agent: a run cannot change what
//! later runs see (processes it leaves, the agent's memory, socket and binary), each limit
//! ends a run with a result naming it, concurrent runs share one sandbox, and an agent killed
//! mid-run loses that run only: the next one gets a new agent.
//!
//! Needs root, `/dev/fuse`, and per backend a Docker engine or bubblewrap: without them the
//! tests say so and pass, except when `CI` is set.

use crate::support;

use cloud_harness_executor::Kind;
use serde_json::{json, Value};
use support::executors::{available, harness, Harness};

/// The limits these runs get (`[limits]`, read once per process: each test is one).
fn small_limits() {
    for (name, value) in [
        ("CLOUD_HARNESS_LIMIT_RUN_CPU_SECONDS", "1"),
        ("CLOUD_HARNESS_LIMIT_RUN_OUTPUT", "4096"),
        (
            "CLOUD_HARNESS_LIMIT_RUN_MEMORY",
            &(256u64 << 20).to_string(),
        ),
    ] {
        // SAFETY: set before any thread of this test's reads the environment.
        unsafe { std::env::set_var(name, value) };
    }
}

fn approved(h: &Harness) -> String {
    let result = h.open("runs");
    h.approve(&support::skill_digest(&result, "alpha"));
    result["workspace"].as_str().unwrap().to_owned()
}

fn stdout_json(outcome: &Value) -> Value {
    serde_json::from_str(outcome["stdout"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {outcome}"))
}

fn later_runs_see_nothing_of_earlier_ones(kind: Kind) {
    small_limits();
    // A descriptor of the harness's that is not close-on-exec (as one just received from
    // fusermount is for a moment) never reaches a sandbox.
    let leaked = std::fs::File::open("/proc/self/status").unwrap();
    nix::fcntl::fcntl(
        &leaked,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    let h = harness(kind);
    let ws = approved(&h);
    let fds = h.ran(&ws, "scripts/fds.py");
    // Its standard streams, and the folder it lists.
    assert_eq!(fds["stdout"], "[0, 1, 2, 3]\n", "{fds}");
    drop(leaked);

    // A daemon that left the run's process group is gone once the run is over.
    let left = h.ran(&ws, "scripts/leave.sh");
    assert_eq!(left["stdout"], "left\n", "{left}");
    let procs = h.ran(&ws, "scripts/procs.py");
    assert_eq!(stdout_json(&procs), json!([]), "{procs}");

    // The agent's memory, descriptors, binary and socket are closed to a run; signals to it
    // do nothing; the next run is served by the same agent.
    let first = stdout_json(&h.ran(&ws, "scripts/agent.py"));
    for (what, errno) in [
        ("readMemory", "EACCES"),
        ("listFds", "EACCES"),
        ("readEnviron", "EACCES"),
    ] {
        assert_eq!(first[what], errno, "{what}: {first}");
    }
    // Root's file on a read-only bind: whichever the kernel checks first.
    assert!(
        ["EACCES", "EROFS"].contains(&first["writeBinary"].as_str().unwrap()),
        "{first}"
    );
    let socket = if kind == Kind::Docker {
        "EACCES"
    } else {
        "ENOENT"
    };
    assert_eq!(first["socketDir"], socket, "{first}");
    // As root the agent is another user (EPERM); either way the kernel shields an init.
    assert!(
        ["EPERM", "ok"].contains(&first["kill"].as_str().unwrap()),
        "{first}"
    );
    let second = stdout_json(&h.ran(&ws, "scripts/agent.py"));
    assert_eq!(first["agentStarted"], second["agentStarted"], "{second}");

    // Each limit ends its run with a result naming it.
    let spin = h.ran(&ws, "scripts/spin.sh");
    assert_eq!(spin["limit"], "CPU_LIMIT", "{spin}");
    assert_eq!(spin["signal"], 24, "{spin}");
    let loud = h.ran(&ws, "scripts/loud.sh");
    assert_eq!(loud["limit"], "OUTPUT_LIMIT", "{loud}");
    assert_eq!(loud["stdoutBytes"], 100_000, "{loud}");
    assert_eq!(loud["stdout"].as_str().unwrap().len(), 4096, "{loud}");
    let alloc = h.ran(&ws, "scripts/alloc.py");
    assert_ne!(alloc["exitCode"], 0, "{alloc}");
    assert!(
        alloc["stderr"].as_str().unwrap().contains("MemoryError"),
        "{alloc}"
    );

    // Sixteen runs at once, in the one sandbox.
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..16)
            .map(|_| s.spawn(|| h.ran(&ws, "scripts/hello.sh")))
            .collect();
        for run in runs {
            let out = run.join().unwrap();
            assert_eq!(out["stdout"], "hello from /workspace\n", "{out}");
        }
    });
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

#[test]
fn later_runs_see_nothing_of_earlier_ones_on_bwrap() {
    if available(Kind::Bwrap) {
        later_runs_see_nothing_of_earlier_ones(Kind::Bwrap);
    }
}

#[test]
fn later_runs_see_nothing_of_earlier_ones_on_docker() {
    if available(Kind::Docker) {
        later_runs_see_nothing_of_earlier_ones(Kind::Docker);
    }
}

/// A command starts as a shell would start it: looked up in `PATH`, a file without `#!` run
/// by `/bin/sh`, 126 for a file that may not run, 127 for one that is not there, and no
/// signal blocked or ignored (whatever the agent's own: a pipe's reader that ends early
/// ends its writer quietly).
fn commands_start_as_a_shell_starts_them(kind: Kind) {
    let h = harness(kind);
    let ws = h.open("start")["workspace"].as_str().unwrap().to_owned();
    let (code, out, err) = h.exec(&ws, &["grep", "^Sig[BI]", "/proc/self/status"], b"");
    assert_eq!(
        (code, out.as_str()),
        (0, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"),
        "{err}"
    );
    let (code, out, err) = h.exec(&ws, &["sh", "-c", "yes | head -n 1"], b"");
    assert_eq!((code, out.as_str(), err.as_str()), (0, "y\n", ""));
    let (code, _, err) = h.exec(
        &ws,
        &[
            "sh",
            "-c",
            "printf 'echo from sh: $1\\n' > plain && chmod 755 plain",
        ],
        b"",
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = h.exec(&ws, &["./plain", "an argument"], b"");
    assert_eq!((code, out.as_str()), (0, "from sh: an argument\n"), "{err}");
    let (code, _, err) = h.exec(&ws, &["/etc/passwd"], b"");
    assert_eq!(code, 126, "{err}");
    let (code, _, err) = h.exec(&ws, &["no-such-program"], b"");
    assert_eq!(code, 127, "{err}");
    assert!(err.contains("cannot run no-such-program"), "{err}");
    h.workspaces.close(&ws).unwrap();
}

#[test]
fn commands_start_as_a_shell_starts_them_on_bwrap() {
    if available(Kind::Bwrap) {
        commands_start_as_a_shell_starts_them(Kind::Bwrap);
    }
}

#[test]
fn commands_start_as_a_shell_starts_them_on_docker() {
    if available(Kind::Docker) {
        commands_start_as_a_shell_starts_them(Kind::Docker);
    }
}

/// A run whose output nobody reads holds up no other run of its executor: each run has a
/// socket of its own, so a second run starts, prints and ends while the first one's output
/// fills every buffer between it and the harness.
fn a_run_nobody_reads_holds_up_no_other(kind: Kind) {
    use cloud_harness_executor::{runner, Command, Executor, Places};
    use std::time::Duration;
    let h = harness(kind);
    let ws = h.open("unread")["workspace"].as_str().unwrap().to_owned();
    let (dir, record) = cloud_harness_workspace::Record::find(&h.home(), &ws).unwrap();
    let executor = Executor::attach(record.executor.unwrap(), Places::of(&dir), &ws);
    let command = |argv: &[&str]| Command {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        limits: None,
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let flood = executor.spawn(&command(&["yes"])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let second = tokio::time::timeout(Duration::from_secs(20), async {
            let ok = executor.spawn(&command(&["echo", "ok"])).await.unwrap();
            runner::supervise(
                ok,
                vec!["echo".into()],
                Duration::from_secs(20),
                1 << 20,
                tokio_util::sync::CancellationToken::new(),
                |_, _| {},
            )
            .await
        })
        .await
        .expect("the second run was held up by the first");
        assert_eq!(
            (second.exit_code, second.stdout.as_str()),
            (Some(0), "ok\n")
        );
        drop(flood);
    });
    drop(executor);
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

#[test]
fn a_run_nobody_reads_holds_up_no_other_on_bwrap() {
    if available(Kind::Bwrap) {
        a_run_nobody_reads_holds_up_no_other(Kind::Bwrap);
    }
}

#[test]
fn a_run_nobody_reads_holds_up_no_other_on_docker() {
    if available(Kind::Docker) {
        a_run_nobody_reads_holds_up_no_other(Kind::Docker);
    }
}

/// The host pid of the workspace's run agent.
fn agent_pid(kind: Kind, open: &Value) -> i32 {
    if kind == Kind::Docker {
        let id = open["executor"]["id"].as_str().unwrap();
        let out = std::process::Command::new("docker")
            .args(["inspect", "-f", "{{.State.Pid}}", id])
            .output()
            .unwrap();
        return String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    }
    // bubblewrap's child of this process, the agent, is the only `executor-agent` whose
    // parent's parent is this test.
    let me = std::process::id() as i32;
    let parent = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|&pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains("executor-agent")
                && parent(pid).and_then(parent) == Some(me)
        })
        .expect("the agent's process")
}

/// The agent's allocator takes no huge page (2 MiB resident for each of its threads, in
/// every workspace's executor), and a run's environment has none of the agent's settings.
fn the_agent_holds_no_huge_page(kind: Kind) {
    small_limits();
    let h = harness(kind);
    let open = h.open("small");
    h.approve(&support::skill_digest(&open, "alpha"));
    let ws = open["workspace"].as_str().unwrap().to_owned();
    let hello = h.ran(&ws, "scripts/hello.sh");
    assert_eq!(hello["stdout"], "hello from /workspace\n", "{hello}");
    let pid = agent_pid(kind, &open);
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let huge = rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .map(|v| v.trim().trim_end_matches(" kB").trim().to_owned());
    assert_eq!(huge.as_deref(), Some("0"), "{rollup}");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        String::from_utf8_lossy(&environ).contains("MIMALLOC_ARENA_EAGER_COMMIT=0"),
        "the agent runs without its setting"
    );
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

#[test]
fn the_agent_holds_no_huge_page_on_bwrap() {
    if available(Kind::Bwrap) {
        the_agent_holds_no_huge_page(Kind::Bwrap);
    }
}

#[test]
fn the_agent_holds_no_huge_page_on_docker() {
    if available(Kind::Docker) {
        the_agent_holds_no_huge_page(Kind::Docker);
    }
}

/// The executor as a whole holds `[limits] run_memory` and 1,024 processes: a container's
/// limits in Docker, a cgroup of the sandbox's own in bubblewrap (where its agent is), gone
/// with the workspace. A run whose processes together pass the memory ends as MEMORY_LIMIT.
fn the_executor_is_bounded_as_a_whole(kind: Kind) {
    small_limits();
    let h = harness(kind);
    let open = h.open("whole");
    h.approve(&support::skill_digest(&open, "alpha"));
    let ws = open["workspace"].as_str().unwrap().to_owned();
    h.ran(&ws, "scripts/hello.sh");
    let group = memory_group(agent_pid(kind, &open));
    let limit = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .find_map(|f| std::fs::read_to_string(group.join(f)).ok())
        .expect("the executor's memory limit");
    assert_eq!(
        limit.trim(),
        (256u64 << 20).to_string(),
        "{}",
        group.display()
    );
    let crowd = h.ran(&ws, "scripts/crowd.sh");
    assert_eq!(crowd["limit"], "MEMORY_LIMIT", "{crowd}");
    // The executor survives it: the next run is served.
    let next = h.ran(&ws, "scripts/hello.sh");
    assert_eq!(next["stdout"], "hello from /workspace\n", "{next}");
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
    if kind == Kind::Bwrap {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while group.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} is left",
                group.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// A run cannot have more processes than its executor's 1,024 (a container's pids limit, a
/// sandbox's cgroup): the next `fork` fails with EAGAIN, and the executor serves the next run.
fn a_run_cannot_fork_past_the_executor_s_processes(kind: Kind) {
    let h = harness(kind);
    let ws = approved(&h);
    let forks = stdout_json(&h.ran(&ws, "scripts/forks.py"));
    assert_eq!(forks["error"], "EAGAIN", "{forks}");
    let spawned = forks["spawned"].as_u64().unwrap();
    assert!((900..1024).contains(&spawned), "{forks}");
    let next = h.ran(&ws, "scripts/hello.sh");
    assert_eq!(next["stdout"], "hello from /workspace\n", "{next}");
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

#[test]
fn a_run_cannot_fork_past_the_executor_s_processes_on_bwrap() {
    if available(Kind::Bwrap) {
        a_run_cannot_fork_past_the_executor_s_processes(Kind::Bwrap);
    }
}

#[test]
fn a_run_cannot_fork_past_the_executor_s_processes_on_docker() {
    if available(Kind::Docker) {
        a_run_cannot_fork_past_the_executor_s_processes(Kind::Docker);
    }
}

/// The folder of the memory cgroup of `pid` (cgroup v1's memory hierarchy, or v2).
fn memory_group(pid: i32) -> std::path::PathBuf {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let (v1, path) = cgroups
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let v1 = controllers.split(',').any(|c| c == "memory");
            (v1 || controllers.is_empty()).then(|| (v1, path.to_owned()))
        })
        .unwrap();
    let base = if v1 {
        "/sys/fs/cgroup/memory"
    } else {
        "/sys/fs/cgroup"
    };
    std::path::Path::new(base).join(path.trim_start_matches('/'))
}

#[test]
fn the_executor_is_bounded_as_a_whole_on_bwrap() {
    if available(Kind::Bwrap) {
        the_executor_is_bounded_as_a_whole(Kind::Bwrap);
    }
}

#[test]
fn the_executor_is_bounded_as_a_whole_on_docker() {
    if available(Kind::Docker) {
        the_executor_is_bounded_as_a_whole(Kind::Docker);
    }
}

/// Without a cgroup (none to be had, or `off`), bubblewrap runs are refused, saying what to
/// do; an operator who allows it gets runs with their rlimits only, and a note.
fn without_a_cgroup(allow: bool) {
    for (name, value) in [
        ("CLOUD_HARNESS_EXECUTOR_CGROUP", "off"),
        (
            "CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP",
            if allow { "allow" } else { "refuse" },
        ),
    ] {
        // SAFETY: set before any thread of this test's reads the environment.
        unsafe { std::env::set_var(name, value) };
    }
    let h = harness(Kind::Bwrap);
    let ws = approved(&h);
    let status = h.workspaces.executor_limits().unwrap();
    match allow {
        true => {
            assert!(status.contains("rlimits only"), "{status}");
            let out = h.ran(&ws, "scripts/hello.sh");
            assert_eq!(out["stdout"], "hello from /workspace\n", "{out}");
        }
        false => {
            assert!(status.contains("refused"), "{status}");
            let e = h.run(&ws, "scripts/hello.sh").unwrap_err();
            assert_eq!(e.code, cloud_harness_error::Code::Forbidden, "{e}");
            assert!(e.message.contains("WITHOUT_CGROUP=allow"), "{e}");
        }
    }
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

#[test]
fn bwrap_runs_without_a_cgroup_are_refused() {
    if available(Kind::Bwrap) {
        without_a_cgroup(false);
    }
}

#[test]
fn bwrap_runs_without_a_cgroup_run_when_allowed() {
    if available(Kind::Bwrap) {
        without_a_cgroup(true);
    }
}

fn an_agent_killed_mid_run_loses_that_run_only(kind: Kind) {
    let h = harness(kind);
    let open = h.open("killed");
    h.approve(&support::skill_digest(&open, "alpha"));
    let ws = open["workspace"].as_str().unwrap().to_owned();
    // The first run makes the agent (bubblewrap builds its sandbox then).
    h.ran(&ws, "scripts/hello.sh");
    let pid = agent_pid(kind, &open);
    let lost = std::thread::scope(|s| {
        let long = s.spawn(|| h.ran(&ws, "scripts/long.sh"));
        std::thread::sleep(std::time::Duration::from_millis(500));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        long.join().unwrap()
    });
    assert_eq!(lost["executorLost"], true, "{lost}");
    assert!(lost["millis"].as_u64().unwrap() < 30_000, "{lost}");
    // The next run starts a new agent (Docker: the container again) and runs.
    let next = h.ran(&ws, "scripts/hello.sh");
    assert_eq!(next["stdout"], "hello from /workspace\n", "{next}");
    assert_ne!(agent_pid(kind, &open), pid);
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

#[test]
fn an_agent_killed_mid_run_loses_that_run_only_on_bwrap() {
    if available(Kind::Bwrap) {
        an_agent_killed_mid_run_loses_that_run_only(Kind::Bwrap);
    }
}

#[test]
fn an_agent_killed_mid_run_loses_that_run_only_on_docker() {
    if available(Kind::Docker) {
        an_agent_killed_mid_run_loses_that_run_only(Kind::Docker);
    }
}

/// A harness restart with an open workspace: the new server runs in the same executor
/// (Docker: the container's agent is found again at its socket; bubblewrap: a new sandbox).
fn a_restarted_harness_runs_in_the_open_executor(kind: Kind) {
    let h = harness(kind);
    let open = h.open("restart");
    h.approve(&support::skill_digest(&open, "alpha"));
    let ws = open["workspace"].as_str().unwrap().to_owned();
    h.ran(&ws, "scripts/hello.sh");
    let before = (kind == Kind::Docker).then(|| agent_pid(kind, &open));
    h.workspaces.shutdown();
    let store = cloud_harness_store::cas::Store::open(h.tmp.path().join("store")).unwrap();
    let again = cloud_harness_workspace::Workspaces::with_executors(
        h.home(),
        support::warm_provisioner(&store),
        true,
        cloud_harness_executor::Settings::with_kind(kind),
    )
    .unwrap();
    let restored = again.get(&ws).expect("restored");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let out = runtime
        .block_on(restored.clone().run(
            &h.home(),
            "test",
            cloud_harness_workspace::RunRequest {
                skill: "alpha".into(),
                script: "scripts/hello.sh".into(),
                args: vec![],
                timeout: std::time::Duration::from_secs(60),
            },
            tokio_util::sync::CancellationToken::new(),
            |_, _| {},
        ))
        .unwrap();
    assert_eq!(out["stdout"], "hello from /workspace\n", "{out}");
    if let Some(before) = before {
        assert_eq!(agent_pid(kind, &open), before, "a new container's agent");
    }
    drop(restored);
    again.close(&ws).unwrap();
    h.assert_nothing_left();
}

#[test]
fn a_restarted_harness_runs_in_the_open_executor_on_bwrap() {
    if available(Kind::Bwrap) {
        a_restarted_harness_runs_in_the_open_executor(Kind::Bwrap);
    }
}

#[test]
fn a_restarted_harness_runs_in_the_open_executor_on_docker() {
    if available(Kind::Docker) {
        a_restarted_harness_runs_in_the_open_executor(Kind::Docker);
    }
}

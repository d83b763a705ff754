//! A service the harness depends on restarted under it: the Docker engine, with a Docker
//! executor open. The executor's container stops with the engine; the next run starts it
//! again and runs, with the skills mounted inside, and the server needs no restart.
//! (PostgreSQL and object storage going away are tested in `fleet_state` and `fleet`.)

use super::site::{api, open, session, tool, Random, Site};
use super::toolkits::{close, workspace_of, Toolkits};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

/// `skills_run` of skill-0's script, approved first if the server asks.
fn run(running: &crate::support::http::Running, workspace: &str) -> Value {
    let s = session(running).unwrap();
    let args = json!({"workspace": workspace, "skill": "skill-0", "script": "scripts/hello.sh"});
    let first = tool(running, &s, "skills_run", args.clone()).unwrap();
    let Some(digest) = first["structuredContent"]["details"]["digest"].as_str() else {
        return first;
    };
    let approval = json!({"digest": digest, "skill": "skill-0", "reason": "the test's own script"});
    let (status, body) = api(running, "POST", "/api/v1/approvals", Some(approval)).unwrap();
    assert!((200..300).contains(&status), "{status} {body}");
    tool(running, &s, "skills_run", args).unwrap()
}

fn ran(result: &Value) -> bool {
    result["isError"] != json!(true) && result.to_string().contains("hello from the executor")
}

/// The engine's process, and how it was started.
fn dockerd() -> Option<(i32, Vec<String>)> {
    let out = Command::new("pidof").arg("dockerd").output().ok()?;
    let pid: i32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some((pid, argv))
}

fn engine_answers() -> bool {
    Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Stops the engine (SIGTERM, as a package upgrade does) and starts it again as it was.
fn restart_dockerd(pid: i32, argv: &[String]) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "dockerd did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open("/var/log/cloud-harness-dockerd.log")
        .unwrap();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    // Its own session, as `.ci/setup` starts it: it must outlive this test.
    unsafe {
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid is async-signal-safe.
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    // Not waited for: the engine outlives the test (init reaps it in the end).
    #[allow(clippy::zombie_processes)]
    cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !engine_answers() {
        assert!(Instant::now() < deadline, "dockerd did not come back");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_docker_engine_restarted_under_an_open_executor_is_recovered_without_a_restart() {
    // It restarts the machine's engine: under CI, or when a developer asks for it.
    if std::env::var_os("CI").is_none()
        && std::env::var_os("CLOUD_HARNESS_TEST_RESTART_DOCKER").is_none()
    {
        eprintln!("skipped: restarts the Docker engine (set CLOUD_HARNESS_TEST_RESTART_DOCKER=1)");
        return;
    }
    let (pid, argv) = dockerd().expect("a dockerd process (run .ci/setup)");
    let kits = Toolkits::new();
    let mut env = kits.env("docker");
    env.push(("CLOUD_HARNESS_EXECUTOR_SPARES", "0".into()));
    let mut site = Site::new(&env, Random::unprinted());
    let running = site.serve();
    let ws = workspace_of(
        &open(
            &running,
            &json!({"idempotencyKey": "engine", "toolkits": [kits.commit(0)]}),
        )
        .unwrap(),
    );
    let before = run(&running, &ws);
    assert!(ran(&before), "{before}");

    restart_dockerd(pid, &argv);

    // The same server, not restarted: the run starts the stopped container again.
    let after = run(&running, &ws);
    assert!(
        ran(&after),
        "after the engine's restart: {after} {}",
        running.log.lock().unwrap()
    );
    let s = session(&running).unwrap();
    let read = tool(
        &running,
        &s,
        "skills_read",
        json!({"workspace": ws, "skill": "skill-1"}),
    )
    .unwrap();
    assert_ne!(read["isError"], json!(true), "{read}");
    let (status, ready) = api(&running, "GET", "/readyz", None).unwrap();
    assert_eq!(status, 200, "{ready}");
    // Closed, not left open: a stopped server keeps its workspaces (and their containers).
    close(&running, &ws);
    site.stop(running);
}

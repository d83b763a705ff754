//! Operating the harness: the configuration file (`--config`, `config check`), `/metrics`
//! moving with the work, `/healthz` and `/readyz` (not ready once a workspace's mount is
//! gone), `--version`, and SIGTERM during a slow run and a slow acquisition.

use crate::support;

use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};
use support::api::{mcp_session, tool, world_of, BIN};
use support::http::{server_in, server_mounting};

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("CLOUD_HARNESS_CONFIG")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    support::code_and_output(out)
}

/// The line of `config check`'s output for `key`.
fn line_of<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no {key} in {out}"))
}

#[test]
fn the_config_file_is_checked_by_key_and_line_and_the_environment_beats_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("config.toml");
    let home = tmp.path().join("home-from-file");
    std::fs::write(
        &file,
        format!(
            "# a comment\nhome = {:?}\n\n[git]\nallowed_hosts = [\"git.example\", \"*.corp.example\"]\nhead_ttl = 30\n\n[http]\nmax_connections = 64\n",
            home.display()
        ),
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let (code, out) = run(
        &["config", "check", path],
        &[("CLOUD_HARNESS_HTTP_MAX_CONNECTIONS", "128")],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        line_of(&out, "home").ends_with(&format!("# {path}:2")),
        "{out}"
    );
    assert!(
        line_of(&out, "git.allowed_hosts").contains("= git.example,*.corp.example  #"),
        "{out}"
    );
    // The environment beats the file; what neither sets is the default.
    assert!(
        line_of(&out, "http.max_connections")
            .contains("= 128  # environment CLOUD_HARNESS_HTTP_MAX_CONNECTIONS"),
        "{out}"
    );
    assert!(
        line_of(&out, "executor.kind").ends_with("# default"),
        "{out}"
    );

    // An unknown key and a bad value are errors naming the key and its line.
    let bad = [
        ("[http]\nmax_conections = 5\n", "http.max_conections", 2),
        ("[git]\nhead_ttl = \"soon\"\n", "git.head_ttl", 2),
        ("\n\n[executor]\nkind = \"vm\"\n", "executor.kind", 4),
        ("ALLOWED_GIT_HOSTS = \"x\"\n", "ALLOWED_GIT_HOSTS", 1),
        ("[git]\nallowed_hosts = \"a,b\"\n", "git.allowed_hosts", 2),
    ];
    for (text, key, line) in bad {
        std::fs::write(&file, text).unwrap();
        let (code, out) = run(&["config", "check", path], &[]);
        assert_eq!(code, 1, "{text}: {out}");
        // Named with --config, it is what `config check` reports on.
        let (again, said) = run(&["--config", path, "config", "check"], &[]);
        assert_eq!((again, &said), (1, &out), "{text}");
        assert!(out.contains(&format!("{path}:{line}: ")), "{text}: {out}");
        assert!(out.contains(&format!("`{key}`")), "{text}: {out}");
        assert!(
            out.contains(&format!("\"field\":\"{key}\"")),
            "{text}: {out}"
        );
        // A server given the file refuses to start, and says the same.
        let (code, out) = run(&["serve", "--config", path, "--no-mount"], &[]);
        assert_eq!(code, 2, "{text}: {out}");
        assert!(out.contains(&format!("{path}:{line}: ")), "{text}: {out}");
    }
    // A file that is not TOML is refused with its line.
    std::fs::write(&file, "home = \"/x\"\n[git\n").unwrap();
    let (code, out) = run(&["config", "check", path], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{path}:2: not TOML")), "{out}");
    // A bad value from the environment is named too.
    std::fs::write(&file, "").unwrap();
    let (code, out) = run(
        &["config", "check", path],
        &[("CLOUD_HARNESS_HEAD_TTL", "soon")],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("CLOUD_HARNESS_HEAD_TTL=\"soon\""), "{out}");

    // The file's values take effect: a server started with it keeps its state where it says.
    std::fs::write(&file, format!("home = {:?}\n", home.display())).unwrap();
    let server = server_in(
        tempfile::tempdir().unwrap(),
        &["--config", path],
        &[("CLOUD_HARNESS_HOME", "")],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !home.join("state.db").exists() {
        assert!(Instant::now() < deadline, "no state.db in the file's home");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(server);
}

#[test]
fn version_names_the_commit() {
    let (code, out) = run(&["--version"], &[]);
    assert_eq!(code, 0);
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        out.trim(),
        format!(
            "cloud-harness {} (commit {commit})",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// The samples of a Prometheus text answer: `name{labels}` to value.
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

/// The value of the series `name` whose labels include all of `labels` (0 when absent).
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text)
        .iter()
        .filter(|(s, _)| {
            let (n, rest) = s.split_once('{').unwrap_or((s, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| v)
        .sum()
}

/// A one-skill toolkit, warm in `tmp`'s store; its spec.
fn warm_kit(tmp: &tempfile::TempDir) -> Value {
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/kit");
    support::materialize(
        &src,
        &support::dir(vec![("lint", support::skill("lint", "Lint it."))]),
    );
    serde_json::to_value(support::warm_toolkit(&store, &src, "kit")).unwrap()
}

#[test]
fn metrics_move_with_the_work() {
    let tmp = tempfile::tempdir().unwrap();
    let warm = warm_kit(&tmp);
    let hosts = format!("{},localhost:1", support::WARM_HOST);
    let w = world_of(server_in(
        tmp,
        &["--log-format", "json"],
        &[
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", hosts.as_str()),
            ("RUST_LOG", "warn,cloud_harness=info"),
        ],
    ));
    // Operators only.
    let anonymous = w.http.get(w.url("/metrics")).send().unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let before = w.metrics();
    assert!(
        before.contains("# TYPE cloud_harness_warm_starts counter"),
        "{before}"
    );
    assert_eq!(value(&before, "cloud_harness_open_workspaces", &[]), 0.0);

    let session = w.session();
    let call = |name: &str, args: Value| w.tool(&session, name, args);
    let opened = call(
        "workspace_open",
        json!({"idempotencyKey": "m", "toolkits": [warm]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let missing = call(
        "skills_list",
        json!({"workspace": "ws_00000000000000000000000000000000"}),
    );
    assert_eq!(
        missing["structuredContent"]["code"], "NOT_FOUND",
        "{missing}"
    );
    // An allowed host whose address is loopback: the egress proxy refuses to dial it.
    let refused = call(
        "workspace_open",
        json!({"idempotencyKey": "r", "toolkits": [{"kind": "git", "instanceId": "x", "url": "https://localhost:1/x.git"}]}),
    );
    assert_eq!(refused["isError"], true, "{refused}");

    let after = w.metrics();
    let moved = |name: &str, labels: &[(&str, &str)]| {
        value(&after, name, labels) - value(&before, name, labels)
    };
    assert_eq!(
        moved(
            "cloud_harness_acquisitions_total",
            &[("mode", "warm"), ("result", "ok")]
        ),
        1.0,
        "{after}"
    );
    assert_eq!(moved("cloud_harness_warm_starts_total", &[]), 1.0);
    assert_eq!(
        moved("cloud_harness_acquisitions_total", &[("mode", "failed")]),
        1.0,
        "{after}"
    );
    assert_eq!(
        moved(
            "cloud_harness_egress_decisions_total",
            &[("verdict", "refuse")]
        ),
        1.0,
        "{after}"
    );
    assert_eq!(
        moved(
            "cloud_harness_mcp_calls_total",
            &[("tool", "workspace_open"), ("code", "OK")]
        ),
        1.0
    );
    assert_eq!(
        moved(
            "cloud_harness_mcp_calls_total",
            &[("tool", "skills_list"), ("code", "NOT_FOUND")]
        ),
        1.0
    );
    assert_eq!(
        moved(
            "cloud_harness_mcp_call_seconds_count",
            &[("tool", "workspace_open")]
        ),
        2.0
    );
    assert_eq!(value(&after, "cloud_harness_open_workspaces", &[]), 1.0);
    assert!(value(&after, "cloud_harness_skill_cache_misses_total", &[]) >= 1.0);

    // The JSON log: the warm open's acquisition carries the request id of its MCP call.
    let log = w.server.log.lock().unwrap().clone();
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let acquired = lines
        .iter()
        .find(|l| l["fields"]["message"] == "acquired")
        .unwrap_or_else(|| panic!("no acquisition logged: {log}"));
    // Its target names the crate that logged it (a `cloud_harness` filter covers every crate).
    assert_eq!(
        acquired["target"], "cloud_harness_provision::acquisitions",
        "{acquired}"
    );
    let id = acquired["span"]["request_id"].as_str().unwrap();
    assert!(id.starts_with("req_"), "{acquired}");
    let call = lines
        .iter()
        .find(|l| l["fields"]["message"] == "tool call" && l["span"]["request_id"] == id)
        .unwrap_or_else(|| panic!("no tool call with {id}: {log}"));
    assert_eq!(call["span"]["tool"], "workspace_open");
    assert_eq!(call["fields"]["code"], "OK");
}

#[test]
fn readyz_turns_not_ready_when_a_workspace_mount_is_gone() {
    if !support::wait::mounting_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let warm = warm_kit(&tmp);
    let w = world_of(server_mounting(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
        ],
    ));
    let probe = |path: &str| {
        let r = w.http.get(w.url(path)).send().unwrap();
        let status = r.status().as_u16();
        (status, r.text().unwrap())
    };
    // Readiness is assessed in the background: what a probe sees follows within a round.
    let settled = |want: u16| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let (status, body) = probe("/readyz");
            if status == want {
                return body;
            }
            assert!(std::time::Instant::now() < deadline, "{status}: {body}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    assert_eq!(probe("/healthz").0, 200);
    settled(200);
    let session = w.session();
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "ready", "toolkits": [warm]}),
    );
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    std::thread::sleep(cloud_harness_http::health::READY_EVERY * 2);
    let body = settled(200);
    assert!(!body.contains(&ws), "{body}");
    // Its skills mount goes away under the server.
    let mount = w.home().join("workspaces").join(&ws).join("mounts/skills");
    let out = Command::new("umount")
        .arg("-l")
        .arg(&mount)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not ready, saying which kind of check failed and naming no workspace nor path (the log
    // names them).
    let body = settled(503);
    let v: Value = serde_json::from_str(&body).unwrap();
    let failed: Vec<&Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{body}");
    assert_eq!(failed[0]["check"], "workspace mounts");
    assert_eq!(failed[0]["error"], "a workspace's mount does not answer");
    assert!(!body.contains(&ws) && !body.contains('/'), "{body}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !w
        .server
        .log
        .lock()
        .unwrap()
        .contains(&format!("workspace {ws} mounts"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the log does not name the workspace"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(probe("/healthz").0, 200);
    // Closing still works with a mount gone, and takes the other down: it stopped at the
    // missing one (INTERNAL, "Invalid argument"), and the owner-skills mount outlived the
    // killed server, dead, after every run of this test.
    let closed = w.tool(&session, "workspace_close", json!({ "workspace": ws }));
    assert_eq!(closed["isError"], false, "{closed}");
    let owner = w
        .home()
        .join("workspaces")
        .join(&ws)
        .join("mounts/owner-skills");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounted.contains(owner.to_str().unwrap()), "{mounted}");
}

#[test]
fn workspaces_opened_and_closed_leave_the_server_no_process_but_its_unmount_guard() {
    if !support::wait::mounting_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let warm = warm_kit(&tmp);
    let w = world_of(server_mounting(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
        ],
    ));
    let session = w.session();
    for i in 0..3 {
        let opened = w.tool(
            &session,
            "workspace_open",
            json!({"idempotencyKey": format!("round-{i}"), "toolkits": [warm]}),
        );
        assert_eq!(opened["isError"], false, "{opened}");
        let ws = opened["structuredContent"]["workspace"].as_str().unwrap();
        let mount = w.home().join("workspaces").join(ws).join("mounts/skills");
        assert!(mount.join(".").read_dir().unwrap().count() > 0);
        let closed = w.tool(&session, "workspace_close", json!({ "workspace": ws }));
        assert_eq!(closed["isError"], false, "{closed}");
    }
    // Each mount's prewarm walker ends on its own; nothing else a mount made may stay (a
    // fusermount3 per mount, never reaped, once did: a zombie for every mount ever made).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left: Vec<_> = support::procs::children_of(w.server.child.id())
            .into_iter()
            .filter(|(_, name, _)| name != "cloud-harness")
            .collect();
        let guards = support::procs::children_of(w.server.child.id()).len() - left.len();
        if left.is_empty() && guards == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {left:?}; {guards} unmount guard(s)"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn sigterm_during_a_slow_run_and_a_slow_acquisition_exits_0_in_bounded_time_leaving_no_mount() {
    if !support::executors::available(cloud_harness_executor::Kind::Bwrap) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_str().unwrap().to_owned();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/slow");
    support::materialize(
        &src,
        &support::dir(vec![(
            "slow",
            support::dir(vec![
                (
                    "SKILL.md",
                    support::file("---\nname: slow\ndescription: Takes its time.\n---\n"),
                ),
                (
                    "scripts",
                    support::dir(vec![(
                        "wait.sh",
                        support::Node::Exec(b"#!/bin/sh\nsleep 120\n".to_vec()),
                    )]),
                ),
            ]),
        )]),
    );
    let warm = serde_json::to_value(support::warm_toolkit(&store, &src, "slow")).unwrap();
    let certs = support::Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let repo = support::Repo::create(&repos, "team/kit.git", false);
    let commit = repo.commit(support::dir(vec![(
        "lint",
        support::skill("lint", "Lint it."),
    )]));
    // Each answer of the git server waits 60 s: the acquisition is in flight at the SIGTERM.
    let git = support::GitServer::start_with(&repos, &certs, "127.0.0.1", 60.0);
    let (ca, hosts) = (
        certs.ca.display().to_string(),
        format!("{},{}", git.host(), support::WARM_HOST),
    );
    // The service manager's socket, as systemd gives a Type=notify unit.
    let notify_path = tmp.path().join("notify.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let notify_socket = notify_path.to_str().unwrap().to_owned();
    let said = move || {
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mut w = world_of(server_mounting(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", hosts.as_str()),
            ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
            ("NOTIFY_SOCKET", notify_socket.as_str()),
        ],
    ));
    assert_eq!(said(), "READY=1");
    let (addr, token) = (w.server.addr, w.operator.clone());
    let session = mcp_session(addr, &token);
    let opened = tool(
        addr,
        &token,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "slow", "toolkits": [warm]}),
    );
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let digest = support::skill_digest(&opened["structuredContent"], "slow");
    w.op("POST", "/api/v1/approvals", Some(json!({"digest": digest})));
    let (t1, s1) = (token.clone(), session.clone());
    let run = std::thread::spawn(move || {
        std::panic::catch_unwind(|| {
            tool(
                addr,
                &t1,
                &s1,
                "skills_run",
                json!({"workspace": ws, "skill": "slow", "script": "scripts/wait.sh"}),
            )
        })
    });
    let url = git.url("team/kit.git");
    let fetch = std::thread::spawn(move || {
        std::panic::catch_unwind(|| {
            tool(
                addr,
                &token,
                &session,
                "workspace_open",
                json!({"idempotencyKey": "fetching", "toolkits": [{"kind": "git", "instanceId": "kit", "url": url, "ref": commit}]}),
            )
        })
    });
    // Both are under way: the script's sandbox runs, the git server has been asked.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(processes_under(&root) && git.requests() > 0) {
        assert!(
            Instant::now() < deadline,
            "the run and the fetch never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let asked = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(w.server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = loop {
        if let Some(s) = w.server.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "serve did not exit within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = asked.elapsed();
    assert!(status.success(), "serve exited with {status}");
    assert_eq!(said(), "STOPPING=1");
    // The drain (10 s) and the cleanup after it.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&root), "a mount is left: {mounts}");
    assert!(
        !processes_under(&root),
        "a process of the workspace is left"
    );
    let _ = (run.join(), fetch.join());
}

/// Whether a process other than this test's names `root` on its command line (a sandbox of
/// a workspace under it).
fn processes_under(root: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            return false;
        };
        let text = String::from_utf8_lossy(&cmdline);
        text.contains(root) && text.contains("bwrap")
    })
}

/// A server whose bubblewrap executors can have no cgroup says so at start in its log and in
/// `/readyz`, in a note (it still serves skills): that their runs are refused, or once the
/// operator allows it, that they keep their rlimits only.
#[test]
fn readyz_says_when_bubblewrap_executors_have_no_cgroup() {
    if !support::executor_backend("bwrap") {
        assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
        return;
    }
    for allow in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let w = world_of(server_in(
            tmp,
            &[],
            &[
                ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
                ("CLOUD_HARNESS_EXECUTOR_CGROUP", "off"),
                (
                    "CLOUD_HARNESS_EXECUTOR_WITHOUT_CGROUP",
                    if allow { "allow" } else { "refuse" },
                ),
                ("CLOUD_HARNESS_CONTAINERS", "off"),
            ],
        ));
        let deadline = Instant::now() + Duration::from_secs(15);
        let body = loop {
            let r = w.http.get(w.url("/readyz")).send().unwrap();
            let status = r.status().as_u16();
            let body = r.text().unwrap();
            if status == 200 {
                break body;
            }
            assert!(Instant::now() < deadline, "{status}: {body}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let v: Value = serde_json::from_str(&body).unwrap();
        let check = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "executor limits")
            .unwrap_or_else(|| panic!("{body}"));
        assert_eq!(check["ok"], true, "{body}");
        let note = check["note"].as_str().unwrap();
        assert!(note.contains("no cgroup"), "{body}");
        assert!(
            note.contains(if allow { "rlimits only" } else { "refused" }),
            "{body}"
        );
        assert!(!body.contains('/'), "{body}");
        // Said once in the log (which the server writes as it goes).
        let deadline = Instant::now() + Duration::from_secs(10);
        let said = || {
            let log = w.server.log.lock().unwrap().clone();
            (log.matches("executors have no cgroup").count(), log)
        };
        while said().0 == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(cloud_harness_http::health::READY_EVERY);
        let (count, log) = said();
        assert_eq!(count, 1, "{log}");
    }
}

//! The MCP server driven by the official Python MCP SDK (`tests/mcp/scenario.py`), over stdio
//! and Streamable HTTP, with both protocol eras. Needs python3 with `mcp` (see
//! `tests/mcp/requirements.txt`; `.ci/setup` installs it): skipped where it is missing,
//! except under CI.

use crate::support;

use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use support::{dir, file, skill, Certs, GitServer, Node, Repo};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

fn python() -> Option<String> {
    let python = std::env::var("CLOUD_HARNESS_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import mcp, mcp.client.stdio; from mcp import Client"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must run the MCP tests: install tests/mcp/requirements.txt"
    );
    eprintln!("skipped: python3 with the `mcp` package is needed (pip install -r tests/mcp/requirements.txt)");
    None
}

struct World {
    executor: &'static str,
    tmp: tempfile::TempDir,
    _certs: Certs,
    _server: GitServer,
    env: Vec<(String, String)>,
    fixtures: serde_json::Value,
}

fn skill_with(name: &str, body: &str, extra: Vec<(&str, Node)>) -> Node {
    match skill(name, body) {
        Node::Dir(mut entries) => {
            entries.extend(extra.into_iter().map(|(n, e)| (n.as_bytes().to_vec(), e)));
            Node::Dir(entries)
        }
        other => other,
    }
}

/// Whether this machine has the executor backend `kind`; under CI it must.
fn has_executor(kind: &str) -> bool {
    let ok = support::executor_backend(kind);
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "CI must run the MCP tests on the {kind} executor (.ci/setup installs it)"
    );
    if !ok {
        eprintln!("skipped: the {kind} executor is not available here");
    }
    ok
}

fn world(executor: &'static str) -> World {
    world_slow(executor, 0.0)
}

/// [`world`] with a git server that waits `slow` seconds before answering each fetch.
fn world_slow(executor: &'static str, slow: f64) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let server = GitServer::start_with(&repos, &certs, "127.0.0.1", slow);

    let superpowers = Repo::create(&repos, "obra/superpowers.git", false);
    let superpowers_commit = superpowers.commit(dir(vec![(
        "skills",
        dir(vec![
            ("using-superpowers", skill("using-superpowers", "Before any task, use the Skill tool to load the relevant skill. Track steps with TodoWrite.")),
            (
                "brainstorm",
                dir(vec![("SKILL.md", file("---\nname: brainstorm\ndescription: Brainstorm with the user.\ndisable-model-invocation: true\n---\nAsk questions.\n"))]),
            ),
        ]),
    )]));
    let team = Repo::create(&repos, "team/skills.git", false);
    let team_commit = team.commit(dir(vec![(
        "skills",
        dir(vec![
            (
                "review",
                skill_with(
                    "review",
                    "Review code carefully.",
                    vec![
                        ("references", dir(vec![("big.md", Node::File(vec![b'r'; 300_000]))])),
                        (
                            "scripts",
                            dir(vec![
                                ("check.sh", file("echo \"args: $1|$2\"\ntest -f README.md && echo 'cwd ok'\n")),
                                ("slow.sh", file("sleep 2.5\necho done\n")),
                                ("forever.sh", file("sleep 60\n")),
                                // A background beat that must stop when the run is cancelled; each beat is written
                                // whole and renamed into place, so a reader never finds it empty.
                                ("spawn.sh", file("(while :; do date +%s%N > /workspace/.beat && mv /workspace/.beat /workspace/heartbeat; sleep 0.1; done) &\nwait\n")),
                                ("where.sh", file("pwd\nid -u\necho \"$CLOUD_HARNESS_SKILL_DIR\"\nls \"$CLOUD_HARNESS_SKILL_DIR\"\ntouch \"$CLOUD_HARNESS_SKILL_DIR/x\" 2>/dev/null || echo read-only\n")),
                            ]),
                        ),
                    ],
                ),
            ),
            ("lint", skill("lint", "Lint, the team's way.")),
            ("tdd", skill_with("tdd", "Test first.", vec![("run.sh", Node::Exec(b"#!/bin/sh\necho tdd\n".to_vec()))])),
        ]),
    )]));
    let clash = Repo::create(&repos, "clash/skills.git", false);
    let clash_commit = clash.commit(dir(vec![(
        "skills",
        dir(vec![("review", skill("review", "A different review."))]),
    )]));
    let ws_kit = Repo::create(&repos, "ws/skills.git", false);
    let ws_commit = ws_kit.commit(dir(vec![(
        "skills",
        dir(vec![("wsx", skill("wsx", "Workspace skill."))]),
    )]));
    let project = Repo::create(&repos, "project.git", false);
    project.commit(dir(vec![
        ("README.md", file("# project\n")),
        (
            ".claude",
            dir(vec![(
                "skills",
                dir(vec![
                    ("lint", skill("lint", "The project's own lint.")),
                    (
                        "probe",
                        skill_with(
                            "probe",
                            "The project's probe.",
                            vec![
                                ("run.sh", file("echo v1\n")),
                                ("escape.sh", Node::Link("/bin/sh".into())),
                            ],
                        ),
                    ),
                ]),
            )]),
        ),
    ]));
    let conflict_project = Repo::create(&repos, "conflict-project.git", false);
    conflict_project.commit(dir(vec![
        ("README.md", file("# project\n")),
        (
            ".cloud-harness",
            dir(vec![(
                "skills",
                dir(vec![("wsx", skill("wsx", "Someone else's wsx."))]),
            )]),
        ),
    ]));

    let same_project = Repo::create(&repos, "same-project.git", false);
    same_project.commit(dir(vec![
        ("README.md", file("# project\n")),
        (
            ".cloud-harness",
            dir(vec![(
                "skills",
                dir(vec![("wsx", skill("wsx", "Workspace skill."))]),
            )]),
        ),
    ]));

    let env = vec![
        (
            "CLOUD_HARNESS_HOME".to_owned(),
            tmp.path().join("home").display().to_string(),
        ),
        (
            "TOOLKIT_CACHE_ROOT".to_owned(),
            tmp.path().join("store").display().to_string(),
        ),
        ("ALLOWED_GIT_HOSTS".to_owned(), server.host()),
        (
            "CLOUD_HARNESS_EXTRA_CA".to_owned(),
            certs.ca.display().to_string(),
        ),
        // The test server is on loopback, which the egress proxy opens only when told to, and
        // which helper containers could not reach: fetches run in-process here.
        (
            "CLOUD_HARNESS_ALLOW_CIDRS".to_owned(),
            "127.0.0.0/8".to_owned(),
        ),
        ("CLOUD_HARNESS_CONTAINERS".to_owned(), "off".to_owned()),
        (
            "CLOUD_HARNESS_URL_REWRITE".to_owned(),
            format!("https://github.com/={}", server.url("")),
        ),
        ("CLOUD_HARNESS_EXECUTOR".to_owned(), executor.to_owned()),
        ("RUST_LOG".to_owned(), "warn".to_owned()),
        ("PATH".to_owned(), std::env::var("PATH").unwrap_or_default()),
    ];
    // The preset without a version means its pin: the operator pins it at the mirror's commit
    // (acquired through the mirror, as any pin move is).
    let pinned = Command::new(BIN)
        .args(["registry", "pin", "obra/superpowers", &superpowers_commit])
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    assert!(
        pinned.status.success(),
        "{}",
        String::from_utf8_lossy(&pinned.stderr)
    );
    let git = |id: &str, repo: &str, commit: &str| json!({ "kind": "git", "instanceId": id, "url": server.url(repo), "ref": commit });
    // Six small toolkits: an open of all of them takes two rounds of fetches.
    let many: Vec<serde_json::Value> = (1..=6)
        .map(|i| {
            let name = format!("kit-{i}");
            let repo = format!("kits/{name}.git");
            let commit = Repo::create(&repos, &repo, false).commit(dir(vec![(
                "skills",
                dir(vec![(name.as_str(), skill(&name, "One of many."))]),
            )]));
            git(&name, &repo, &commit)
        })
        .collect();
    let mut ws_scope = git("ws-kit", "ws/skills.git", &ws_commit);
    ws_scope["scope"] = json!("workspace");
    let fixtures = json!({
        "key": "key-1",
        "project": server.url("project.git"),
        "conflictProject": server.url("conflict-project.git"),
        "sameProject": server.url("same-project.git"),
        "preset": { "kind": "preset", "id": "obra/superpowers" },
        "team": git("team", "team/skills.git", &team_commit),
        "clash": git("clash", "clash/skills.git", &clash_commit),
        "wsScope": ws_scope,
        "many": many,
    });
    World {
        executor,
        tmp,
        _certs: certs,
        _server: server,
        env,
        fixtures,
    }
}

impl World {
    fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    fn scenario(&self, python: &str, transport: &str, mode: &str, url: Option<&str>, part: &str) {
        let token = std::fs::read_to_string(self.tmp.path().join("token")).ok();
        let config = json!({
            "token": token,
            "binary": BIN,
            "env": self.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "transport": transport,
            "mode": mode,
            "executor": self.executor,
            "url": url,
            "home": self.home(),
            "fixtures": self.fixtures,
        });
        let path = self
            .tmp
            .path()
            .join(format!("config-{transport}-{mode}-{part}.json"));
        std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/scenario.py");
        let out = Command::new(python)
            .arg(script)
            .arg(&path)
            .arg(part)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{part} over {transport} ({mode}) failed:\n{text}"
        );
        eprintln!("{}", text.trim());
    }

    /// No executor container of this world's workspaces is left but those of open ones (and
    /// of spare executors, whose folders say so).
    fn assert_no_stray_containers(&self) {
        if self.executor != "docker" {
            return;
        }
        let out = Command::new("docker")
            .args([
                "ps",
                "-a",
                "--filter",
                "label=io.cloud-harness.workspace-dir",
            ])
            .args(["--format", "{{.Label \"io.cloud-harness.workspace-dir\"}}"])
            .output()
            .unwrap();
        let home = self.home().join("workspaces");
        for dir in String::from_utf8_lossy(&out.stdout).lines() {
            let dir = Path::new(dir);
            if dir.starts_with(&home) {
                assert!(
                    dir.join("workspace.json").is_file() || dir.join("spare").is_file(),
                    "a container of a workspace that is not open: {}",
                    dir.display()
                );
            }
        }
    }

    /// `cloud-harness exec` in a workspace of this world; exit status and stdout.
    fn exec(&self, workspace: &str, script: &str) -> (i32, String) {
        let out = Command::new(BIN)
            .args(["exec", workspace, "--", "sh", "-c", script])
            .envs(self.env.iter().cloned())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// `serve --http` on an ephemeral loopback port; returns the process and the URL. The
    /// operator token its first start prints is kept for the scenarios (in `<tmp>/token`).
    fn http_server(&self) -> (Serve, String) {
        let mut child = Command::new(BIN)
            .args(["serve", "--http", "127.0.0.1:0"])
            .envs(self.env.iter().cloned())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("the server said where it listens")
                .unwrap();
            if let Some(at) = line.find("http://") {
                break line[at..].trim().to_owned();
            }
        };
        let token_file = self.tmp.path().join("token");
        if !token_file.exists() {
            // Its first start says so, and leaves the token in `<home>/operator-token`.
            loop {
                let line = lines
                    .next()
                    .expect("a first start says where its token is")
                    .unwrap();
                assert!(!line.contains("cht_"), "the token is in the log: {line}");
                if line.contains("first start") {
                    break;
                }
            }
            let home = self
                .env
                .iter()
                .find(|(k, _)| k == "CLOUD_HARNESS_HOME")
                .map(|(_, v)| std::path::PathBuf::from(v))
                .unwrap();
            let text = std::fs::read_to_string(home.join("operator-token")).unwrap();
            std::fs::write(&token_file, text.lines().next().unwrap()).unwrap();
        }
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        (Serve(Some(child)), url)
    }
}

/// A `serve --http` process, killed if a test fails before stopping it.
struct Serve(Option<Child>);

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// SIGTERM: the server must unmount and exit 0.
fn stop(mut serve: Serve) {
    let mut child = serve.0.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "serve exited with {status}");
}

#[test]
fn stdio_session_less_full_scenario_and_bad_input_on_bwrap() {
    let Some(python) = python() else { return };
    if !has_executor("bwrap") {
        return;
    }
    let w = world("bwrap");
    w.scenario(&python, "stdio", "modern", None, "full");
    w.scenario(&python, "stdio", "modern", None, "bad-input");
}

#[test]
fn http_initialize_handshake_full_scenario_bad_input_and_origin_check_on_docker() {
    let Some(python) = python() else { return };
    if !has_executor("docker") {
        return;
    }
    let w = world("docker");
    let (server, url) = w.http_server();
    w.scenario(&python, "http", "legacy", Some(&url), "full");
    w.scenario(&python, "http", "legacy", Some(&url), "bad-input");
    w.scenario(&python, "http", "legacy", Some(&url), "origin");
    stop(server);
    w.assert_no_stray_containers();
}

#[test]
fn the_other_two_combinations_refuse_bad_input() {
    let Some(python) = python() else { return };
    if !has_executor("bwrap") {
        return;
    }
    let w = world("bwrap");
    w.scenario(&python, "stdio", "legacy", None, "bad-input");
    let (server, url) = w.http_server();
    w.scenario(&python, "http", "modern", Some(&url), "bad-input");
    stop(server);
}

/// The key survives a restart, and so does the docker executor: after `serve` starts again
/// and mounts the skills again, the same container reads them without being recreated.
#[test]
fn an_idempotency_key_and_a_docker_executor_survive_a_restart() {
    let Some(python) = python() else { return };
    if !has_executor("docker") {
        return;
    }
    let w = world("docker");
    let (server, url) = w.http_server();
    w.scenario(&python, "http", "modern", Some(&url), "restart-1");
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.home().join("restart.json")).unwrap()).unwrap();
    let workspace = saved["workspace"].as_str().unwrap().to_owned();
    let container = saved["executor"]["id"].as_str().unwrap().to_owned();
    let started = |id: &str| {
        let out = Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{.State.StartedAt}} {{.State.Running}}",
                id,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let before = started(&container);
    assert!(before.ends_with("true"), "{before}");
    stop(server);
    let (server, url) = w.http_server();
    let (code, out) = w.exec(&workspace, "cat /opt/cloud-harness/skills/review/SKILL.md");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Review code"), "{out}");
    assert_eq!(
        started(&container),
        before,
        "the container was restarted or recreated"
    );
    w.scenario(&python, "http", "modern", Some(&url), "restart-2");
    stop(server);
    w.assert_no_stray_containers();
}

/// A cold `workspace_open` of six toolkits over a slow git server tells its progress
/// (`notifications/progress`, growing) and, cancelled by the SDK midway, leaves nothing: no
/// workspace folder, and its key free for the same request.
#[test]
fn a_cold_open_tells_its_progress_and_a_cancel_leaves_nothing() {
    let Some(python) = python() else { return };
    let w = world_slow("none", 1.5);
    let (server, url) = w.http_server();
    w.scenario(&python, "http", "modern", Some(&url), "progress");
    stop(server);
}

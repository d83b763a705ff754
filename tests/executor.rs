//! Executors, on both backends: what a hostile script can do inside one (write to the skills,
//! reach the network or the host's loopback, see the harness's state or environment, hold
//! capabilities), `cloud-harness exec` with bad input, an executor removed behind the
//! harness's back, and closing a workspace while a script runs.
//!
//! Needs root, `/dev/fuse`, and per backend a Docker engine or bubblewrap: without them the
//! tests say so and pass, except when `CI` is set.

mod support;

use cloud_harness::executor::{Kind, Settings};
use cloud_harness::workspace::{OpenRequest, RunRequest, Workspaces};
use cloud_harness_fs::cas::Store;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

fn available(kind: Kind) -> bool {
    let root = nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists();
    let backend = support::executor_backend(kind.as_str());
    let ok = root && backend;
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "CI must run the {kind:?} executor tests (root, /dev/fuse, .ci/setup's packages)"
    );
    if !ok {
        eprintln!("skipped: the {kind:?} executor tests need root, /dev/fuse and the backend");
    }
    ok
}

struct Harness {
    tmp: tempfile::TempDir,
    kind: Kind,
    workspaces: Arc<Workspaces>,
    kit: cloud_harness::toolkit::ToolkitSpec,
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn harness(kind: Kind) -> Harness {
    harness_with(Settings::with_kind(kind), |store| {
        support::warm_provisioner(store)
    })
}

fn harness_with(
    settings: Settings,
    provisioner: impl FnOnce(&Store) -> cloud_harness::provision::Provisioner,
) -> Harness {
    let kind = match settings.choice {
        cloud_harness::executor::Choice::Only(kind) => kind,
        // Without an executor, only the store and the mounts are made.
        _ => Kind::Host,
    };
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("kit");
    write(
        &src.join("alpha/SKILL.md"),
        "---\nname: alpha\ndescription: The alpha skill.\n---\nAlpha.\n",
    );
    write(
        &src.join("alpha/scripts/hello.sh"),
        "echo hello from $(pwd)\n",
    );
    write(&src.join("alpha/scripts/long.sh"), "sleep 120\n");
    let kit = support::warm_toolkit(&store, &src, "kit");
    let workspaces =
        Workspaces::with_executors(tmp.path().join("home"), provisioner(&store), true, settings)
            .unwrap();
    Harness {
        tmp,
        kind,
        workspaces: Arc::new(workspaces),
        kit,
    }
}

impl Harness {
    fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    fn open(&self, key: &str) -> Value {
        self.workspaces
            .open(OpenRequest {
                repository_url: None,
                idempotency_key: key.into(),
                toolkits: vec![self.kit.clone()],
                allow_toolkit_workspace_changes: false,
            })
            .unwrap()
    }

    /// `cloud-harness exec WS -- ARGV`, with `stdin`; exit status, stdout, stderr.
    fn exec(&self, ws: &str, argv: &[&str], stdin: &[u8]) -> (i32, String, String) {
        let mut child = Command::new(BIN)
            .arg("exec")
            .arg(ws)
            .arg("--")
            .args(argv)
            .env("CLOUD_HARNESS_HOME", self.home())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn approve(&self, digest: &Value) {
        write(
            &self.home().join("operator.json"),
            &json!({ "approvedSkills": [digest] }).to_string(),
        );
    }

    fn run(&self, ws: &str, script: &str) -> cloud_harness_fs::Result<Value> {
        let ws = self.workspaces.get(ws)?;
        let home = self.home();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(ws.run(
            &home,
            RunRequest {
                skill: "alpha".into(),
                script: script.into(),
                args: vec![],
                timeout: Duration::from_secs(60),
            },
            CancellationToken::new(),
            |_, _| {},
        ))
    }

    /// Nothing of this harness's workspaces is left: no container, no mount, no folder.
    fn assert_nothing_left(&self) {
        let home = self.home();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(&*home.to_string_lossy()),
            "mounts left under {}",
            home.display()
        );
        let left: Vec<_> = std::fs::read_dir(home.join("workspaces"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "{left:?}");
        if self.kind == Kind::Docker {
            let out = Command::new("docker")
                .args(["ps", "-a", "--format"])
                .arg("{{.Label \"io.cloud-harness.workspace-dir\"}}")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                !text.lines().any(|d| Path::new(d).starts_with(&home)),
                "containers left: {text}"
            );
        }
    }
}

fn containment(kind: Kind) {
    let h = harness(kind);
    let result = h.open("contain");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    assert_eq!(result["executor"]["kind"], json!(kind.as_str()), "{result}");
    assert_eq!(result["path"], "/workspace");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    h.approve(&json!(format!("sha256:{}", "0".repeat(64))));
    // A value from this (the server's) process's own environment: no process inside may
    // show it.
    let secret = std::env::var("NEXTEST_RUN_ID")
        .or_else(|_| std::env::var("CARGO_MANIFEST_DIR"))
        .unwrap();
    let home = h.home();
    let store = h.tmp.path().join("store");
    let operator = home.join("operator.json");
    let probe =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/executor/probe.py"))
            .unwrap();
    let (code, out, err) = h.exec(
        &ws,
        &[
            "python3",
            "-",
            "/opt/cloud-harness/skills/alpha/SKILL.md",
            &port,
            &secret,
            &home.display().to_string(),
            &store.display().to_string(),
            &operator.display().to_string(),
            &h.tmp.path().display().to_string(),
        ],
        &probe,
    );
    assert_eq!(code, 0, "{out}{err}");
    let seen: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    for mount in ["skillsWrites", "ownerWrites"] {
        for (call, errno) in seen[mount].as_object().unwrap() {
            assert_eq!(errno, "EROFS", "{mount} {call}: {seen}");
        }
    }
    assert!(
        seen["readSkill"].as_str().unwrap().contains("Alpha."),
        "{seen}"
    );
    assert_eq!(seen["ownerListing"], json!(["alpha"]));
    assert_ne!(seen["uid"], 0, "{seen}");
    assert_ne!(seen["euid"], 0, "{seen}");
    for (set, value) in seen["capabilities"].as_object().unwrap() {
        assert_eq!(value, "0000000000000000", "{set}: {seen}");
    }
    assert_eq!(seen["noNewPrivs"], "1", "{seen}");
    assert_eq!(seen["cwd"], "/workspace");
    // The host's listener is not reachable: the loopback inside is the executor's own, and
    // it has no route anywhere.
    assert_eq!(seen["loopbackConnect"], "ECONNREFUSED", "{seen}");
    assert_eq!(seen["ipv4Routes"], json!([]), "{seen}");
    assert!(
        seen["ipv6Routes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i == "lo"),
        "{seen}"
    );
    assert_eq!(seen["interfaces"], json!(["lo"]), "{seen}");
    for (path, errno) in seen["hostPaths"].as_object().unwrap() {
        assert_eq!(errno, "ENOENT", "{path} is visible inside: {seen}");
    }
    assert_eq!(seen["environLeaks"], json!([]), "{seen}");
    assert_eq!(seen["workspaceWrite"], "ok");
    assert_eq!(seen["tmpWrite"], "ok");
    assert_eq!(seen["rootWrite"], "EROFS", "{seen}");
    assert_eq!(seen["usrWrite"], "EROFS", "{seen}");
    // The ceilings the README names: a private /tmp of 1 GiB; 1,024 processes (docker: the
    // container's pid cgroup, with 2 GiB of memory; bwrap: the uid's process limit).
    let limits = &seen["limits"];
    assert_eq!(limits["tmpBytes"], json!(1u64 << 30), "{seen}");
    match kind {
        Kind::Docker => {
            assert_eq!(limits["pidsMax"], "1024", "{seen}");
            assert_eq!(
                limits["memoryMax"],
                json!((2u64 << 30).to_string()),
                "{seen}"
            );
        }
        _ => assert_eq!(limits["nproc"], 1024, "{seen}"),
    }
    drop(listener);

    // An approved script runs inside and says so.
    let digest = support::skill_digest(&result, "alpha");
    let refused = h.run(&ws, "scripts/hello.sh").unwrap_err();
    assert_eq!(refused.code, cloud_harness_fs::Code::Forbidden);
    h.approve(&digest);
    let ran = h.run(&ws, "scripts/hello.sh").unwrap();
    assert_eq!(ran["stdout"], "hello from /workspace\n", "{ran}");
    assert_eq!(ran["executor"], json!(kind.as_str()));

    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

#[test]
fn a_hostile_script_in_a_docker_executor_is_contained() {
    if available(Kind::Docker) {
        containment(Kind::Docker);
    }
}

#[test]
fn a_hostile_script_in_a_bwrap_executor_is_contained() {
    if available(Kind::Bwrap) {
        containment(Kind::Bwrap);
    }
}

fn bad_input(kind: Kind) {
    let h = harness(kind);
    let ws = h.open("bad")["workspace"].as_str().unwrap().to_owned();
    for unknown in [
        "ws_00000000000000000000000000000000",
        "../../etc",
        "ws_nope",
    ] {
        let (code, _, err) = h.exec(unknown, &["true"], b"");
        assert_eq!(code, 125, "{unknown}: {err}");
        assert!(err.contains("no open workspace"), "{unknown}: {err}");
    }
    let (code, out, err) = h.exec(&ws, &["no-such-command-anywhere"], b"");
    assert!(code == 126 || code == 127, "{code}: {out}{err}");
    assert!(
        format!("{out}{err}").contains("no-such-command-anywhere"),
        "{out}{err}"
    );
    let (code, out, _) = h.exec(&ws, &["sh", "-c", "cat; exit 7"], b"piped in\n");
    assert_eq!((code, out.as_str()), (7, "piped in\n"));
    h.workspaces.close(&ws).unwrap();
    let (code, _, err) = h.exec(&ws, &["true"], b"");
    assert!(code == 125 && err.contains("no open workspace"), "{err}");
    h.assert_nothing_left();
}

#[test]
fn exec_refuses_bad_input_on_docker() {
    if available(Kind::Docker) {
        bad_input(Kind::Docker);
    }
}

#[test]
fn exec_refuses_bad_input_on_bwrap() {
    if available(Kind::Bwrap) {
        bad_input(Kind::Bwrap);
    }
}

#[test]
fn an_executor_stopped_or_removed_behind_the_harness_back() {
    if !available(Kind::Docker) {
        return;
    }
    let h = harness(Kind::Docker);
    let result = h.open("gone");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    let container = result["executor"]["id"].as_str().unwrap();
    // A stopped container (a reboot, an operator) is started again on the next command.
    let stopped = Command::new("docker")
        .args(["stop", "-t", "1", container])
        .output()
        .unwrap();
    assert!(stopped.status.success());
    let (code, out, err) = h.exec(
        &ws,
        &["cat", "/opt/cloud-harness/skills/alpha/SKILL.md"],
        b"",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Alpha."), "{out}");
    let removed = Command::new("docker")
        .args(["rm", "-f", container])
        .output()
        .unwrap();
    assert!(removed.status.success());
    let (code, _, err) = h.exec(&ws, &["true"], b"");
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("is gone") && err.contains(&ws), "{err}");
    let digest = support::skill_digest(&result, "alpha");
    h.approve(&digest);
    let e = h.run(&ws, "scripts/hello.sh").unwrap_err();
    assert_eq!(e.code, cloud_harness_fs::Code::Upstream, "{e}");
    assert!(e.message.contains("is gone"), "{e}");
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

fn close_while_running(kind: Kind) {
    let h = Arc::new(harness(kind));
    let result = h.open("busy");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    let digest = support::skill_digest(&result, "alpha");
    h.approve(&digest);
    let running = {
        let (h, ws) = (h.clone(), ws.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            (h.run(&ws, "scripts/long.sh"), started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    h.workspaces.close(&ws).unwrap();
    let (outcome, took) = running.join().unwrap();
    assert!(
        took < Duration::from_secs(30),
        "the run outlived its workspace: {took:?}"
    );
    let outcome = outcome.unwrap();
    assert!(
        outcome["cancelled"] == true || outcome["exitCode"] != 0,
        "{outcome}"
    );
    h.assert_nothing_left();
}

#[test]
fn closing_a_workspace_stops_its_running_script_on_docker() {
    if available(Kind::Docker) {
        close_while_running(Kind::Docker);
    }
}

#[test]
fn closing_a_workspace_stops_its_running_script_on_bwrap() {
    if available(Kind::Bwrap) {
        close_while_running(Kind::Bwrap);
    }
}

/// With `network: egress`, the executor reaches exactly its allowed hosts, through its own
/// egress proxy: not the metadata address, not loopback, not a host off the list, not the
/// host's services directly.
#[test]
fn egress_goes_through_the_proxy_to_allowed_hosts_only() {
    if !available(Kind::Docker) {
        return;
    }
    let bridge = support::bridge_address();
    let listener = std::net::TcpListener::bind((bridge.as_str(), 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    // A service of the host's on every address: the executor must not reach it by any.
    let everywhere = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = everywhere.local_addr().unwrap().port();
    let mut settings = Settings::with_kind(Kind::Docker);
    settings.network = cloud_harness::executor::Network::Egress;
    settings.allowed_hosts = format!("allowed.test:{port}");
    let h = harness_with(settings, |store| {
        support::warm_provisioner_with(
            store,
            &format!("{bridge}/32"),
            &format!("allowed.test={bridge}"),
        )
        .with_sandbox(cloud_harness::provision::sandbox::Sandbox::detect(
            PathBuf::from(BIN),
        ))
    });
    let result = h.open("egress");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    assert_eq!(result["executor"]["network"], "egress", "{result}");
    let probe = format!(
        r#"
import errno, json, os, socket
out = {{"proxyEnv": os.environ.get("HTTPS_PROXY")}}
def via_proxy(target):
    s = socket.create_connection(("egress-proxy", 3128), timeout=10)
    s.sendall(f"CONNECT {{target}} HTTP/1.1\r\nHost: {{target}}\r\n\r\n".encode())
    line = s.recv(4096).split(b"\r\n")[0].decode()
    s.close()
    return line
def direct(host, port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
out["allowed"] = via_proxy("allowed.test:{port}")
for name, target in [("metadata", "169.254.169.254:443"), ("loopback", "127.0.0.1:{port}"),
                     ("unlisted", "unlisted.test:443"), ("byAddress", "{bridge}:{port}"),
                     ("otherPort", "allowed.test:443")]:
    out[name] = via_proxy(target)
out["direct"] = direct("{bridge}", {port})
gateways = {{socket.inet_ntoa(bytes.fromhex(l.split()[2])[::-1]) for l in open("/proc/net/route").read().splitlines()[1:]}}
gateways |= {{socket.inet_ntoa(bytes.fromhex(l.split()[1])[::-1][:3] + b"\x01") for l in open("/proc/net/route").read().splitlines()[1:]}}
out["hostServices"] = {{g: direct(g, {host_port}) for g in gateways if g != "0.0.0.0"}}
print(json.dumps(out))
"#
    );
    let (code, out, err) = h.exec(&ws, &["python3", "-c", &probe], b"");
    assert_eq!(code, 0, "{out}{err}");
    let seen: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(seen["proxyEnv"], "http://egress-proxy:3128", "{seen}");
    assert!(seen["allowed"].as_str().unwrap().contains(" 200"), "{seen}");
    for refused in ["metadata", "loopback", "unlisted", "byAddress", "otherPort"] {
        assert!(
            seen[refused].as_str().unwrap().contains(" 403"),
            "{refused}: {seen}"
        );
    }
    assert_ne!(seen["direct"], "ok", "{seen}");
    let reached: Vec<_> = seen["hostServices"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| *v == "ok")
        .collect();
    assert!(
        reached.is_empty(),
        "the host's own services are reachable: {seen}"
    );
    drop((listener, everywhere));
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
    let networks = Command::new("docker")
        .args(["network", "ls", "-q", "--filter"])
        .arg(format!("name=cloud-harness-exec-net-{ws}"))
        .output()
        .unwrap();
    assert!(networks.stdout.is_empty(), "the egress network was left");
}

/// Without an executor, a workspace still opens and its skills are read; scripts never run
/// (on the host least of all), and the refusal says what to install.
#[test]
fn without_an_executor_skills_are_read_and_scripts_refused() {
    if !available(Kind::Bwrap) {
        return;
    }
    let mut settings = Settings::with_kind(Kind::Bwrap);
    settings.choice = cloud_harness::executor::Choice::Off;
    let h = harness_with(settings, support::warm_provisioner);
    let result = h.open("none");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    assert!(result["executor"].is_null(), "{result}");
    assert!(
        result["path"].is_null() && result["skillsMount"].is_null(),
        "{result}"
    );
    let warnings = result["warnings"].to_string();
    assert!(warnings.contains("bubblewrap"), "{result}");
    let page = h
        .workspaces
        .get(&ws)
        .unwrap()
        .read("alpha", "SKILL.md", 0, 4096)
        .unwrap();
    assert!(page.content.contains("Alpha."));
    h.approve(&support::skill_digest(&result, "alpha"));
    let e = h.run(&ws, "scripts/hello.sh").unwrap_err();
    assert_eq!(e.code, cloud_harness_fs::Code::Forbidden, "{e}");
    assert!(e.message.contains("install bubblewrap"), "{e}");
    let (code, _, err) = h.exec(&ws, &["true"], b"");
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("no executor"), "{err}");
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

/// Closing never hangs on a busy mount: a file held open in the skills mount makes the
/// unmount lazy, and closing returns anyway.
#[test]
fn closing_with_a_busy_mount_does_not_hang() {
    if !available(Kind::Bwrap) {
        return;
    }
    let h = harness(Kind::Bwrap);
    let result = h.open("busy-mount");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    let held = std::fs::File::open(
        h.home()
            .join("workspaces")
            .join(&ws)
            .join("mounts/skills/alpha/SKILL.md"),
    )
    .unwrap();
    // On a thread, so a regression fails here instead of hanging the suite.
    let (done, closed) = std::sync::mpsc::channel();
    let workspaces = h.workspaces.clone();
    std::thread::spawn(move || done.send(workspaces.close(&ws)).unwrap());
    let outcome = closed
        .recv_timeout(Duration::from_secs(20))
        .expect("closing waited for the mount's last user");
    outcome.unwrap();
    drop(held);
}

/// A server killed in the middle of an open leaves a folder (and a container) without a
/// record; the next start removes them.
#[test]
fn a_start_removes_what_an_open_cut_short_left() {
    if !available(Kind::Docker) {
        return;
    }
    let h = harness(Kind::Docker);
    let result = h.open("cut-short");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    let dir = h.home().join("workspaces").join(&ws);
    // As if the server died before writing the record.
    std::fs::remove_file(dir.join("workspace.json")).unwrap();
    h.workspaces.shutdown();
    let store = Store::open(h.tmp.path().join("store")).unwrap();
    let again = Workspaces::with_executors(
        h.home(),
        support::warm_provisioner(&store),
        true,
        Settings::with_kind(Kind::Docker),
    )
    .unwrap();
    assert!(!dir.exists(), "the half-made workspace is still there");
    drop(again);
    h.assert_nothing_left();
}

//! Executors, on both backends: what a hostile script can do inside one (write to the skills,
//! reach the network or the host's loopback, see the harness's state or environment, hold
//! capabilities), `cloud-harness exec` with bad input, egress through the proxy, and a
//! workspace without an executor. Their lifecycle is in `tests/executor_lifecycle.rs`.
//!
//! Needs root, `/dev/fuse`, and per backend a Docker engine or bubblewrap: without them the
//! tests say so and pass, except when `CI` is set.

use crate::support;

use cloud_harness_executor::{Kind, Settings};
use cloud_harness_mount::stats::{Op, STATS};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::executors::{available, harness, harness_with, BIN};

fn containment(kind: Kind) {
    let h = harness(kind);
    let result = h.open("contain");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    assert_eq!(result["executor"]["kind"], json!(kind.as_str()), "{result}");
    assert_eq!(result["path"], "/workspace");
    // Both mounts are walked once in the background (the prewarm): the daemon, in this
    // process, serves the walker's listings of the root and alpha's folders in each before
    // anyone asks (it reads no file: the mounts count their loads, docs/usage.md).
    let started = std::time::Instant::now();
    let listings = || STATS.ops(Op::Readdirplus) + STATS.ops(Op::Readdir);
    while listings() < 4 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "no prewarm: {} listings",
            listings()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
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
    // container's pid cgroup, with `run_memory` (4 GiB) of memory, to a page; bwrap: the
    // uid's process limit, and a cgroup of the sandbox's own, which tests/executor_runs.rs
    // checks from outside).
    let limits = &seen["limits"];
    assert_eq!(limits["tmpBytes"], json!(1u64 << 30), "{seen}");
    match kind {
        Kind::Docker => {
            assert_eq!(limits["pidsMax"], "1024", "{seen}");
            let memory: u64 = limits["memoryMax"].as_str().unwrap().parse().unwrap();
            assert!((4u64 << 30) - memory <= 4096, "{seen}");
        }
        // The sandbox's cgroup bounds its processes (a test of its own forks past them): the
        // uid's RLIMIT_NPROC, shared by every workspace, is left as the server has it.
        // (Python says -1 for no limit.)
        _ => assert!(
            limits["nproc"] == -1 || limits["nproc"].as_u64().unwrap() > 1024,
            "{seen}"
        ),
    }
    drop(listener);

    // An approved script runs inside and says so.
    let digest = support::skill_digest(&result, "alpha");
    let refused = h.run(&ws, "scripts/hello.sh").unwrap_err();
    assert_eq!(refused.code, cloud_harness_error::Code::Forbidden);
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

/// With `network: egress`, the executor reaches exactly its allowed hosts, through its own
/// egress proxy: not the metadata address, not loopback, not a host off the list, not the
/// host's services directly. Docker: a proxy container on the executor's internal network;
/// bubblewrap: the harness's proxy, listening inside the sandbox's network namespace.
fn egress_goes_through_the_proxy_to_allowed_hosts_only(kind: Kind) {
    // The allowed host: the Docker bridge's address (what a container reaches), or for
    // bubblewrap a loopback address of a network namespace this test makes for itself, so
    // nothing the proxy (in this process) dials can leave the machine.
    let allowed = match kind {
        Kind::Docker => support::bridge_address(),
        _ => {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let up = Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .unwrap();
            assert!(up.success());
            "127.0.0.2".to_owned()
        }
    };
    let listener = std::net::TcpListener::bind((allowed.as_str(), 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    // A service of the host's on every address: the executor must not reach it by any.
    let everywhere = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = everywhere.local_addr().unwrap().port();
    let mut settings = Settings::with_kind(kind);
    settings.network = cloud_harness_executor::Network::Egress;
    settings.allowed_hosts = format!("allowed.test:{port}");
    if kind == Kind::Bwrap {
        // `cloud-harness exec` serves a bubblewrap sandbox's proxy itself, with the policy
        // of the configuration it reads (as `serve` does).
        for (name, value) in [
            (
                "CLOUD_HARNESS_EXECUTOR_ALLOWED_HOSTS",
                settings.allowed_hosts.clone(),
            ),
            ("CLOUD_HARNESS_ALLOW_CIDRS", format!("{allowed}/32")),
            ("CLOUD_HARNESS_RESOLVE", format!("allowed.test={allowed}")),
        ] {
            // SAFETY: set before this test starts a thread.
            unsafe { std::env::set_var(name, value) };
        }
    }
    let h = harness_with(settings, |store| {
        let p = support::warm_provisioner_with(
            store,
            &format!("{allowed}/32"),
            &format!("allowed.test={allowed}"),
        );
        match kind {
            Kind::Docker => p.with_sandbox(cloud_harness_provision::sandbox::Sandbox::detect(
                PathBuf::from(BIN),
            )),
            _ => p,
        }
    });
    let result = h.open("egress");
    let ws = result["workspace"].as_str().unwrap().to_owned();
    assert_eq!(result["executor"]["network"], "egress", "{result}");
    let probe = format!(
        r#"
import errno, json, os, socket
out = {{"proxyEnv": os.environ.get("HTTPS_PROXY")}}
proxy = os.environ["HTTPS_PROXY"].removeprefix("http://").split(":")
def via_proxy(target):
    s = socket.create_connection((proxy[0], int(proxy[1])), timeout=10)
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
                     ("unlisted", "unlisted.test:443"), ("byAddress", "{allowed}:{port}"),
                     ("otherPort", "allowed.test:443")]:
    out[name] = via_proxy(target)
out["direct"] = direct("{allowed}", {port})
gateways = {{socket.inet_ntoa(bytes.fromhex(l.split()[2])[::-1]) for l in open("/proc/net/route").read().splitlines()[1:]}}
gateways |= {{socket.inet_ntoa(bytes.fromhex(l.split()[1])[::-1][:3] + b"\x01") for l in open("/proc/net/route").read().splitlines()[1:]}}
out["hostServices"] = {{g: direct(g, {host_port}) for g in gateways if g != "0.0.0.0"}}
print(json.dumps(out))
"#
    );
    let (code, out, err) = h.exec(&ws, &["python3", "-c", &probe], b"");
    assert_eq!(code, 0, "{out}{err}");
    let seen: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let proxy = match kind {
        Kind::Docker => "http://egress-proxy:3128",
        _ => "http://127.0.0.1:3128",
    };
    assert_eq!(seen["proxyEnv"], proxy, "{seen}");
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
    // A skill's script run by the server goes the same way.
    h.approve(&support::skill_digest(&result, "alpha"));
    let tree = h.home().join("workspaces").join(&ws).join("repo");
    std::fs::write(tree.join("target.txt"), format!("allowed.test:{port}")).unwrap();
    let ran = h.run(&ws, "scripts/egress.py").unwrap();
    assert!(ran["stdout"].as_str().unwrap().contains(" 200"), "{ran}");
    std::fs::write(tree.join("target.txt"), "169.254.169.254:80").unwrap();
    let ran = h.run(&ws, "scripts/egress.py").unwrap();
    assert!(ran["stdout"].as_str().unwrap().contains(" 403"), "{ran}");
    drop((listener, everywhere));
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
    if kind == Kind::Docker {
        let networks = Command::new("docker")
            .args(["network", "ls", "-q", "--filter"])
            .arg(format!("name=cloud-harness-exec-net-{ws}"))
            .output()
            .unwrap();
        assert!(networks.stdout.is_empty(), "the egress network was left");
    }
}

#[test]
fn egress_goes_through_the_proxy_to_allowed_hosts_only_on_docker() {
    if available(Kind::Docker) {
        egress_goes_through_the_proxy_to_allowed_hosts_only(Kind::Docker);
    }
}

#[test]
fn egress_goes_through_the_proxy_to_allowed_hosts_only_on_bwrap() {
    if available(Kind::Bwrap) {
        egress_goes_through_the_proxy_to_allowed_hosts_only(Kind::Bwrap);
    }
}

/// Without an executor, a workspace still opens and its skills are read; scripts never run
/// (on the host least of all), and the refusal says what to install.
#[test]
fn without_an_executor_skills_are_read_and_scripts_refused() {
    if !available(Kind::Bwrap) {
        return;
    }
    let mut settings = Settings::with_kind(Kind::Bwrap);
    settings.choice = cloud_harness_executor::Choice::Off;
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
    assert_eq!(e.code, cloud_harness_error::Code::Forbidden, "{e}");
    assert!(e.message.contains("install bubblewrap"), "{e}");
    let (code, _, err) = h.exec(&ws, &["true"], b"");
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("no executor"), "{err}");
    h.workspaces.close(&ws).unwrap();
    h.assert_nothing_left();
}

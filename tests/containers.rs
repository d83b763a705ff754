//! Fetches in helper containers, for real: an internal Docker network, the egress proxy as its
//! only way out, and the test git server on this machine's Docker bridge address. Needs a
//! Docker engine (`.ci/setup` installs Debian's docker.io and starts dockerd): skipped where
//! there is none, except under CI.

use crate::support;

use cloud_harness_control::toolkit::{Revision, ToolkitSpec};
use cloud_harness_error::Code;
use cloud_harness_provision::sandbox::Sandbox;
use cloud_harness_provision::staging::Limits;
use cloud_harness_provision::Provisioner;
use cloud_harness_store::cas::Store;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{dir, skill, Certs, GitServer, Repo};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

fn sandbox() -> Option<Sandbox> {
    let found = Sandbox::detect(PathBuf::from(BIN));
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the container tests: install docker.io and start dockerd"
        );
        eprintln!("skipped: no Docker engine");
    }
    found
}

/// The owner label of provisioning objects that the process `pid` makes (`warm`'s owner:
/// `<boot id>/<pid namespace>/<pid>`). The checks below look at one owner's objects only, so
/// servers of other test binaries with helpers of their own never confuse them.
fn owner(pid: u32) -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    format!("{}/{}/{pid}", boot.trim(), ns.display())
}

fn mine() -> String {
    owner(std::process::id())
}

/// Names of `docker ps -a` or `docker network ls` rows owned by `owner`, more filters added.
fn owned(what: &[&str], owner: &str, filters: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("docker");
    let field = if what[0] == "ps" {
        "{{.Names}}"
    } else {
        "{{.Name}}"
    };
    cmd.args(what).args(["--format", field]).args([
        "--filter",
        &format!("label=io.cloud-harness.provisioning.owner={owner}"),
    ]);
    for f in filters {
        cmd.args(["--filter", f]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    names.sort();
    names
}

/// Helper containers of this process, running or not.
fn helpers() -> String {
    owned(&["ps", "-a"], &mine(), &["name=cloud-harness-fetch-"]).join("\n")
}

/// The names of the warm provisioning network and proxy of `owner` (one of each).
fn warm_pair_of(owner: &str) -> (String, String) {
    let ps = owned(&["ps", "-a"], owner, &["name=cloud-harness-proxy-"]);
    let nets = owned(&["network", "ls"], owner, &[]);
    assert!(
        ps.len() == 1 && ps[0].starts_with("cloud-harness-proxy-"),
        "one warm proxy: {ps:?}"
    );
    assert!(
        nets.len() == 1 && nets[0].starts_with("cloud-harness-prov-"),
        "one warm network: {nets:?}"
    );
    (nets[0].clone(), ps[0].clone())
}

fn warm_pair() -> (String, String) {
    warm_pair_of(&mine())
}

/// Containers and networks of provisioning that `owner` left.
fn leftovers_of(owner: &str) -> (String, String) {
    (
        owned(&["ps", "-a"], owner, &[]).join("\n"),
        owned(&["network", "ls"], owner, &[]).join("\n"),
    )
}

fn leftovers() -> (String, String) {
    leftovers_of(&mine())
}

struct World {
    _tmp: tempfile::TempDir,
    certs: Certs,
    server: GitServer,
    store: Store,
    bridge: String,
    commit: String,
}

fn world(slow: f64) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let bridge = support::bridge_address();
    let server = GitServer::start_with(&repos, &certs, &bridge, slow);
    let repo = Repo::create(&repos, "team/skills.git", false);
    let commit = repo.commit(dir(vec![(
        "skills",
        dir(vec![
            ("review", skill("review", "Review.")),
            ("lint", skill("lint", "Lint.")),
        ]),
    )]));
    let store = Store::open(tmp.path().join("store")).unwrap();
    World {
        _tmp: tmp,
        certs,
        server,
        store,
        bridge,
        commit,
    }
}

impl World {
    fn provisioner(&self, sandbox: Sandbox, limits: Limits) -> Provisioner {
        self.provisioner_on(self.store.clone(), sandbox, limits)
    }

    fn provisioner_on(&self, store: Store, sandbox: Sandbox, limits: Limits) -> Provisioner {
        // The proxy may reach exactly the test server: its name pinned to the bridge address,
        // and only that address opened.
        let mut p = self.server.provisioner(
            &self.certs,
            store,
            "",
            &format!("{}/32", self.bridge),
            &format!("localhost={}", self.bridge),
        );
        p.limits = limits;
        p.with_sandbox(Some(sandbox))
    }

    /// `serve --http` that fetches from this world's git server in helper containers, with
    /// `standby` helpers kept on standby.
    fn serve(&self, standby: &str) -> support::http::Server {
        let ca = self.certs.ca.display().to_string();
        let (cidrs, resolve) = (
            format!("{}/32", self.bridge),
            format!("localhost={}", self.bridge),
        );
        let host = self.server.host();
        support::http::server(&[
            ("ALLOWED_GIT_HOSTS", host.as_str()),
            ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
            ("CLOUD_HARNESS_ALLOW_CIDRS", cidrs.as_str()),
            ("CLOUD_HARNESS_RESOLVE", resolve.as_str()),
            ("CLOUD_HARNESS_STANDBY_HELPERS", standby),
        ])
    }

    /// A `tools/call` of `workspace_open` with this world's toolkit, under `key`.
    fn open_call(&self, key: &str) -> serde_json::Value {
        serde_json::json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": "workspace_open", "arguments": {
                "idempotencyKey": key,
                "toolkits": [{ "kind": "git", "instanceId": "team",
                    "url": self.server.url("team/skills.git"), "ref": self.commit }],
            }},
        })
    }

    fn spec(&self) -> ToolkitSpec {
        cloud_harness_control::toolkit::parse_spec(&format!(
            r#"{{"kind":"git","instanceId":"team","url":"{}","ref":"{}"}}"#,
            self.server.url("team/skills.git"),
            self.commit
        ))
        .unwrap()
    }

    fn objects(&self) -> Vec<PathBuf> {
        fn walk(d: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    walk(&e.path(), out)
                } else {
                    out.push(e.path())
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.store.root().join("objects"), &mut out);
        out.sort();
        out
    }
}

#[test]
fn a_toolkit_is_fetched_through_a_helper_container_and_the_proxy() {
    let Some(sandbox) = sandbox() else { return };
    let w = world(0.0);
    let p = w.provisioner(sandbox.clone(), Limits::default());
    let t = w.spec().resolve(p.hosts()).unwrap();
    let a = p.acquire(&t).unwrap();
    assert_eq!(a.mode, "container");
    assert_eq!(a.record.skills, 2);
    assert_eq!(a.record.key.commit, w.commit);
    assert!(w.server.requests() > 0);
    assert_eq!(helpers(), "", "a helper was left behind");
    let pair = warm_pair();
    // Warm afterwards, without any container.
    assert!(p.acquire(&t).unwrap().warm);

    // A second cold fetch (another store) uses the same network and proxy, with a helper of
    // its own; with the proxy gone, the next one makes a new pair and succeeds.
    let other = |name: &str| {
        let store = Store::open(w._tmp.path().join(name)).unwrap();
        w.provisioner_on(store, sandbox.clone(), Limits::default())
    };
    let a = other("store2").acquire(&t).unwrap();
    assert!(!a.warm && a.mode == "container");
    assert_eq!(warm_pair(), pair, "the warm pair was not reused");
    assert!(Command::new("docker")
        .args(["rm", "-f", &pair.1])
        .status()
        .unwrap()
        .success());
    let a = other("store3").acquire(&t).unwrap();
    assert!(!a.warm && a.mode == "container");
    let again = warm_pair();
    assert_ne!(again.1, pair.1, "a dead proxy was used");
    assert_eq!(helpers(), "");

    // The pair goes with the last handle to it.
    drop((p, sandbox));
    assert_eq!(
        leftovers(),
        (String::new(), String::new()),
        "containers or networks were left behind"
    );
}

#[test]
fn a_pair_left_by_a_dead_process_is_removed_by_the_next() {
    let Some(first) = sandbox() else { return };
    drop(first);
    // What a killed harness leaves: a network owned by a process of this boot and pid
    // namespace that no longer exists.
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let owner = format!("{}/{}/{}", boot.trim(), ns.display(), i32::MAX);
    let name = format!("cloud-harness-prov-test{}", std::process::id());
    let made = Command::new("docker")
        .args(["network", "create", "--internal", "--label"])
        .arg("io.cloud-harness.provisioning=1")
        .arg("--label")
        .arg(format!("io.cloud-harness.provisioning.owner={owner}"))
        .arg(&name)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let _next = sandbox().unwrap();
    let left = Command::new("docker")
        .args(["network", "ls", "-q", "--filter", &format!("name={name}")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&left.stdout).trim(),
        "",
        "the orphan is still there"
    );
}

#[test]
fn a_helper_cannot_reach_anything_but_the_proxy() {
    let Some(sandbox) = sandbox() else { return };
    let w = world(0.0);
    let p = w.provisioner(sandbox.clone(), Limits::default());
    let (transport, egress) = (&p.transport, &p.egress);
    let before = w.server.requests();
    // Straight to the server's address, no proxy: the internal network has no way there.
    let direct = format!("https://{}:{}/team/skills.git", w.bridge, w.server.port);
    let deadline = Instant::now() + Duration::from_secs(60);
    let revision = Revision::Commit(w.commit.clone());
    let out = w._tmp.path().join("helper.pack");
    let err = sandbox
        .fetch_with_env(
            &direct,
            &revision,
            transport,
            egress,
            Limits::default(),
            deadline,
            vec!["HTTPS_PROXY=".into()],
            &out,
        )
        .unwrap_err();
    assert_ne!(err.code, Code::Timeout, "{err}");
    // Through the proxy to a name it does not allow.
    let err = sandbox
        .fetch_with_env(
            "https://unlisted.test/x.git",
            &revision,
            transport,
            egress,
            Limits::default(),
            deadline,
            vec![],
            &out,
        )
        .unwrap_err();
    assert_eq!(err.code, Code::Forbidden, "{err}");
    assert!(
        err.message
            .contains("unlisted.test:443 is not on the allowlist"),
        "{err}"
    );
    assert_eq!(w.server.requests(), before, "nothing reached the server");
    assert_eq!(helpers(), "");
    drop((p, sandbox));
    assert_eq!(leftovers(), (String::new(), String::new()));
}

#[test]
fn a_helper_killed_mid_fetch_publishes_nothing_and_leaves_nothing() {
    let Some(sandbox) = sandbox() else { return };
    // The server answers fetches after 20 s: the helper is surely mid-fetch when it is killed.
    let w = world(20.0);
    let p = w.provisioner(sandbox.clone(), Limits::default());
    let t = w.spec().resolve(p.hosts()).unwrap();
    let before = w.objects();
    let killer = std::thread::spawn(|| {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            let id = owned(&["ps"], &mine(), &["name=cloud-harness-fetch-"]).join(" ");
            if !id.is_empty() {
                std::thread::sleep(Duration::from_millis(1500));
                let killed = Command::new("docker").args(["kill", &id]).status().unwrap();
                return killed.success();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    });
    let err = p.acquire(&t).unwrap_err();
    assert!(killer.join().unwrap(), "the helper was never seen running");
    assert!(
        w.server.requests() > 0,
        "the helper had not started fetching: {err}"
    );
    assert_eq!(err.code, Code::Upstream, "{err}");
    assert_eq!(w.objects(), before, "a killed fetch published objects");
    assert_eq!(helpers(), "");
    drop(p);

    // And a fetch that outlives its time limit is stopped and cleaned up the same way.
    let limits = Limits {
        max_seconds: 3,
        ..Limits::default()
    };
    let p = w.provisioner(sandbox, limits);
    let requests = w.server.requests();
    let err = p.acquire(&t).unwrap_err();
    assert_eq!(err.code, Code::Timeout, "{err}");
    assert!(
        w.server.requests() > requests,
        "the helper had not started fetching"
    );
    assert_eq!(w.objects(), before);
    assert_eq!(helpers(), "");
    drop(p);
    assert_eq!(leftovers(), (String::new(), String::new()));
}

#[test]
fn toolkit_add_reports_the_container_mode() {
    let Some(_) = sandbox() else { return };
    let w = world(0.0);
    let cli = Command::new(BIN)
        .args([
            "toolkit",
            "add",
            "--json",
            "--url",
            &w.server.url("team/skills.git"),
            "--instance-id",
            "team",
            "--ref",
            &w.commit,
        ])
        .env("TOOLKIT_CACHE_ROOT", w.store.root())
        .env("ALLOWED_GIT_HOSTS", w.server.host())
        .env("CLOUD_HARNESS_EXTRA_CA", &w.certs.ca)
        .env("CLOUD_HARNESS_ALLOW_CIDRS", format!("{}/32", w.bridge))
        .env("CLOUD_HARNESS_RESOLVE", format!("localhost={}", w.bridge))
        .env_remove("CLOUD_HARNESS_CONTAINERS")
        .env_remove("HTTPS_PROXY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = cli.id();
    let out = cli.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let added: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(added["mode"], "container");
    assert_eq!(added["skills"], 2);
    assert_eq!(leftovers_of(&owner(pid)), (String::new(), String::new()));
}

#[test]
fn a_server_removes_its_warm_pair_and_helpers_on_standby_when_it_stops() {
    let Some(_) = sandbox() else { return };
    let w = world(0.0);
    let mut server = w.serve("2");
    let theirs = owner(server.child.id());
    // Made at start-up, before any fetch: the pair and two helpers waiting for a job.
    let standing = || owned(&["ps"], &theirs, &["name=cloud-harness-fetch-"]);
    support::wait::until("two helpers on standby", Duration::from_secs(30), || {
        standing().len() == 2
    });
    let before = standing();
    let (network, _) = warm_pair_of(&theirs);
    let session = support::http::legacy_session(server.addr);
    let call = w.open_call("warm");
    let answer = support::http::answer_of(&support::http::raw(
        server.addr,
        &call.to_string(),
        &[("Mcp-Session-Id", session.as_str())],
    ));
    let result = &answer["result"]["structuredContent"];
    assert_eq!(result["toolkits"][0]["mode"], "container", "{answer}");
    // The fetch took one of them (gone now) and another took its place, on the same network.
    support::wait::until("the standby filled again", Duration::from_secs(30), || {
        standing().len() == 2
    });
    let after = standing();
    assert_eq!(
        before.iter().filter(|h| !after.contains(h)).count(),
        1,
        "{before:?} -> {after:?}"
    );
    assert_eq!(warm_pair_of(&theirs).0, network);
    stop_leaves_nothing(&mut server, "stopped after a fetch");
}

/// Sends SIGTERM to `server`, which exits 0 and leaves none of its provisioning network, proxy
/// or helpers behind.
fn stop_leaves_nothing(server: &mut support::http::Server, when: &str) {
    let theirs = owner(server.child.id());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(server.child.wait().unwrap().success(), "{when}");
    assert_eq!(
        leftovers_of(&theirs),
        (String::new(), String::new()),
        "{when}, the server left these: {}",
        server.log.lock().unwrap()
    );
}

/// A helper on standby is made as one made for its fetch, serves exactly one fetch, and is
/// held to the same rules: only the proxy is reachable, refusals are the proxy's.
#[test]
fn helpers_on_standby_are_hardened_serve_one_fetch_and_go_with_their_sandbox() {
    let Some(sandbox) = sandbox() else { return };
    let w = world(0.0);
    let p = w.provisioner(sandbox.clone(), Limits::default());
    sandbox.keep_warm(2, &p.egress, p.limits);
    let standing = || owned(&["ps"], &mine(), &["name=cloud-harness-fetch-"]);
    support::wait::until("two helpers on standby", Duration::from_secs(30), || {
        standing().len() == 2
    });
    let (network, _) = warm_pair();
    for helper in standing() {
        let inspect = Command::new("docker")
            .args(["inspect", &helper])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
        let (host, config) = (&v[0]["HostConfig"], &v[0]["Config"]);
        assert_eq!(host["CapDrop"], serde_json::json!(["ALL"]), "{helper}");
        assert_eq!(host["ReadonlyRootfs"], true);
        assert_eq!(
            host["SecurityOpt"],
            serde_json::json!(["no-new-privileges"])
        );
        assert_eq!(host["NetworkMode"], network.as_str());
        assert_eq!(host["Dns"], serde_json::json!(["127.0.0.1"]));
        assert_eq!(host["PidsLimit"], 128);
        assert_eq!(config["User"], "65534:65534");
        assert_eq!(
            config["Cmd"],
            serde_json::json!(["/cloud-harness", "fetch-pack"]),
            "waiting for a job, with none given yet"
        );
        assert_eq!(v[0]["State"]["Running"], true);
    }

    let t = w.spec().resolve(p.hosts()).unwrap();
    let before = standing();
    let a = p.acquire(&t).unwrap();
    assert_eq!(a.mode, "container");
    assert_eq!(a.record.skills, 2);
    support::wait::until("the standby filled again", Duration::from_secs(30), || {
        standing().len() == 2
    });
    let after = standing();
    let used: Vec<_> = before.iter().filter(|h| !after.contains(h)).collect();
    assert_eq!(
        used.len(),
        1,
        "one helper served the fetch: {before:?} -> {after:?}"
    );

    // A refusal through a helper from the standby is the proxy's, and nothing is reached.
    let requests = w.server.requests();
    let err = sandbox
        .fetch(
            "https://unlisted.test/x.git",
            &Revision::Commit(w.commit.clone()),
            &p.transport,
            &p.egress,
            Limits::default(),
            Instant::now() + Duration::from_secs(60),
            &w._tmp.path().join("refused"),
        )
        .err()
        .expect("refused");
    assert_eq!(err.code, Code::Forbidden, "{err}");
    assert!(err.message.contains("not on the allowlist"), "{err}");
    assert_eq!(w.server.requests(), requests);

    // The standby goes with the last handle, before its network.
    drop((p, sandbox));
    assert_eq!(leftovers(), (String::new(), String::new()));
}

/// SIGTERM while a fetch runs in a helper: the server exits 0 within its drain and takes the
/// busy helper, those on standby, the proxy and the network with it.
#[test]
fn a_server_stopped_mid_fetch_leaves_no_helper_proxy_or_network() {
    let Some(_) = sandbox() else { return };
    // Every answer of the git server waits 60 s: the fetch is under way at the SIGTERM.
    let w = world(60.0);
    let mut server = w.serve("1");
    let theirs = owner(server.child.id());
    let addr = server.addr;
    let session = support::http::legacy_session(addr);
    let call = w.open_call("slow");
    let open = std::thread::spawn(move || {
        let _ = support::http::raw(
            addr,
            &call.to_string(),
            &[("Mcp-Session-Id", session.as_str())],
        );
    });
    support::wait::until(
        "the helper asked the git server",
        Duration::from_secs(30),
        || w.server.requests() > 0,
    );
    assert!(!helpers_of(&theirs).is_empty());
    let asked = Instant::now();
    stop_leaves_nothing(&mut server, "stopped mid-fetch");
    assert!(
        asked.elapsed() < Duration::from_secs(25),
        "{:?}",
        asked.elapsed()
    );
    let _ = open.join();
}

fn helpers_of(owner: &str) -> Vec<String> {
    owned(&["ps", "-a"], owner, &["name=cloud-harness-fetch-"])
}

/// SIGTERM while the server is still making its provisioning network, proxy and helpers at
/// start-up (a service stopped right after it started): it exits 0 and leaves none of them.
#[test]
fn a_server_stopped_during_its_start_up_warm_up_leaves_nothing() {
    let Some(_) = sandbox() else { return };
    let w = world(0.0);
    // Stopped at each point of the warm-up: engine checks, image, network, proxy, helpers.
    for wait in (0..9).map(|i| i * 200) {
        let mut server = w.serve("2");
        std::thread::sleep(Duration::from_millis(wait));
        stop_leaves_nothing(&mut server, &format!("stopped {wait} ms after it listened"));
    }
}

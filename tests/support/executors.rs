//! A harness for executor tests: a warm toolkit with one skill (and scripts that print and
//! that wait), workspaces on a given backend, and the ways tests drive and inspect them.

use cloud_harness_executor::{Kind, Settings};
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::{OpenRequest, RunRequest, Workspaces};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

pub fn available(kind: Kind) -> bool {
    let root = nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists();
    let backend = super::executor_backend(kind.as_str());
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

pub struct Harness {
    pub kind: Kind,
    pub workspaces: Arc<Workspaces>,
    pub kit: cloud_harness_control::toolkit::ToolkitSpec,
    /// Last: removed once the workspaces (and their mounts) are gone.
    pub tmp: tempfile::TempDir,
}

pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

pub fn harness(kind: Kind) -> Harness {
    harness_with(Settings::with_kind(kind), |store| {
        super::warm_provisioner(store)
    })
}

pub fn harness_with(
    settings: Settings,
    provisioner: impl FnOnce(&Store) -> cloud_harness_provision::Provisioner,
) -> Harness {
    let kind = match settings.choice {
        cloud_harness_executor::Choice::Only(kind) => kind,
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
    // For the runs' tests (tests/executor_runs.rs, tests/executor.rs): a run that leaves a
    // daemon behind, one that lists the processes of its user, one that tries the agent, the
    // limits' passers, the descriptors a run has, egress through the proxy.
    let scripts: &[(&str, &str)] = &[
        ("hello.sh", "echo hello from $(pwd)\n"),
        ("long.sh", "sleep 120\n"),
        (
            "leave.sh",
            "setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 &\necho left\n",
        ),
        ("procs.py", include_str!("../executor/procs.py")),
        ("agent.py", include_str!("../executor/agent.py")),
        ("spin.sh", "while :; do :; done\n"),
        ("loud.sh", "head -c 100000 /dev/zero | tr '\\0' x\n"),
        (
            "fds.py",
            "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n",
        ),
        ("forks.py", include_str!("../executor/forks.py")),
        ("egress.py", include_str!("../executor/egress.py")),
        // Two processes, each within a run's memory (256 MiB in these tests), together past
        // the executor's: pages touched, so they are really held.
        (
            "crowd.sh",
            "hold='b = bytearray(160 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(3)'\npython3 -c \"$hold\" & python3 -c \"$hold\" & wait\necho crowded\n",
        ),
        (
            "alloc.py",
            "b = bytearray(512 << 20)\nprint('allocated', len(b))\n",
        ),
    ];
    for (name, text) in scripts {
        write(&src.join("alpha/scripts").join(name), text);
    }
    let kit = super::warm_toolkit(&store, &src, "kit");
    // Prewarmed as under `serve`: the walker is the real binary.
    let workspaces =
        Workspaces::with_executors(tmp.path().join("home"), provisioner(&store), true, settings)
            .unwrap()
            .prewarming(env!("CARGO_BIN_EXE_cloud-harness").into());
    Harness {
        tmp,
        kind,
        workspaces: Arc::new(workspaces),
        kit,
    }
}

impl Harness {
    pub fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    pub fn open(&self, key: &str) -> Value {
        self.workspaces
            .open(OpenRequest {
                repository_url: None,
                idempotency_key: key.into(),
                toolkits: vec![self.kit.clone()],
                allow_toolkit_workspace_changes: false,
                idle_pause: true,
            })
            .unwrap()
    }

    /// `cloud-harness exec WS -- ARGV`, with `stdin`; exit status, stdout, stderr.
    pub fn exec(&self, ws: &str, argv: &[&str], stdin: &[u8]) -> (i32, String, String) {
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

    pub fn approve(&self, digest: &Value) {
        write(
            &self.home().join("operator.json"),
            &json!({ "approvedSkills": [digest] }).to_string(),
        );
    }

    pub fn run(&self, ws: &str, script: &str) -> cloud_harness_error::Result<Value> {
        let ws = self.workspaces.get(ws)?;
        let home = self.home();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(ws.run(
            &home,
            "test",
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

    /// The outcome of `script`, which must have run (whatever its exit status).
    pub fn ran(&self, ws: &str, script: &str) -> Value {
        self.run(ws, script)
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// Nothing of this harness's workspaces is left: no container, no mount, no folder.
    pub fn assert_nothing_left(&self) {
        let home = self.home();
        // Of the workspaces: the folder of them all is a mount of the server's own while it
        // runs (as root, with bubblewrap).
        let folder = std::fs::canonicalize(home.join("workspaces")).unwrap();
        let left: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|line| {
                let point = Path::new(line.split(' ').nth(4).unwrap_or_default());
                point.starts_with(&home) && point != folder
            })
            .map(str::to_owned)
            .collect();
        assert!(
            left.is_empty(),
            "mounts left under {}: {left:#?}",
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

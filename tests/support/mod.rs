//! Test support: a local HTTPS git server with its own CA, and git repositories built object
//! by object, so that hostile trees (names git itself would refuse) can be served too.
#![allow(dead_code)]

pub mod acquisition;
pub mod api;
pub mod executors;
pub mod http;
pub mod latency;
pub mod postgres;
pub mod procs;
pub mod s3;
pub mod wait;

use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_control::toolkit::{self, ToolkitSpec};
use cloud_harness_provision::egress::EgressPolicy;
use cloud_harness_provision::fetch::Transport;
use cloud_harness_provision::index::{BundleIndex, BundleKey, BundleRecord};
use cloud_harness_provision::staging::Limits;
use cloud_harness_provision::Provisioner;
use cloud_harness_store::cas::{Limits as ImportLimits, Store};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// This machine's address on the Docker bridge, where containers find a server on the host.
pub fn bridge_address() -> String {
    let out = run(Command::new("ip").args(["-4", "-o", "addr", "show", "docker0"]));
    let text = String::from_utf8_lossy(&out).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .expect("docker0 has an IPv4 address")
        .to_owned()
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A throwaway CA and a server certificate for localhost and 127.0.0.1.
pub struct Certs {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Certs {
    pub fn new(dir: &Path) -> Certs {
        std::fs::create_dir_all(dir).unwrap();
        let p = |n: &str| dir.join(n);
        run(Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=cloud-harness test CA",
            ])
            .args([
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign",
            ])
            .arg("-keyout")
            .arg(p("ca.key"))
            .arg("-out")
            .arg(p("ca.pem"))
            .stderr(Stdio::null()));
        run(Command::new("openssl")
            .args([
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=localhost",
            ])
            .arg("-keyout")
            .arg(p("server.key"))
            .arg("-out")
            .arg(p("server.csr"))
            .stderr(Stdio::null()));
        std::fs::write(p("ext.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
            .arg("-in")
            .arg(p("server.csr"))
            .arg("-CA")
            .arg(p("ca.pem"))
            .arg("-CAkey")
            .arg(p("ca.key"))
            .arg("-out")
            .arg(p("server.pem"))
            .arg("-extfile")
            .arg(p("ext.cnf"))
            .stderr(Stdio::null()));
        Certs {
            ca: p("ca.pem"),
            cert: p("server.pem"),
            key: p("server.key"),
        }
    }
}

/// `git http-backend` behind TLS on 127.0.0.1, serving every repository under `root`.
pub struct GitServer {
    child: Option<Child>,
    pub port: u16,
    pub log: PathBuf,
}

impl GitServer {
    pub fn start(root: &Path, certs: &Certs) -> GitServer {
        GitServer::start_on(root, certs, "127.0.0.1")
    }

    /// Listening on `bind`, an address of this machine (the Docker bridge's, for helpers).
    pub fn start_on(root: &Path, certs: &Certs, bind: &str) -> GitServer {
        GitServer::start_with(root, certs, bind, 0.0)
    }

    /// As `start_on`, answering each fetch after `slow` seconds.
    pub fn start_with(root: &Path, certs: &Certs, bind: &str, slow: f64) -> GitServer {
        let log = root.with_extension("requests.log");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/git_https_server.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--root")
            .arg(root)
            .arg("--cert")
            .arg(&certs.cert)
            .arg("--key")
            .arg(&certs.key)
            .arg("--log")
            .arg(&log)
            .arg("--bind")
            .arg(bind)
            .arg("--slow")
            .arg(slow.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the test git server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("server said {line:?}"));
        GitServer {
            child: Some(child),
            port,
            log,
        }
    }

    pub fn host(&self) -> String {
        format!("localhost:{}", self.port)
    }

    pub fn url(&self, repo: &str) -> String {
        format!("https://localhost:{}/{repo}", self.port)
    }

    /// A provisioner that may fetch from this server, in-process: its host allowed
    /// (`rewrites` applied first), its CA trusted, the egress proxy opened for `cidrs` and
    /// given `pins` (`host=address`).
    pub fn provisioner(
        &self,
        certs: &Certs,
        store: Store,
        rewrites: &str,
        cidrs: &str,
        pins: &str,
    ) -> Provisioner {
        let hosts = HostPolicy::new(&self.host(), rewrites).unwrap();
        let transport = Transport {
            extra_ca: Some(std::fs::read(&certs.ca).unwrap()),
            proxy: None,
            timeout: None,
        };
        Provisioner::new(
            store,
            transport,
            Limits::default(),
            EgressPolicy::new(hosts, cidrs, pins).unwrap(),
        )
    }

    pub fn requests(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a tree entry holds.
pub enum Node {
    File(Vec<u8>),
    Exec(Vec<u8>),
    Link(String),
    Dir(Vec<(Vec<u8>, Node)>),
    /// A gitlink (submodule) to this commit id.
    Submodule(String),
    /// A tree already written (see [`Repo::tree`]): one folder named many times costs one.
    Tree(String),
}

pub fn file(s: &str) -> Node {
    Node::File(s.as_bytes().to_vec())
}

pub fn dir(entries: Vec<(&str, Node)>) -> Node {
    Node::Dir(
        entries
            .into_iter()
            .map(|(n, e)| (n.as_bytes().to_vec(), e))
            .collect(),
    )
}

pub fn skill(name: &str, body: &str) -> Node {
    dir(vec![(
        "SKILL.md",
        file(&format!(
            "---\nname: {name}\ndescription: The {name} skill.\n---\n{body}\n"
        )),
    )])
}

/// Writes `node` at `path` as plain files (a folder for a toolkit made without git).
pub fn materialize(path: &Path, node: &Node) {
    use std::os::unix::fs::PermissionsExt;
    match node {
        Node::File(b) => std::fs::write(path, b).unwrap(),
        Node::Exec(b) => {
            std::fs::write(path, b).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Node::Link(t) => std::os::unix::fs::symlink(t, path).unwrap(),
        Node::Dir(entries) => {
            std::fs::create_dir_all(path).unwrap();
            for (name, e) in entries {
                use std::os::unix::ffi::OsStrExt;
                materialize(&path.join(std::ffi::OsStr::from_bytes(name)), e);
            }
        }
        Node::Submodule(_) => panic!("a submodule is git's"),
        Node::Tree(_) => panic!("a tree by id is git's"),
    }
}

/// A bare repository built object by object.
pub struct Repo {
    pub path: PathBuf,
    /// Blob ids by content: a tree of 30,000 identical files hashes one blob.
    blobs: std::cell::RefCell<std::collections::HashMap<Vec<u8>, String>>,
}

impl Repo {
    pub fn create(root: &Path, name: &str, sha256: bool) -> Repo {
        let path = root.join(name);
        let mut init = Command::new("git");
        init.args(["init", "-q", "--bare", "-b", "main"]);
        if sha256 {
            init.arg("--object-format=sha256");
        }
        run(init.arg(&path));
        // GitHub serves any reachable commit by id; so does this server.
        run(Command::new("git").arg("--git-dir").arg(&path).args([
            "config",
            "uploadpack.allowAnySHA1InWant",
            "true",
        ]));
        Repo {
            path,
            blobs: Default::default(),
        }
    }

    fn git(&self) -> Command {
        let mut c = Command::new("git");
        c.arg("--git-dir").arg(&self.path);
        c.env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid");
        c
    }

    fn hash(&self, kind: &str, bytes: &[u8], literally: bool) -> String {
        if kind == "blob" {
            if let Some(id) = self.blobs.borrow().get(bytes) {
                return id.clone();
            }
        }
        let id = self.hash_uncached(kind, bytes, literally);
        if kind == "blob" {
            self.blobs.borrow_mut().insert(bytes.to_vec(), id.clone());
        }
        id
    }

    fn hash_uncached(&self, kind: &str, bytes: &[u8], literally: bool) -> String {
        let mut cmd = self.git();
        cmd.args(["hash-object", "-w", "-t", kind, "--stdin"]);
        if literally {
            cmd.arg("--literally");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Writes `node` and returns (mode, id).
    fn write(&self, node: &Node) -> (&'static str, String) {
        match node {
            Node::File(b) => ("100644", self.hash("blob", b, false)),
            Node::Exec(b) => ("100755", self.hash("blob", b, false)),
            Node::Link(t) => ("120000", self.hash("blob", t.as_bytes(), false)),
            Node::Submodule(id) => ("160000", id.clone()),
            Node::Tree(id) => ("40000", id.clone()),
            Node::Dir(entries) => {
                let mut items: Vec<(Vec<u8>, &str, String)> = entries
                    .iter()
                    .map(|(name, n)| {
                        let (mode, id) = self.write(n);
                        (name.clone(), mode, id)
                    })
                    .collect();
                // git's order: a directory sorts as `name/`.
                items.sort_by_key(|(name, mode, _)| {
                    let mut k = name.clone();
                    if *mode == "40000" {
                        k.push(b'/');
                    }
                    k
                });
                let mut raw = Vec::new();
                for (name, mode, id) in items {
                    raw.extend_from_slice(mode.as_bytes());
                    raw.push(b' ');
                    raw.extend_from_slice(&name);
                    raw.push(0);
                    raw.extend_from_slice(&hex_decode(&id));
                }
                ("40000", self.hash("tree", &raw, true))
            }
        }
    }

    /// Writes the tree `node` and returns its id, for [`Node::Tree`].
    pub fn tree(&self, node: &Node) -> String {
        self.write(node).1
    }

    /// Commits `root` on main and returns the commit id.
    pub fn commit(&self, root: Node) -> String {
        self.commit_to("refs/heads/main", root)
    }

    /// Commits `root` on top of main to `refs/forks/NAME` alone, main unchanged, and hides
    /// `refs/forks/` from the refs the server advertises (`uploadpack.hideRefs`): a commit
    /// only a fork has, which the server still serves by its id, as the large hosts do.
    pub fn commit_in_fork(&self, name: &str, root: Node) -> String {
        run(self
            .git()
            .args(["config", "uploadpack.hideRefs", "refs/forks/"]));
        let main = self.head("refs/heads/main");
        let fork = format!("refs/forks/{name}");
        run(self.git().args(["update-ref", &fork, &main]));
        self.commit_to(&fork, root)
    }

    /// Points `refname` at `commit` (a branch made at a fork's commit, say).
    pub fn set_ref(&self, refname: &str, commit: &str) {
        run(self.git().args(["update-ref", refname, commit]));
    }

    fn head(&self, refname: &str) -> String {
        let out = self
            .git()
            .args(["rev-parse", "-q", "--verify", refname])
            .output()
            .unwrap()
            .stdout;
        String::from_utf8(out).unwrap().trim().to_owned()
    }

    /// Commits `root` on top of `refname` (if it is there) and moves `refname` to it.
    pub fn commit_to(&self, refname: &str, root: Node) -> String {
        self.commit_at(refname, root, None)
    }

    /// [`Repo::commit_to`], dated `days` days ago (author and committer).
    pub fn commit_days_ago(&self, refname: &str, root: Node, days: u64) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        self.commit_at(refname, root, Some(now - days * 86_400))
    }

    fn commit_at(&self, refname: &str, root: Node, date: Option<u64>) -> String {
        let (_, tree) = self.write(&root);
        let mut cmd = self.git();
        cmd.args(["commit-tree", &tree, "-m", "commit"]);
        if let Some(date) = date {
            let date = format!("@{date} +0000");
            cmd.env("GIT_AUTHOR_DATE", &date)
                .env("GIT_COMMITTER_DATE", &date);
        }
        let parent = self.head(refname);
        if !parent.is_empty() {
            cmd.args(["-p", &parent]);
        }
        let id = String::from_utf8(run(&mut cmd)).unwrap().trim().to_owned();
        run(self.git().args(["update-ref", refname, &id]));
        id
    }

    pub fn tag(&self, name: &str, commit: &str) {
        run(self.git().args(["tag", name, commit]));
    }
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The host toolkits served by [`warm_toolkit`] claim to come from; nothing listens there.
pub const WARM_HOST: &str = "bench.invalid";

/// The skill folders in `src` as an owner toolkit `name` already in the store and the bundle
/// index, as a warm start finds it: opening a workspace with it needs no network.
pub fn warm_toolkit(store: &Store, src: &Path, name: &str) -> ToolkitSpec {
    let bundle = store
        .import_dir(src, &ImportLimits::default())
        .unwrap()
        .digest;
    let mut writer = store.writer().unwrap();
    let manifest = writer
        .put_blob(format!("{{\"warm\":\"{name}\"}}").as_bytes())
        .unwrap();
    writer.commit().unwrap();
    let url = format!("https://{WARM_HOST}/{name}.git");
    let commit = "0123456789abcdef0123456789abcdef01234567".to_owned();
    let spec = toolkit::parse_spec(&format!(
        r#"{{"kind":"git","instanceId":"{name}","url":"{url}","ref":"{commit}"}}"#
    ))
    .unwrap();
    let t = spec
        .resolve(&HostPolicy::new(WARM_HOST, "").unwrap())
        .unwrap();
    let skills = std::fs::read_dir(src).unwrap().count();
    BundleIndex::open(store)
        .put(&BundleRecord {
            key: BundleKey::new(&t, &commit),
            bundle,
            manifest,
            skills,
            instance_id: name.into(),
            preset: None,
            fetched_url: url,
            object_format: "sha1".into(),
            requested: "commit".into(),
            warnings: vec![],
            skipped: vec![],
            acquired_at: 0,
            pack: None,
            reach: None,
        })
        .unwrap();
    spec
}

/// A provisioner for warm toolkits only: any fetch would fail (nothing listens at
/// `bench.invalid`, and no helper container is used).
pub fn warm_provisioner(store: &Store) -> Provisioner {
    warm_provisioner_with(store, "", "")
}

/// The same, with egress exceptions (`CLOUD_HARNESS_ALLOW_CIDRS`, `CLOUD_HARNESS_RESOLVE`).
pub fn warm_provisioner_with(store: &Store, cidrs: &str, pins: &str) -> Provisioner {
    let hosts = HostPolicy::new(WARM_HOST, "").unwrap();
    Provisioner::new(
        store.clone(),
        Transport::default(),
        Limits::default(),
        EgressPolicy::new(hosts, cidrs, pins).unwrap(),
    )
}

/// Whether an executor backend (`docker`: an engine answers; `bwrap`: bubblewrap runs) is on
/// this machine.
pub fn executor_backend(kind: &str) -> bool {
    let (program, arg) = if kind == "docker" {
        ("docker", "info")
    } else {
        ("bwrap", "--version")
    };
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The digest of the skill `name` in a `workspace_open` result.
pub fn skill_digest(result: &serde_json::Value, name: &str) -> serde_json::Value {
    result["skills"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no skill {name} in {result}"))["digest"]
        .clone()
}

/// A finished command's exit code and its output (stdout, then stderr).
pub fn code_and_output(out: std::process::Output) -> (i32, String) {
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `len` bytes that do not compress (xorshift from `seed`, never 0): a pack or a git object
/// holding them is as large as they are.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `n` generated skill folders named `<prefix>skill-NN`, 5 files each (SKILL.md, two
/// references, a script, an asset; 14 KB of pseudo-random letters), for the benchmarks.
/// `seed` carries on between calls, so every call's bytes are new.
pub fn generated_skills(prefix: &str, n: usize, seed: &mut u64) -> Vec<(Vec<u8>, Node)> {
    let mut bytes = |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                b'a' + (*seed % 26) as u8
            })
            .collect()
    };
    (0..n)
        .map(|i| {
            let name = format!("{prefix}skill-{i:02}");
            let md = format!("---\nname: {name}\ndescription: Skill number {i}.\n---\n# {name}\n");
            let node = Node::Dir(vec![
                (b"SKILL.md".to_vec(), Node::File(md.into_bytes())),
                (
                    b"references".to_vec(),
                    Node::Dir(vec![
                        (b"guide.md".to_vec(), Node::File(bytes(6000))),
                        (b"api.md".to_vec(), Node::File(bytes(3000))),
                    ]),
                ),
                (
                    b"scripts".to_vec(),
                    Node::Dir(vec![(b"run.sh".to_vec(), Node::Exec(bytes(800)))]),
                ),
                (
                    b"assets".to_vec(),
                    Node::Dir(vec![(b"template.txt".to_vec(), Node::File(bytes(4000)))]),
                ),
            ]);
            (name.into_bytes(), node)
        })
        .collect()
}

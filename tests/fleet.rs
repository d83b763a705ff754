//! Two runners, one store of record: each runner has its own local store, and both share one
//! bucket of a real S3-compatible server on loopback (`s3s-fs`). What one runner acquired from
//! git, the other opens without git; a bad object in the bucket is refused; an outage of
//! object storage or a runner killed mid-publication loses nothing and never leaves a record
//! naming a missing object.

#[path = "fleet/bucket.rs"]
mod bucket;
#[path = "fleet/packs.rs"]
mod packs;
use crate::support;

use cloud_harness_provision::index::{BundleKey, BundleRecord};
use cloud_harness_provision::{Acquired, Provisioner};
use cloud_harness_store::cas::{materialize, Digest, Kind, Store, Tree};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::acquisition::{git, world, World};
use support::s3::S3Server;
use support::{file, Node, Repo};

const PREFIX: &str = "fleet";

/// A toolkit of `skills` skills, each with `files` reference files besides its SKILL.md.
fn toolkit(skills: usize, files: usize, salt: &str) -> Node {
    let folder = |i: usize| {
        let name = format!("skill-{i:03}");
        let mut entries = vec![(
            b"SKILL.md".to_vec(),
            file(&format!(
                "---\nname: {name}\ndescription: skill {i} {salt}\n---\nbody\n"
            )),
        )];
        for f in 0..files {
            entries.push((
                format!("ref-{f}.md").into_bytes(),
                file(&format!("{salt} {i} {f}\n")),
            ));
        }
        (name.into_bytes(), Node::Dir(entries))
    };
    Node::Dir(vec![(
        b"skills".to_vec(),
        Node::Dir((0..skills).map(folder).collect()),
    )])
}

struct Fleet {
    w: World,
    s3: S3Server,
}

fn fleet() -> Option<Fleet> {
    if !support::s3::available() {
        eprintln!("skipped: s3s-fs is not installed");
        return None;
    }
    let w = world();
    let s3 = S3Server::start(&w.tmp.path().join("s3"));
    Some(Fleet { w, s3 })
}

impl Fleet {
    /// A runner: its own local store under `name`, the shared bucket.
    fn runner(&self, name: &str) -> Provisioner {
        self.runner_with(name, true)
    }

    /// A runner that publishes and downloads bundles with their packs, or object by object
    /// only (`TOOLKIT_STORE_PACKS=false`).
    fn runner_with(&self, name: &str, packs: bool) -> Provisioner {
        let store = Store::open(self.w.tmp.path().join(name)).unwrap();
        self.w
            .server
            .provisioner(&self.w.certs, store, "", "127.0.0.0/8", "")
            .with_remote(Some(self.s3.remote(PREFIX).with_packs(packs)))
    }

    fn repo(&self, name: &str, root: Node) -> (String, String) {
        let repo = Repo::create(&self.w.repos, name, false);
        let commit = repo.commit(root);
        (self.w.server.url(name), commit)
    }

    /// The records in the bucket.
    fn records(&self) -> Vec<BundleRecord> {
        self.s3
            .keys(&format!("{PREFIX}/index/bundles"))
            .iter()
            .map(|k| serde_json::from_slice(&fs::read(self.s3.file(k)).unwrap()).unwrap())
            .collect()
    }

    /// Objects a record names that the bucket lacks.
    fn missing_from_bucket(&self, record: &BundleRecord) -> Vec<String> {
        let object = |kind: &str, d: &Digest| {
            let hex = d.hex();
            self.s3.file(&format!(
                "{PREFIX}/objects/{kind}/{}/{}",
                &hex[..2],
                &hex[2..]
            ))
        };
        let mut missing = Vec::new();
        if let Some(pack) = record.pack.filter(|p| !object("pack", &p.digest).exists()) {
            missing.push(format!("pack {}", pack.digest));
        }
        if !object("blob", &record.manifest).exists() {
            missing.push(format!("blob {}", record.manifest));
        }
        let mut trees = vec![record.bundle];
        while let Some(t) = trees.pop() {
            let Ok(bytes) = fs::read(object("tree", &t)) else {
                missing.push(format!("tree {t}"));
                continue;
            };
            for e in Tree::decode(&bytes).unwrap().entries() {
                match e.kind {
                    Kind::Tree => trees.push(e.digest),
                    _ if !object("blob", &e.digest).exists() => {
                        missing.push(format!("blob {}", e.digest))
                    }
                    _ => {}
                }
            }
        }
        missing
    }
}

fn acquire(p: &Provisioner, url: &str, commit: &str) -> cloud_harness_error::Result<Acquired> {
    let spec =
        cloud_harness_control::toolkit::ToolkitSpec::Git(git(url.into(), "team", Some(commit)));
    p.acquire(&spec.resolve(p.hosts())?)
}

/// Every file of a materialized bundle with its bytes.
fn contents(store: &Store, bundle: &Digest, at: &Path) -> Vec<(String, Vec<u8>)> {
    materialize(store, bundle, at).unwrap();
    let mut out = Vec::new();
    let mut dirs = vec![at.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                let rel = p.strip_prefix(at).unwrap().display().to_string();
                out.push((rel, fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn object_files(store: &Store) -> usize {
    let mut n = 0;
    for kind in ["blob", "tree"] {
        for shard in fs::read_dir(store.root().join("objects").join(kind))
            .unwrap()
            .flatten()
        {
            n += fs::read_dir(shard.path()).unwrap().count();
        }
    }
    n
}

#[test]
fn a_second_runner_opens_what_the_first_acquired_without_git() {
    let Some(mut f) = fleet() else { return };
    let (url, commit) = f.repo("team/skills.git", toolkit(12, 3, "shared"));
    let a = f.runner("store-a");
    let got_a = acquire(&a, &url, &commit).unwrap();
    assert_eq!((got_a.warm, got_a.mode), (false, "in-process"));
    let records = f.records();
    assert_eq!(records.len(), 1, "one record published");
    assert_eq!(records[0].bundle, got_a.record.bundle);
    assert!(f.missing_from_bucket(&records[0]).is_empty());

    let requests = f.w.server.requests();
    f.w.server.stop();
    let b = f.runner("store-b");
    let got_b = acquire(&b, &url, &commit).unwrap();
    assert_eq!((got_b.warm, got_b.mode), (true, "remote"));
    assert!(got_b.bytes > 0, "the bundle's objects were downloaded");
    assert_eq!(got_b.record.bundle, got_a.record.bundle);
    assert_eq!(got_b.record.skills, 12);
    assert_eq!(f.w.server.requests(), requests, "no git connection at all");
    let report = b.store.verify().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        contents(
            &b.store,
            &got_b.record.bundle,
            &f.w.tmp.path().join("out-b")
        ),
        contents(
            &a.store,
            &got_a.record.bundle,
            &f.w.tmp.path().join("out-a")
        ),
    );
    // Now it is B's own: a local warm start, object storage not asked.
    f.s3.stop();
    let again = acquire(&b, &url, &commit).unwrap();
    assert_eq!((again.warm, again.mode), (true, "warm"));
}

#[test]
fn a_corrupted_object_in_the_bucket_is_refused_and_named() {
    // Object by object (a bundle's pack, which would stand in, has tests of its own).
    let Some(mut f) = fleet() else { return };
    let (url, commit) = f.repo("team/skills.git", toolkit(4, 2, "corrupt"));
    acquire(&f.runner_with("store-a", false), &url, &commit).unwrap();
    let blob =
        f.s3.keys(&format!("{PREFIX}/objects/blob"))
            .into_iter()
            .next()
            .unwrap();
    fs::write(f.s3.file(&blob), b"not what the name says\n").unwrap();
    let hex: String = blob
        .rsplit('/')
        .take(2)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let good = |f: &Fleet| Digest::of(&fs::read(f.s3.file(&blob)).unwrap()).hex() == hex;

    // With git there, a runner falls back to it; its create-only puts cannot overwrite the
    // bad object, but once an operator deletes it, the next publication restores it.
    let c = acquire(&f.runner_with("store-c", false), &url, &commit).unwrap();
    assert_eq!(c.mode, "in-process");
    assert!(!good(&f));
    fs::remove_file(f.s3.file(&blob)).unwrap();
    let d = acquire(&f.runner_with("store-d", false), &url, &commit).unwrap();
    assert_eq!(d.mode, "in-process");
    assert!(good(&f), "publication put the object back");
    fs::write(f.s3.file(&blob), b"tampered with again\n").unwrap();

    // Without git, the refusal is the answer.
    f.w.server.stop();
    let b = f.runner_with("store-b", false);
    let err = acquire(&b, &url, &commit).unwrap_err();
    assert!(err.message.contains(&hex), "{}", err.message);
    assert!(err.message.contains("refused"), "{}", err.message);
    assert_eq!(
        err.details["object"],
        format!("sha256:{hex}"),
        "{}",
        err.details
    );
    assert!(
        err.details["git"].is_string(),
        "git was tried: {}",
        err.details
    );
    // Nothing of the bundle entered B's store, the good objects included, and no record.
    assert_eq!(object_files(&b.store), 0);
    assert!(b.index().list().unwrap().is_empty());
    assert!(b.store.verify().unwrap().problems.is_empty());
}

#[test]
fn an_outage_of_object_storage_loses_nothing() {
    let Some(mut f) = fleet() else { return };
    let (url, first) = f.repo("team/one.git", toolkit(3, 1, "one"));
    let a = f.runner("store-a");
    let b = f.runner("store-b");
    acquire(&a, &url, &first).unwrap();
    assert_eq!(acquire(&b, &url, &first).unwrap().mode, "remote");

    f.s3.stop();
    // B's local warm start needs nothing but its own store.
    assert_eq!(acquire(&b, &url, &first).unwrap().mode, "warm");
    // A new acquisition on A succeeds from git, its publication queued.
    let (url2, second) = f.repo("team/two.git", toolkit(3, 1, "two"));
    let got = acquire(&a, &url2, &second).unwrap();
    assert_eq!(got.mode, "in-process");
    let pass = a.publish_pending().unwrap();
    assert_eq!((pass.published, pass.failed), (0, 1));

    f.s3.resume();
    assert_eq!(f.records().len(), 1, "the second is not published yet");
    let pass = a.publish_pending().unwrap();
    assert_eq!((pass.published, pass.failed), (1, 0));
    assert_eq!(
        a.publish_pending().unwrap().published,
        0,
        "the queue is empty"
    );
    f.w.server.stop();
    let c = f.runner("store-c");
    let got_c = acquire(&c, &url2, &second).unwrap();
    assert_eq!(
        (got_c.mode, got_c.record.bundle),
        ("remote", got.record.bundle)
    );
}

#[test]
fn a_runner_killed_mid_publication_leaves_no_record_naming_a_missing_object() {
    let Some(mut f) = fleet() else { return };
    // Enough objects that publication takes a while to kill it in.
    let (url, commit) = f.repo("team/big.git", toolkit(60, 30, "big"));
    let store = f.w.tmp.path().join("store-a");
    let cli = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cloud-harness"));
        cmd.args(["toolkit", "add", "--url", &url, "--ref", &commit])
            .args(["--instance-id", "team", "--json"])
            .env("TOOLKIT_CACHE_ROOT", &store)
            .env("CLOUD_HARNESS_HOME", f.w.tmp.path().join("home-a"))
            .env("ALLOWED_GIT_HOSTS", f.w.server.host())
            .env("CLOUD_HARNESS_EXTRA_CA", &f.w.certs.ca)
            .env("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8")
            .env("CLOUD_HARNESS_CONTAINERS", "off")
            .env("TOOLKIT_STORE_URL", f.s3.url(PREFIX))
            .env_remove("HTTPS_PROXY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in f.s3.settings() {
            cmd.env(k, v);
        }
        cmd
    };
    let mut child = cli().spawn().unwrap();
    // Killed as soon as the first object reaches the bucket.
    let deadline = Instant::now() + Duration::from_secs(120);
    while f.s3.keys(&format!("{PREFIX}/objects")).is_empty() {
        assert!(Instant::now() < deadline, "publication never began");
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the runner ended first: {} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let sent = f.s3.keys(&format!("{PREFIX}/objects")).len();
    assert!(
        f.records().is_empty(),
        "killed after {sent} objects, before the record"
    );

    // The next acquisition on the runner is a local warm start, and completes publication.
    let out = cli().output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["mode"], "warm");
    let records = f.records();
    assert_eq!(records.len(), 1);
    assert!(f.missing_from_bucket(&records[0]).is_empty());

    f.w.server.stop();
    let b = f.runner("store-b");
    assert_eq!(acquire(&b, &url, &commit).unwrap().record.skills, 60);
}

/// `cloud-harness cas gc --remote` against the test bucket.
fn remote_gc(f: &Fleet) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cloud-harness"));
    cmd.args(["cas", "gc", "--remote", "--grace", "3600"])
        .env("TOOLKIT_CACHE_ROOT", f.w.tmp.path().join("store-gc"))
        .env("TOOLKIT_STORE_URL", f.s3.url(PREFIX));
    for (k, v) in f.s3.settings() {
        cmd.env(k, v);
    }
    support::code_and_output(cmd.output().unwrap())
}

/// A blob no record names, put straight into the bucket, `age` old.
fn orphan(f: &Fleet, text: &str, age: Duration) -> std::path::PathBuf {
    orphan_of(f, "blob", text, age)
}

/// An object of `kind` (`blob`, `pack`) no record names, `age` old.
fn orphan_of(f: &Fleet, kind: &str, text: &str, age: Duration) -> std::path::PathBuf {
    let hex = Digest::of(text.as_bytes()).hex();
    let path = f.s3.file(&format!(
        "{PREFIX}/objects/{kind}/{}/{}",
        &hex[..2],
        &hex[2..]
    ));
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, text).unwrap();
    let when = std::time::SystemTime::now() - age;
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(when)
        .unwrap();
    path
}

#[test]
fn fleet_gc_keeps_what_records_reach_and_removes_old_orphans() {
    let Some(mut f) = fleet() else { return };
    let (url, commit) = f.repo("team/skills.git", toolkit(5, 2, "gc"));
    acquire(&f.runner("store-a"), &url, &commit).unwrap();
    let published = f.s3.keys(&format!("{PREFIX}/objects")).len();
    let old = orphan(
        &f,
        "left by a killed publication\n",
        Duration::from_secs(7200),
    );
    let young = orphan(
        &f,
        "uploaded for a record not yet written\n",
        Duration::ZERO,
    );
    let old_pack = orphan_of(
        &f,
        "pack",
        "the pack of a record never written\n",
        Duration::from_secs(7200),
    );

    // Another collector's lease, still running: this one stands back.
    let lease = f.s3.file(&format!("{PREFIX}/gc/lease"));
    fs::create_dir_all(lease.parent().unwrap()).unwrap();
    let until = |ms: i64| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        format!(r#"{{"holder":"runner-7/42","expiresAtMs":{}}}"#, now + ms)
    };
    fs::write(&lease, until(600_000)).unwrap();
    let (code, out) = remote_gc(&f);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("CONFLICT") && out.contains("runner-7/42"),
        "{out}"
    );
    assert!(old.exists());

    // Its lease ran out: taken over, and given back at the end.
    fs::write(&lease, until(-1_000)).unwrap();
    let (code, out) = remote_gc(&f);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "1 records; kept {published} objects, 1 younger than the grace period; removed 2 objects"
        )),
        "{out}"
    );
    assert!(!old.exists() && young.exists() && !old_pack.exists());
    assert!(f.records()[0].pack.is_some(), "the record names its pack");
    assert!(!lease.exists(), "the lease was given back");
    assert!(f.missing_from_bucket(&f.records()[0]).is_empty());
    f.w.server.stop();
    let b = f.runner("store-b");
    assert_eq!(acquire(&b, &url, &commit).unwrap().mode, "remote");
}

#[test]
fn workspace_open_on_a_second_server_comes_from_the_store_of_record() {
    let Some(mut f) = fleet() else { return };
    let (url, commit) = f.repo("team/skills.git", toolkit(6, 1, "served"));
    acquire(&f.runner("store-a"), &url, &commit).unwrap();
    let host = f.w.server.host();
    f.w.server.stop();

    // Runner B: `serve --http` with its own store and home, the same bucket.
    let settings = f.s3.settings();
    let store_url = f.s3.url(PREFIX);
    let ca = f.w.certs.ca.display().to_string();
    let mut env: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend([
        ("TOOLKIT_STORE_URL", store_url.as_str()),
        ("ALLOWED_GIT_HOSTS", host.as_str()),
        ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
        ("CLOUD_HARNESS_CONTAINERS", "off"),
    ]);
    let server = support::http::server_in(tempfile::tempdir().unwrap(), &["--auth", "none"], &env);
    let session = support::http::legacy_session(server.addr);
    let call = serde_json::json!({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": { "name": "workspace_open", "arguments": {
            "idempotencyKey": "fleet",
            "toolkits": [{ "kind": "git", "instanceId": "team", "url": url, "ref": commit }],
        }},
    });
    let answer = support::http::answer_of(&support::http::raw(
        server.addr,
        &call.to_string(),
        &[("Mcp-Session-Id", session.as_str())],
    ));
    let result = &answer["result"]["structuredContent"];
    assert_eq!(result["toolkits"][0]["mode"], "remote", "{answer}");
    assert_eq!(result["toolkits"][0]["warm"], true, "{answer}");
    let skills = result["skills"].as_array().map_or(0, Vec::len);
    assert!(skills >= 6, "{answer}");
}

#[test]
fn a_tag_one_runner_resolved_starts_from_the_bucket_on_another() {
    let Some(mut f) = fleet() else { return };
    let repo = Repo::create(&f.w.repos, "obra/superpowers.git", false);
    let commit = repo.commit(toolkit(3, 1, "tagged"));
    repo.tag("v1.0", &commit);
    // The preset names github.com; the runners' mirror rule sends it to the local server.
    let rewrite = format!("https://github.com/={}", f.w.server.url(""));
    let runner = |name: &str| {
        let store = Store::open(f.w.tmp.path().join(name)).unwrap();
        f.w.server
            .provisioner(&f.w.certs, store, &rewrite, "127.0.0.0/8", "")
            .with_remote(Some(f.s3.remote(PREFIX)))
    };
    let spec = cloud_harness_control::toolkit::ToolkitSpec::Preset(
        cloud_harness_control::toolkit::PresetSpec {
            id: "obra/superpowers".into(),
            scope: None,
            version: Some("v1.0".into()),
            label: None,
        },
    );
    let (a, b) = (runner("store-a"), runner("store-b"));
    let got_a = a.acquire(&spec.resolve(a.hosts()).unwrap()).unwrap();
    assert_eq!(
        (got_a.mode, got_a.record.key.commit.as_str()),
        ("in-process", commit.as_str())
    );
    f.w.server.stop();
    // B knows neither the tag nor the bundle: both come from the bucket, no git asked.
    let got_b = b.acquire(&spec.resolve(b.hosts()).unwrap()).unwrap();
    assert_eq!(
        (got_b.mode, got_b.record.bundle),
        ("remote", got_a.record.bundle)
    );
}

/// What a crafted bundle is made of: files by path below the bundle (`skill/ref.md`), with the
/// size its tree gives each (None: its true size).
type Crafted<'a> = &'a [(&'a str, &'a [u8], Option<u64>)];

impl Fleet {
    /// Publishes to the bucket, under the key runner `p` computes for `url` at `commit`, a
    /// bundle built from `files` in a scratch store, whatever it holds (the record says
    /// `skills` skills); returns the record.
    fn publish_crafted(
        &self,
        p: &Provisioner,
        url: &str,
        commit: &str,
        files: Crafted,
        skills: usize,
    ) -> BundleRecord {
        self.publish_built(p, url, commit, skills, |w| crafted_tree(w, files, ""))
    }

    /// Publishes, as [`Fleet::publish_crafted`] does, the bundle tree `build` writes.
    fn publish_built(
        &self,
        p: &Provisioner,
        url: &str,
        commit: &str,
        skills: usize,
        build: impl FnOnce(&mut cloud_harness_store::cas::Writer<'_>) -> Digest,
    ) -> BundleRecord {
        let spec =
            cloud_harness_control::toolkit::ToolkitSpec::Git(git(url.into(), "team", Some(commit)));
        let key = BundleKey::new(&spec.resolve(p.hosts()).unwrap(), commit);
        let craft = Store::open(self.w.tmp.path().join(format!("craft-{}", key.id()))).unwrap();
        let mut writer = craft.writer().unwrap();
        let bundle = build(&mut writer);
        let manifest = writer.put_blob(b"{\"crafted\":true}").unwrap();
        writer.commit().unwrap();
        let record = BundleRecord {
            key,
            bundle,
            manifest,
            skills,
            instance_id: "team".into(),
            preset: None,
            fetched_url: url.into(),
            object_format: "sha1".into(),
            requested: "commit".into(),
            warnings: vec![],
            skipped: vec![],
            acquired_at: 0,
            pack: None,
            reach: None,
        };
        self.s3.remote(PREFIX).publish(&craft, &record).unwrap();
        record
    }

    /// Where the bucket keeps the record of `record`'s key.
    fn record_file(&self, record: &BundleRecord) -> std::path::PathBuf {
        self.s3
            .file(&format!("{PREFIX}/index/bundles/{}.json", record.key.id()))
    }
}

/// The tree of the files below `prefix`, written bottom up.
fn crafted_tree(
    writer: &mut cloud_harness_store::cas::Writer<'_>,
    files: Crafted,
    prefix: &str,
) -> Digest {
    use cloud_harness_store::cas::Entry;
    let mut entries = Vec::new();
    let mut folders = std::collections::BTreeSet::new();
    for (path, bytes, size) in files {
        let Some(rest) = path.strip_prefix(prefix) else {
            continue;
        };
        match rest.split_once('/') {
            Some((folder, _)) => {
                folders.insert(folder.to_owned());
            }
            None => entries.push(Entry {
                name: rest.into(),
                kind: Kind::File,
                size: size.unwrap_or(bytes.len() as u64),
                digest: writer.put_blob(bytes).unwrap(),
            }),
        }
    }
    for folder in folders {
        entries.push(Entry {
            name: folder.clone(),
            kind: Kind::Tree,
            size: 0,
            digest: crafted_tree(writer, files, &format!("{prefix}{folder}/")),
        });
    }
    writer.put_tree(&Tree::new(entries).unwrap()).unwrap()
}

/// Runner B asks for a bundle the bucket holds badly, with no git to stand in (the repository
/// is not on the git server): the refusal is the answer, naming what was refused, and B's store
/// and index are as they were: empty.
fn refused_by_b(f: &Fleet, b: &Provisioner, url: &str, commit: &str) -> cloud_harness_error::Error {
    let err = acquire(b, url, commit).unwrap_err();
    assert!(err.message.contains("refused"), "{err}");
    assert!(
        err.details["git"].is_string(),
        "git was tried: {}",
        err.details
    );
    assert!(
        err.details["object"].is_string() || err.details["record"].is_string(),
        "the refusal names what it refused: {}",
        err.details
    );
    assert_eq!(
        object_files(&b.store),
        0,
        "nothing entered B's store: {err}"
    );
    assert!(
        b.index().list().unwrap().is_empty(),
        "B's index is as it was"
    );
    assert!(b.store.verify().unwrap().problems.is_empty());
    let _ = f;
    eprintln!("refused: {err}");
    err
}

const SKILL: &[u8] = b"---\nname: a\ndescription: A.\n---\nbody\n";

#[test]
fn a_bad_record_in_the_bucket_is_refused_and_named() {
    let Some(f) = fleet() else { return };
    let url = f.w.server.url("team/absent.git");
    let b = f.runner("store-b");
    let good = f.publish_crafted(&b, &url, &"a".repeat(40), &[("a/SKILL.md", SKILL, None)], 1);
    // Not a record.
    fs::write(f.record_file(&good), b"{ not json").unwrap();
    let err = refused_by_b(&f, &b, &url, &"a".repeat(40));
    assert_eq!(err.code, cloud_harness_error::Code::Upstream, "{err}");
    assert!(err.message.contains("not a bundle record"), "{err}");
    assert!(err.details["record"].as_str().unwrap().ends_with(".json"));
    // A record of 5 MiB (its warnings): refused unread past 4 MiB.
    let mut huge = good.clone();
    huge.warnings = vec!["w".repeat(1 << 20); 5];
    fs::write(f.record_file(&good), serde_json::to_vec(&huge).unwrap()).unwrap();
    let err = refused_by_b(&f, &b, &url, &"a".repeat(40));
    assert_eq!(err.code, cloud_harness_error::Code::TooLarge, "{err}");
    assert!(err.message.contains("a record may have"), "{err}");
    // A record counting skills its bundle does not hold.
    let mut lying = good.clone();
    lying.skills = 7;
    fs::write(f.record_file(&good), serde_json::to_vec(&lying).unwrap()).unwrap();
    let err = refused_by_b(&f, &b, &url, &"a".repeat(40));
    assert!(
        err.message.contains("not the bundle its record says"),
        "{err}"
    );
}

#[test]
fn a_bundle_past_its_ceilings_in_the_bucket_is_refused_before_anything_is_written() {
    let Some(f) = fleet() else { return };
    let url = f.w.server.url("team/absent.git");
    let mut b = f.runner("store-b");
    b.limits.max_files = 6;
    b.limits.max_depth = 2;
    b.limits.max_file_bytes = 1024;
    let commit = |c: char| c.to_string().repeat(40);

    // More files than a toolkit may have.
    let many: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| (format!("a/ref-{i}.md"), format!("ref {i}").into_bytes()))
        .collect();
    let mut files: Vec<(&str, &[u8], Option<u64>)> = many
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice(), None))
        .collect();
    files.push(("a/SKILL.md", SKILL, None));
    f.publish_crafted(&b, &url, &commit('b'), &files, 1);
    let err = refused_by_b(&f, &b, &url, &commit('b'));
    assert_eq!(err.code, cloud_harness_error::Code::TooLarge, "{err}");
    assert!(
        err.message.contains("more than the limit of 6 files"),
        "{err}"
    );
    assert_eq!(err.details["limit"], 6);

    // Deeper than a toolkit may nest (2, and two for the bundle and its skill folder).
    let deep: &[(&str, &[u8], Option<u64>)] = &[
        ("a/SKILL.md", SKILL, None),
        ("a/1/2/3/4/x.md", b"deep", None),
    ];
    f.publish_crafted(&b, &url, &commit('c'), deep, 1);
    let err = refused_by_b(&f, &b, &url, &commit('c'));
    assert_eq!(err.code, cloud_harness_error::Code::TooLarge, "{err}");
    assert!(
        err.message.contains("nests deeper than the limit of 4"),
        "{err}"
    );

    // A file larger than a toolkit's may be, as its tree says.
    let big = vec![b'x'; 2048];
    let large: &[(&str, &[u8], Option<u64>)] =
        &[("a/SKILL.md", SKILL, None), ("a/big.bin", &big, None)];
    f.publish_crafted(&b, &url, &commit('d'), large, 1);
    let err = refused_by_b(&f, &b, &url, &commit('d'));
    assert_eq!(err.code, cloud_harness_error::Code::TooLarge, "{err}");
    assert!(err.message.contains("bytes per file"), "{err}");

    // A tree that gives a blob a smaller size than it has: the blob is read no further.
    let lying: &[(&str, &[u8], Option<u64>)] = &[
        ("a/SKILL.md", SKILL, None),
        ("a/ref.md", b"twelve bytes", Some(5)),
    ];
    f.publish_crafted(&b, &url, &commit('e'), lying, 1);
    let err = refused_by_b(&f, &b, &url, &commit('e'));
    assert!(err.message.contains("more than the 5 it may have"), "{err}");

    // Within the ceilings, the same runner takes a bundle from the bucket.
    let fine: &[(&str, &[u8], Option<u64>)] =
        &[("a/SKILL.md", SKILL, None), ("a/1/2/x.md", b"ok", None)];
    f.publish_crafted(&b, &url, &commit('f'), fine, 1);
    let got = acquire(&b, &url, &commit('f')).unwrap();
    assert_eq!((got.mode, got.record.skills), ("remote", 1));
}

/// A bundle of a handful of objects that stands for a vast tree: its skill folder names a
/// folder of 256 entries all naming one folder of 256 entries, all naming one file (65,536
/// files by path, two distinct blobs). Counted by distinct objects it fits the ceilings;
/// counted by path, as staging counts and as every walk of it would go, it does not: refused
/// TOO_LARGE naming the record and the bound, before anything is written.
#[test]
fn a_bundle_of_few_objects_and_many_paths_in_the_bucket_is_refused() {
    use cloud_harness_store::cas::{Entry, Writer};
    let Some(f) = fleet() else { return };
    let url = f.w.server.url("team/absent.git");
    let b = f.runner("store-b");
    let fan = |w: &mut Writer<'_>, child: Digest| {
        let entries = (0..256)
            .map(|i| Entry {
                name: format!("d{i:03}"),
                kind: Kind::Tree,
                size: 0,
                digest: child,
            })
            .collect();
        w.put_tree(&Tree::new(entries).unwrap()).unwrap()
    };
    let file = |w: &mut Writer<'_>, name: &str, bytes: &[u8]| Entry {
        name: name.into(),
        kind: Kind::File,
        size: bytes.len() as u64,
        digest: w.put_blob(bytes).unwrap(),
    };
    let folder =
        |w: &mut Writer<'_>, entries: Vec<Entry>| w.put_tree(&Tree::new(entries).unwrap()).unwrap();
    let sub = |name: &str, digest: Digest| Entry {
        name: name.into(),
        kind: Kind::Tree,
        size: 0,
        digest,
    };
    let record = f.publish_built(&b, &url, &"a".repeat(40), 1, |w| {
        let note = file(w, "note.md", b"see ../a/SKILL.md\n");
        let leaf = folder(w, vec![note]);
        let middle = fan(w, leaf);
        let top = fan(w, middle);
        let md = file(w, "SKILL.md", SKILL);
        let skill = folder(w, vec![md, sub("refs", top)]);
        folder(w, vec![sub("a", skill)])
    });
    let err = refused_by_b(&f, &b, &url, &"a".repeat(40));
    assert_eq!(err.code, cloud_harness_error::Code::TooLarge, "{err}");
    assert!(
        err.message
            .contains("holds 65537 files counted by path (a folder as often as trees name it"),
        "{err}"
    );
    assert!(
        err.message.contains("more than the limit of 20000 files"),
        "{err}"
    );
    assert_eq!(err.details["limit"], 20000);
    assert!(
        err.details["record"]
            .as_str()
            .unwrap()
            .ends_with(&format!("{}.json", record.key.id())),
        "{}",
        err.details
    );
}

/// A blob the runner already has, which the bucket's tree gives another size: the tree lies
/// (the local copy is verified), so the bundle is refused naming the blob, and the local
/// store keeps just what it had.
#[test]
fn a_tree_in_the_bucket_that_misstates_a_blob_the_runner_has_is_refused() {
    let Some(f) = fleet() else { return };
    let url = f.w.server.url("team/absent.git");
    let b = f.runner("store-b");
    let mut w = b.store.writer().unwrap();
    let had = w.put_blob(b"twelve bytes").unwrap();
    w.commit().unwrap();
    let lying: &[(&str, &[u8], Option<u64>)] = &[
        ("a/SKILL.md", SKILL, None),
        ("a/ref.md", b"twelve bytes", Some(5)),
    ];
    f.publish_crafted(&b, &url, &"e".repeat(40), lying, 1);
    let err = acquire(&b, &url, &"e".repeat(40)).unwrap_err();
    assert_eq!(err.code, cloud_harness_error::Code::Upstream, "{err}");
    assert!(
        err.message
            .contains("its tree says 5 bytes, and the copy in the local store has 12"),
        "{err}"
    );
    assert_eq!(err.details["object"], had.to_string(), "{}", err.details);
    assert_eq!(object_files(&b.store), 1, "only the blob it had");
    assert!(b.index().list().unwrap().is_empty());
}

/// Records that are not records do not stop the collector: one that is not JSON, and one
/// that is JSON but no bundle record (what it names, a manifest here, is kept anyway), are
/// skipped and named; an old orphan is removed. One too large to read at all stops it,
/// naming the record (what it names cannot be known).
#[test]
fn fleet_gc_skips_a_record_that_is_not_one_and_keeps_what_it_names() {
    let Some(f) = fleet() else { return };
    let (url, commit) = f.repo("team/skills.git", toolkit(2, 1, "gc-bad"));
    acquire(&f.runner("store-a"), &url, &commit).unwrap();
    let old = orphan(&f, "an orphan\n", Duration::from_secs(7200));
    let named = orphan(&f, "named by a bad record\n", Duration::from_secs(7200));
    let records = f.s3.file(&format!("{PREFIX}/index/bundles"));
    fs::write(records.join("garbage.json"), b"{ not json").unwrap();
    let manifest = Digest::of(b"named by a bad record\n");
    let absent = Digest::of(b"a tree nobody wrote");
    fs::write(
        records.join("partial.json"),
        format!(r#"{{"bundle":"{absent}","manifest":"{manifest}"}}"#),
    )
    .unwrap();
    let (code, out) = remote_gc(&f);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 records;"), "{out}");
    assert!(out.contains("removed 1 objects"), "{out}");
    assert!(
        out.contains("garbage.json: not a bundle record") && out.contains("partial.json"),
        "{out}"
    );
    assert!(!old.exists(), "the orphan was removed");
    assert!(named.exists(), "what a skipped record names was kept");

    fs::write(records.join("huge.json"), vec![b' '; 5 << 20]).unwrap();
    let (code, out) = remote_gc(&f);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("huge.json") && out.contains("nothing was collected"),
        "{out}"
    );
    assert!(named.exists());
    assert!(f.missing_from_bucket(&f.records_readable()[0]).is_empty());
}

impl Fleet {
    /// The records in the bucket that are records.
    fn records_readable(&self) -> Vec<BundleRecord> {
        self.s3
            .keys(&format!("{PREFIX}/index/bundles"))
            .iter()
            .filter_map(|k| BundleRecord::decode(&fs::read(self.s3.file(k)).unwrap()).ok())
            .collect()
    }
}

/// A bundle of one skill folder `a` (its SKILL.md, and blobs of `sizes` bytes that the
/// bucket does not hold, so asking for one waits until the asker gives up), put in `bucket`
/// below `prefix` with its manifest; returns its record and the keys of those blobs.
fn stalled_bundle(
    bucket: &bucket::Bucket,
    prefix: &str,
    name: &str,
    sizes: &[u64],
) -> (BundleRecord, Vec<String>) {
    use cloud_harness_store::cas::Entry;
    let key = |kind: &str, d: &Digest| {
        let hex = d.hex();
        format!("{prefix}/objects/{kind}/{}/{}", &hex[..2], &hex[2..])
    };
    let put_tree = |entries: Vec<Entry>| {
        let bytes = Tree::new(entries).unwrap().encode();
        let digest = Digest::of(&bytes);
        bucket.put(&key("tree", &digest), bytes);
        digest
    };
    let mut entries = vec![Entry {
        name: "SKILL.md".into(),
        kind: Kind::File,
        size: SKILL.len() as u64,
        digest: Digest::of(SKILL),
    }];
    bucket.put(&key("blob", &Digest::of(SKILL)), SKILL.to_vec());
    let mut stalled = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let digest = Digest::of(format!("{name} {i}").as_bytes());
        stalled.push(key("blob", &digest));
        entries.push(Entry {
            name: format!("big-{i}.bin"),
            kind: Kind::File,
            size: *size,
            digest,
        });
    }
    let folder = put_tree(entries);
    let bundle = put_tree(vec![Entry {
        name: "a".into(),
        kind: Kind::Tree,
        size: 0,
        digest: folder,
    }]);
    let manifest = b"{}".to_vec();
    bucket.put(&key("blob", &Digest::of(&manifest)), manifest.clone());
    let url = format!("https://git.invalid/{name}.git");
    let record = BundleRecord {
        key: BundleKey {
            url: url.clone(),
            commit: "c".repeat(40),
            subdirectory: String::new(),
            layout: Default::default(),
            plugin_manifest: false,
            normalizer: cloud_harness_provision::normalize::NORMALIZER_VERSION,
        },
        bundle,
        manifest: Digest::of(&manifest),
        skills: 1,
        instance_id: "team".into(),
        preset: None,
        fetched_url: url,
        object_format: "sha1".into(),
        requested: "commit".into(),
        warnings: vec![],
        skipped: vec![],
        acquired_at: 0,
        pack: None,
        reach: None,
    };
    (record, stalled)
}

fn limits(seconds: u64) -> cloud_harness_provision::staging::Limits {
    cloud_harness_provision::staging::Limits {
        max_seconds: seconds,
        ..Default::default()
    }
}

/// Object storage that stops answering halfway through a bundle: the download ends at the
/// fetch timeout (not at each request's own timeout, retried), TIMEOUT naming the record,
/// and nothing of the bundle entered the local store.
#[test]
fn a_download_that_outlasts_the_fetch_timeout_ends_at_it_naming_the_record() {
    let bucket = bucket::Bucket::start();
    let (record, stalled) = stalled_bundle(&bucket, "slow", "slow", &[100]);
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let err = bucket
        .remote("slow")
        .download(&store, &record, limits(2))
        .unwrap_err();
    assert_eq!(err.code, cloud_harness_error::Code::Timeout, "{err}");
    assert!(
        err.message.contains("took longer than the limit of 2 s"),
        "{err}"
    );
    assert!(
        err.details["record"]
            .as_str()
            .unwrap()
            .ends_with(&format!("slow/index/bundles/{}.json", record.key.id())),
        "{}",
        err.details
    );
    assert!(bucket.asked(&stalled[0]));
    assert_eq!(object_files(&store), 0);
}

/// Seven files of 32 MiB each, as the bundle's tree says: no more of them are asked for at
/// once than 64 MiB in flight allows (two), where all seven at once would each have been
/// ready to take 32 MiB.
#[test]
fn a_download_has_at_most_64_mib_on_its_way_in() {
    let bucket = bucket::Bucket::start();
    let (record, stalled) = stalled_bundle(&bucket, "wide", "wide", &[32 << 20; 7]);
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let err = bucket
        .remote("wide")
        .download(&store, &record, limits(3))
        .unwrap_err();
    assert_eq!(err.code, cloud_harness_error::Code::Timeout, "{err}");
    let asked = stalled.iter().filter(|k| bucket.asked(k)).count();
    assert!(
        (1..=2).contains(&bucket.most_held()),
        "{} requests were held at once",
        bucket.most_held()
    );
    assert!((1..=2).contains(&asked), "{asked} files were asked for");
}

/// Two downloads at once in the process: a third waits its turn, within its own fetch
/// timeout, and asks object storage for nothing meanwhile.
#[test]
fn two_downloads_run_at_once_and_a_third_waits_its_turn() {
    let bucket = std::sync::Arc::new(bucket::Bucket::start());
    let tmp = tempfile::tempdir().unwrap();
    let mut first = Vec::new();
    for name in ["one", "two"] {
        let (record, stalled) = stalled_bundle(&bucket, "turns", name, &[10]);
        let store = Store::open(tmp.path().join(name)).unwrap();
        let remote = bucket.remote("turns");
        let download = std::thread::spawn(move || remote.download(&store, &record, limits(8)));
        first.push((download, stalled));
    }
    let deadline = Instant::now() + Duration::from_secs(6);
    while !first.iter().all(|(_, stalled)| bucket.asked(&stalled[0])) {
        assert!(Instant::now() < deadline, "the first two did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (record, _) = stalled_bundle(&bucket, "turns", "three", &[10]);
    let store = Store::open(tmp.path().join("three")).unwrap();
    let err = bucket
        .remote("turns")
        .download(&store, &record, limits(1))
        .unwrap_err();
    assert_eq!(err.code, cloud_harness_error::Code::Timeout, "{err}");
    let hex = record.bundle.hex();
    assert!(
        !bucket.asked(&format!("turns/objects/tree/{}/{}", &hex[..2], &hex[2..])),
        "the third asked for nothing while it waited"
    );
    for (download, _) in first {
        let err = download.join().unwrap().unwrap_err();
        assert_eq!(err.code, cloud_harness_error::Code::Timeout, "{err}");
    }
}

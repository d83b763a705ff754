//! Signed tier roots, from the outside: keys made and signatures made by `ssh-keygen`, the
//! trust policy a TOML file `serve` reads, workspaces opened through MCP. On one runner: an
//! owner tier without a signature, signed by a key the policy does not trust, or with a
//! signature tampered with is not served (neither by the MCP tools nor by the mount, walked
//! on the host), the open says why and the audit log has it; signed by the trusted key, it is
//! served. Under `warn` the same toolkit in the workspace tier is served and flagged. On a
//! fleet sharing only a bucket: a signature made on one runner travels beside its bundle, so
//! a second runner verifies it, and a third refuses the copy an intruder replaced.

use crate::support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use support::api::{world_of, World, BIN};
use support::{dir, file, skill, Certs, GitServer, Node, Repo};

/// An Ed25519 key pair made by `ssh-keygen`: the private key's path and the public line.
fn keypair(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .output()
        .expect("ssh-keygen (openssh-client) is installed");
    assert!(out.status.success(), "{out:?}");
    let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
    (path, public.trim().to_owned())
}

/// `text` signed by `key` as the README tells a publisher to.
fn ssh_sign(key: &Path, text: &str) -> String {
    let mut child = Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", "cloud-harness-bundle", "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// `bundle` signed for the owner tier with `key` by `cloud-harness signature sign`; the key's
/// fingerprint.
fn sign_owner(w: &World, bundle: &str, key: &Path) -> String {
    let args = ["signature", "sign", bundle, "--tier", "owner", "--key"];
    let (code, text) = w.cli(&[&args[..], &[key.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{text}");
    let added: Value = serde_json::from_str(&text).unwrap();
    added["key"].as_str().unwrap().to_owned()
}

/// The policy of these tests: the owner tier of `url` requires `key`, its workspace tier
/// warns without it.
fn policy(dir: &Path, url: &str, key: &str) -> PathBuf {
    let path = dir.join("trust.toml");
    std::fs::write(
        &path,
        format!(
            "[[scope]]\nname = \"team owner tier\"\ntoolkits = [{url:?}]\ntiers = [\"owner\"]\nkeys = [{key:?}]\nmode = \"require\"\n\n\
             [[scope]]\nname = \"team workspace tier\"\ntoolkits = [{url:?}]\ntiers = [\"workspace\"]\nkeys = [{key:?}]\nmode = \"warn\"\n"
        ),
    )
    .unwrap();
    path
}

fn toolkit_tree() -> Node {
    dir(vec![(
        "skills",
        dir(vec![
            (
                "lint",
                dir(vec![
                    (
                        "SKILL.md",
                        file("---\nname: lint\ndescription: Lint the code.\n---\nRun it.\n"),
                    ),
                    (
                        "scripts",
                        dir(vec![(
                            "run.sh",
                            Node::Exec(b"#!/bin/sh\necho lint\n".to_vec()),
                        )]),
                    ),
                ]),
            ),
            ("fmt", skill("fmt", "Format it.")),
        ]),
    )])
}

/// The names of the toolkit's skills a `workspace_open` or `skills_list` answer lists (the
/// built-in tier's left out).
fn names(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .filter(|n| !n.starts_with("cloud-harness-"))
        .collect();
    out.sort();
    out
}

fn open(w: &World, key: &str, kit: Value) -> Value {
    let opened = w.tool(
        &w.session(),
        "workspace_open",
        json!({"idempotencyKey": key, "toolkits": [kit], "allowToolkitWorkspaceChanges": true}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    opened["structuredContent"].clone()
}

fn warnings(out: &Value) -> String {
    out["warnings"].to_string()
}

#[test]
fn an_owner_tier_is_served_only_with_a_good_signature_by_a_trusted_key() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (trusted, trusted_pub) = keypair(&keys, "release");
    let (stranger, _) = keypair(&keys, "stranger");
    let certs = Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let commit = Repo::create(&repos, "team/kit.git", false).commit(toolkit_tree());
    let git = GitServer::start(&repos, &certs);
    let url = git.url("team/kit.git");
    let policy = policy(&keys, &url, &trusted_pub);
    let policy_env = policy.display().to_string();
    let ca = certs.ca.display().to_string();
    let w = world_of(support::http::server_mounting(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", &git.host()),
            ("CLOUD_HARNESS_EXTRA_CA", &ca),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
            ("CLOUD_HARNESS_TRUST_POLICY", &policy_env),
        ],
    ));
    let kit = json!({"kind": "git", "url": url, "instanceId": "kit", "ref": commit});
    let listed = |out: &Value| {
        let ws = out["workspace"].as_str().unwrap();
        let list = w.tool(&w.session(), "skills_list", json!({"workspace": ws}));
        names(&list["structuredContent"])
    };
    let mounted = |out: &Value| -> Vec<String> {
        let ws = out["workspace"].as_str().unwrap();
        let root = w
            .home()
            .join("workspaces")
            .join(ws)
            .join("mounts/owner-skills");
        let mut found: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        found.sort();
        found
    };
    let check = |env_policy: bool, bundle: &str| {
        let mut c = Command::new(BIN);
        c.args(["signature", "check", bundle, "--tier", "owner"])
            .env("CLOUD_HARNESS_HOME", w.home())
            .env("TOOLKIT_CACHE_ROOT", w.server.tmp.path().join("store"))
            .envs(w.server.database_env());
        if env_policy {
            c.env("CLOUD_HARNESS_TRUST_POLICY", &policy);
        }
        let out = c.output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v)
    };

    // Unsigned: acquired, listed with its verdict, and nothing of it served.
    let out = open(&w, "unsigned", kit.clone());
    let t = &out["toolkits"][0];
    assert_eq!(
        (t["served"].clone(), t["signature"]["status"].clone()),
        (json!(false), json!("unsigned")),
        "{out}"
    );
    assert_eq!(t["signature"]["mode"], "require");
    assert!(
        warnings(&out).contains("is not served in the owner tier"),
        "{out}"
    );
    assert!(!names(&out).contains(&"lint".to_owned()), "{out}");
    assert!(!listed(&out).contains(&"lint".to_owned()));
    assert!(mounted(&out).is_empty(), "{:?}", mounted(&out));
    let bundle = t["bundle"].as_str().unwrap().to_owned();
    assert!(w.audit_actions().contains(&"signature.refused".to_owned()));
    // Another spelling of the same repository is the same toolkit to the policy.
    let respelled = url.replace("localhost", "LOCALHOST").replace(".git", "/");
    let out = open(
        &w,
        "respelled",
        json!({"kind": "git", "url": respelled, "instanceId": "kit", "ref": commit}),
    );
    assert_eq!(out["toolkits"][0]["served"], false, "{out}");
    let (code, verdict) = check(true, &bundle);
    assert_eq!(
        (code, verdict["verdict"]["status"].clone()),
        (Some(1), json!("unsigned"))
    );
    let (code, verdict) = check(false, &bundle);
    assert_eq!(
        (code, verdict["verdict"]["status"].clone()),
        (Some(0), json!("not-required"))
    );

    // Signed by a key the policy does not trust: still not served.
    sign_owner(&w, &bundle, &stranger);
    let out = open(&w, "stranger", kit.clone());
    assert_eq!(
        out["toolkits"][0]["signature"]["status"], "untrusted-key",
        "{out}"
    );
    assert!(mounted(&out).is_empty());

    // A signature made for something else is refused when added.
    let (code, payload) = w.cli(&["signature", "payload", &bundle, "--tier", "workspace"]);
    assert_eq!(code, 0, "{payload}");
    assert!(
        payload.contains(&format!("bundle {bundle}\ntier workspace\n")),
        "{payload}"
    );
    let other_tier = ssh_sign(&trusted, &payload);
    let sig_file = w.server.tmp.path().join("other.sig");
    std::fs::write(&sig_file, &other_tier).unwrap();
    let (code, text) = w.cli(&[
        "signature",
        "add",
        &bundle,
        "--tier",
        "owner",
        "--file",
        sig_file.to_str().unwrap(),
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("does not sign bundle"), "{text}");

    // Signed by the trusted key: served, by the tools and the mount alike.
    let fingerprint = sign_owner(&w, &bundle, &trusted);
    assert!(fingerprint.starts_with("SHA256:"), "{fingerprint}");
    let out = open(&w, "signed", kit.clone());
    let t = &out["toolkits"][0];
    assert_eq!(
        (t["served"].clone(), t["signature"]["status"].clone()),
        (json!(true), json!("verified")),
        "{out}"
    );
    assert_eq!(t["signature"]["keys"], json!([fingerprint]));
    assert_eq!(listed(&out), ["fmt", "lint"]);
    assert_eq!(mounted(&out), ["fmt", "lint"]);
    assert!(!warnings(&out).contains("kit"), "{out}");
    let (code, verdict) = check(true, &bundle);
    assert_eq!(
        (code, verdict["verdict"]["status"].clone()),
        (Some(0), json!("verified"))
    );
    // The bundle's inventory carries the verdict and who signed it.
    let bom = w.op("GET", &format!("/api/v1/inventory/{bundle}"), None);
    let props: std::collections::BTreeMap<String, String> = bom["metadata"]["component"]
        ["properties"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        props["cloud-harness:signature.owner.status"], "verified",
        "{props:?}"
    );
    assert_eq!(
        props["cloud-harness:signature.owner.verifiedBy"],
        fingerprint
    );
    assert!(props["cloud-harness:signature.owner.signedBy"].contains(&fingerprint));
    assert_eq!(
        props["cloud-harness:signature.workspace.status"],
        "unsigned"
    );
    let (_, list) = w.cli(&["signature", "list", &bundle]);
    assert_eq!(
        serde_json::from_str::<Value>(&list)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // The trusted key's signature replaced in the database by its signature of the other tier:
    // bad, and the tier is not served.
    let db = w.state();
    db.write(|tx| {
        tx.execute(
            "UPDATE bundle_signatures SET signature = $1 WHERE bundle = $2 AND tier = 'owner' AND key = $3",
            cloud_harness_control::params![other_tier.trim(), bundle, fingerprint],
        )
        .map_err(cloud_harness_control::state::internal)
    })
    .unwrap();
    let out = open(&w, "tampered", kit.clone());
    assert_eq!(out["toolkits"][0]["signature"]["status"], "bad", "{out}");
    assert_eq!(out["toolkits"][0]["served"], false);
    assert!(mounted(&out).is_empty());

    // Under `warn` (the workspace tier): unsigned, then tampered with, served and flagged.
    let in_workspace = json!({"kind": "git", "url": url, "instanceId": "kit", "ref": commit, "scope": "workspace"});
    let out = open(&w, "warn-unsigned", in_workspace.clone());
    let t = &out["toolkits"][0];
    assert_eq!(
        (
            t["served"].clone(),
            t["signature"]["status"].clone(),
            t["signature"]["mode"].clone()
        ),
        (json!(true), json!("unsigned"), json!("warn")),
        "{out}"
    );
    assert!(
        warnings(&out).contains("is served unverified in the workspace tier"),
        "{out}"
    );
    assert_eq!(listed(&out), ["fmt", "lint"]);
    // Signed for that tier by a key the policy does not trust: served, flagged.
    let stranger_key = stranger.to_str().unwrap();
    let args = [
        "signature",
        "sign",
        &bundle,
        "--tier",
        "workspace",
        "--key",
        stranger_key,
    ];
    let (code, text) = w.cli(&args);
    assert_eq!(code, 0, "{text}");
    let out = open(&w, "warn-stranger", in_workspace.clone());
    let t = &out["toolkits"][0];
    assert_eq!(
        (t["served"].clone(), t["signature"]["status"].clone()),
        (json!(true), json!("untrusted-key")),
        "{out}"
    );
    assert!(
        warnings(&out).contains("signed only by keys it does not trust"),
        "{out}"
    );
    let owner_tier_text = ssh_sign(
        &trusted,
        &w.cli(&["signature", "payload", &bundle, "--tier", "owner"])
            .1,
    );
    db.write(|tx| {
        tx.execute(
            "INSERT INTO bundle_signatures (bundle, tier, key, url, commit_id, signature, added_by, added_at)
             VALUES ($1, 'workspace', $2, $3, $4, $5, 'test', 0)",
            cloud_harness_control::params![bundle, fingerprint, url.trim_end_matches(".git"), commit, owner_tier_text.trim()],
        )
        .map_err(cloud_harness_control::state::internal)
    })
    .unwrap();
    let out = open(&w, "warn-tampered", in_workspace);
    let t = &out["toolkits"][0];
    assert_eq!(
        (t["served"].clone(), t["signature"]["status"].clone()),
        (json!(true), json!("bad")),
        "{out}"
    );
    assert_eq!(listed(&out), ["fmt", "lint"]);

    // Every refusal is in the audit log, naming the toolkit and why.
    let refused = w.op(
        "GET",
        "/api/v1/audit?action=signature.refused&limit=100",
        None,
    );
    let entries = refused["entries"].as_array().unwrap();
    assert!(!entries.is_empty(), "{refused}");
    assert_eq!(
        entries[0]["subject"],
        format!("toolkit:{}", url.trim_end_matches(".git"))
    );
    assert_eq!(entries[0]["details"]["tier"], "owner");
}

#[test]
fn a_signature_travels_with_its_bundle_to_another_runner_through_the_store_of_record() {
    if !support::s3::available() {
        assert!(std::env::var_os("CI").is_none(), "s3s-fs is missing");
        eprintln!("skipped: s3s-fs is not installed");
        return;
    }
    let mut git = support::acquisition::world();
    let s3 = support::s3::S3Server::start(&git.tmp.path().join("s3"));
    let keys = git.tmp.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (trusted, trusted_pub) = keypair(&keys, "release");
    let commit = Repo::create(&git.repos, "team/kit.git", false).commit(toolkit_tree());
    let url = git.server.url("team/kit.git");
    let policy = policy(&keys, &url, &trusted_pub).display().to_string();
    let store_url = s3.url("fleet");
    let settings = s3.settings();
    let host = git.server.host();
    let ca = git.certs.ca.display().to_string();
    let mut env: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend([
        ("TOOLKIT_STORE_URL", store_url.as_str()),
        ("ALLOWED_GIT_HOSTS", host.as_str()),
        ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
        ("CLOUD_HARNESS_CONTAINERS", "off"),
        ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
        ("CLOUD_HARNESS_EXECUTOR", "none"),
        ("CLOUD_HARNESS_TRUST_POLICY", policy.as_str()),
    ]);
    // Each runner its own home, store and SQLite database: the bucket is all they share.
    let runner = || {
        world_of(support::http::server_in(
            tempfile::tempdir().unwrap(),
            &[],
            &env,
        ))
    };
    let kit = json!({"kind": "git", "url": url, "instanceId": "kit", "ref": commit});

    let a = runner();
    let out = open(&a, "a", kit.clone());
    assert_eq!(out["toolkits"][0]["served"], false, "{out}");
    let bundle = out["toolkits"][0]["bundle"].as_str().unwrap().to_owned();
    // B takes the bundle from the bucket before anyone signed it: refused.
    let b = runner();
    let out = open(&b, "b-early", kit.clone());
    assert_eq!(out["toolkits"][0]["mode"], "remote", "{out}");
    assert_eq!(
        out["toolkits"][0]["signature"]["status"], "unsigned",
        "{out}"
    );
    let asked = std::time::Instant::now();
    // Signed on A: kept in A's database and beside the bundle in the bucket.
    let signed = Command::new(BIN)
        .args(["signature", "sign", &bundle, "--tier", "owner", "--key"])
        .arg(&trusted)
        .env("CLOUD_HARNESS_HOME", a.home())
        .env("TOOLKIT_CACHE_ROOT", a.server.tmp.path().join("store"))
        .envs(a.server.database_env())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(signed.status.success(), "{signed:?}");
    let hex = bundle.trim_start_matches("sha256:");
    let kept = s3.keys(&format!("fleet/signatures/{hex}"));
    assert_eq!(kept.len(), 1, "{kept:?}");
    git.server.stop();

    // B, with the bundle in its own store now, takes the signature from the bucket at its
    // next open once the bucket may be asked again (every 10 s for one toolkit), and serves
    // it; no git.
    std::thread::sleep(Duration::from_secs(11).saturating_sub(asked.elapsed()));
    let out = open(&b, "b", kit.clone());
    let t = &out["toolkits"][0];
    assert_eq!(t["mode"], "warm", "{out}");
    assert_eq!(
        (t["served"].clone(), t["signature"]["status"].clone()),
        (json!(true), json!("verified")),
        "{out}"
    );
    assert_eq!(names(&out), ["fmt", "lint"]);

    // An intruder replaces the bucket's copy with the key's signature of the other tier: a
    // third runner does not take it (it signs other facts), and refuses the tier.
    let payload = a
        .cli(&["signature", "payload", &bundle, "--tier", "workspace"])
        .1;
    let forged = ssh_sign(&trusted, &payload);
    let text = std::fs::read_to_string(s3.file(&kept[0])).unwrap();
    let fingerprint = cloud_harness_control::signatures::Signed::parse(&text)
        .unwrap()
        .fingerprint();
    let owner_tier = cloud_harness_control::signatures::Subject {
        url: &url,
        commit: &commit,
        bundle: &bundle,
        tier: "owner",
    };
    s3.remote("fleet")
        .put_signature(owner_tier, &fingerprint, &forged)
        .unwrap();
    assert_eq!(
        s3.keys(&format!("fleet/signatures/{hex}")),
        kept,
        "replaced in place"
    );
    assert_ne!(std::fs::read_to_string(s3.file(&kept[0])).unwrap(), text);
    let c = runner();
    let out = open(&c, "c", kit.clone());
    let t = &out["toolkits"][0];
    assert_eq!(
        (t["served"].clone(), t["signature"]["status"].clone()),
        (json!(false), json!("unsigned")),
        "{out}"
    );
    assert!(!names(&out).contains(&"lint".to_owned()), "{out}");
    let (_, list) = c.cli(&["signature", "list", &bundle]);
    assert_eq!(list.trim(), "[]", "the forged copy was kept");

    // Withdrawn on A (the bucket's copies first, then A's database): a fourth runner finds
    // nothing to take.
    s3.remote("fleet")
        .put_signature(owner_tier, &fingerprint, &text)
        .unwrap();
    let removed = Command::new(BIN)
        .args([
            "signature",
            "remove",
            &bundle,
            "--tier",
            "owner",
            "--key",
            &fingerprint,
        ])
        .env("CLOUD_HARNESS_HOME", a.home())
        .env("TOOLKIT_CACHE_ROOT", a.server.tmp.path().join("store"))
        .envs(a.server.database_env())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(removed.status.success(), "{removed:?}");
    assert!(s3.keys(&format!("fleet/signatures/{hex}")).is_empty());
    let d = runner();
    let out = open(&d, "d", kit);
    assert_eq!(
        out["toolkits"][0]["signature"]["status"], "unsigned",
        "{out}"
    );
}

#[test]
fn a_signature_withdrawn_reaches_a_workspace_when_it_is_next_made_live() {
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/kit");
    std::fs::create_dir_all(src.join("alpha")).unwrap();
    std::fs::write(
        src.join("alpha/SKILL.md"),
        "---\nname: alpha\ndescription: Alpha notes.\n---\nAlpha.\n",
    )
    .unwrap();
    let kit = serde_json::to_value(support::warm_toolkit(&store, &src, "kit")).unwrap();
    let keys = tmp.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (trusted, trusted_pub) = keypair(&keys, "release");
    let policy = policy(&keys, "*", &trusted_pub).display().to_string();
    let w = world_of(support::http::server_in(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
            ("CLOUD_HARNESS_IDLE_PAUSE", "1"),
            ("CLOUD_HARNESS_TRUST_POLICY", &policy),
        ],
    ));
    let out = open(&w, "unsigned", kit.clone());
    assert_eq!(out["toolkits"][0]["served"], false, "{out}");
    let bundle = out["toolkits"][0]["bundle"].as_str().unwrap().to_owned();
    let fingerprint = sign_owner(&w, &bundle, &trusted);
    let out = open(&w, "signed", kit);
    assert_eq!(names(&out), ["alpha"], "{out}");
    let ws = out["workspace"].as_str().unwrap().to_owned();
    let paused = || {
        let all = w.op("GET", "/api/v1/workspaces", None);
        all["workspaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["workspace"] == ws.as_str() && x["paused"] == true)
    };
    support::wait::until("the workspace pauses", Duration::from_secs(20), paused);
    let (code, text) = w.cli(&[
        "signature",
        "remove",
        &bundle,
        "--tier",
        "owner",
        "--key",
        &fingerprint,
    ]);
    assert_eq!(code, 0, "{text}");
    // The next call resumes it: its owner tier judged again, the toolkit no longer served.
    let list = w.tool(&w.session(), "skills_list", json!({"workspace": ws}));
    assert_eq!(list["isError"], false, "{list}");
    assert!(names(&list["structuredContent"]).is_empty(), "{list}");
    assert!(w.audit_actions().contains(&"signature.removed".to_owned()));
}

//! A store of record (an S3-compatible bucket, `s3s-fs` on loopback) that holds bad things —
//! an object whose bytes are not its name, a record too large to be one, a bundle past the
//! ceilings of a toolkit — under the key of a toolkit no git server can stand in for: the
//! server's `workspace_open` answers with the refusal, naming the record or the object; the
//! local store and bundle index are as they were; the server goes on serving, a good bundle
//! from the same bucket included, with its memory bounded.

use crate::support::http::{answer_of, legacy_session, raw, server_in, Server};
use crate::support::s3::S3Server;
use crate::support::WARM_HOST;
use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_control::toolkit::ToolkitSpec;
use cloud_harness_provision::index::{BundleKey, BundleRecord};
use cloud_harness_store::cas::{Digest, Entry, Kind, Store, Tree};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const PREFIX: &str = "hostile";
const SKILL: &str = "---\nname: a\ndescription: A.\n---\nbody\n";

/// The toolkit spec of `commit` of a repository nobody serves (`bench.invalid`).
fn spec(commit: &str) -> Value {
    json!({ "kind": "git", "instanceId": "team", "url": format!("https://{WARM_HOST}/team/kit.git"), "ref": commit })
}

/// The key the server files the bundle of `spec` under.
fn key(spec: &Value) -> BundleKey {
    let parsed: ToolkitSpec =
        cloud_harness_control::toolkit::parse_spec(&spec.to_string()).unwrap();
    let toolkit = parsed
        .resolve(&HostPolicy::new(WARM_HOST, "").unwrap())
        .unwrap();
    BundleKey::new(&toolkit, spec["ref"].as_str().unwrap())
}

/// Publishes to the bucket, under the key of `spec`, a bundle of one skill folder `a` holding
/// `files` besides its SKILL.md, with its pack or object by object only; returns the record
/// and the scratch store it was made in.
fn publish(
    s3: &S3Server,
    scratch: &Path,
    spec: &Value,
    files: usize,
    packs: bool,
) -> (BundleRecord, Store) {
    let key = key(spec);
    let store = Store::open(scratch.join(key.id())).unwrap();
    let mut writer = store.writer().unwrap();
    let mut entries = vec![blob_entry(&mut writer, "SKILL.md", SKILL.as_bytes())];
    for i in 0..files {
        entries.push(blob_entry(
            &mut writer,
            &format!("ref-{i}.md"),
            format!("ref {i}\n").as_bytes(),
        ));
    }
    let folder = writer.put_tree(&Tree::new(entries).unwrap()).unwrap();
    let bundle = writer
        .put_tree(
            &Tree::new(vec![Entry {
                name: "a".into(),
                kind: Kind::Tree,
                size: 0,
                digest: folder,
            }])
            .unwrap(),
        )
        .unwrap();
    let manifest = writer.put_blob(b"{}").unwrap();
    writer.commit().unwrap();
    let record = BundleRecord {
        fetched_url: key.url.clone(),
        key,
        bundle,
        manifest,
        skills: 1,
        instance_id: "team".into(),
        preset: None,
        object_format: "sha1".into(),
        requested: "commit".into(),
        warnings: vec![],
        skipped: vec![],
        acquired_at: 0,
        pack: None,
        reach: None,
    };
    s3.remote(PREFIX)
        .with_packs(packs)
        .publish(&store, &record)
        .unwrap();
    (record, store)
}

fn blob_entry(
    writer: &mut cloud_harness_store::cas::Writer<'_>,
    name: &str,
    bytes: &[u8],
) -> Entry {
    Entry {
        name: name.into(),
        kind: Kind::File,
        size: bytes.len() as u64,
        digest: writer.put_blob(bytes).unwrap(),
    }
}

fn object_key(kind: &str, digest: &Digest) -> String {
    let hex = digest.hex();
    format!("{PREFIX}/objects/{kind}/{}/{}", &hex[..2], &hex[2..])
}

/// Every file of the local store's objects and bundle index: what a refusal must leave as it
/// was.
fn snapshot(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![store.join("objects"), store.join("index")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                dirs.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// `workspace_open` of `spec`: the tool's result.
fn open(server: &Server, key: &str, spec: &Value) -> Value {
    let session = legacy_session(server.addr);
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "workspace_open", "arguments": { "idempotencyKey": key, "toolkits": [spec] }}});
    answer_of(&raw(
        server.addr,
        &body.to_string(),
        &[("Mcp-Session-Id", &session)],
    ))["result"]
        .clone()
}

#[test]
fn a_bad_record_or_object_in_the_bucket_is_refused_and_the_server_goes_on() {
    if !crate::support::s3::available() {
        eprintln!("skipped: s3s-fs is not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&tmp.path().join("s3"));
    let scratch = tmp.path().join("scratch");
    let commit = |c: char| c.to_string().repeat(40);

    // An object whose bytes are not its name (no pack stands in for it: tests/fleet/packs.rs
    // has a bad pack).
    let tampered = spec(&commit('1'));
    let (record, _) = publish(&s3, &scratch, &tampered, 1, false);
    std::fs::write(
        s3.file(&object_key("tree", &record.bundle)),
        b"cloud-harness tree 1\n",
    )
    .unwrap();
    // A record of 5 MiB.
    let huge = spec(&commit('2'));
    let (mut record, _) = publish(&s3, &scratch, &huge, 1, true);
    record.warnings = vec!["w".repeat(1 << 20); 5];
    std::fs::write(
        s3.file(&format!("{PREFIX}/index/bundles/{}.json", record.key.id())),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();
    // More files than the server lets a toolkit have (CLOUD_HARNESS_MAX_FILES=8 below): its
    // pack, past the objects a bundle may have, is refused; then the bundle, object by object.
    let wide = spec(&commit('3'));
    publish(&s3, &scratch, &wide, 20, true);
    // A good one.
    let good = spec(&commit('4'));
    publish(&s3, &scratch, &good, 2, true);

    let server_tmp = tempfile::tempdir().unwrap();
    let store_dir = server_tmp.path().join("store");
    let settings = s3.settings();
    let store_url = s3.url(PREFIX);
    let mut env: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend([
        ("TOOLKIT_STORE_URL", store_url.as_str()),
        ("ALLOWED_GIT_HOSTS", WARM_HOST),
        ("CLOUD_HARNESS_CONTAINERS", "off"),
        ("CLOUD_HARNESS_MAX_FILES", "8"),
    ]);
    let server = server_in(server_tmp, &["--auth", "none"], &env);
    let before = snapshot(&store_dir);

    for (name, spec, code, says) in [
        ("tampered", &tampered, "UPSTREAM", "its bytes hash to"),
        ("huge", &huge, "TOO_LARGE", "a record may have"),
        ("wide", &wide, "TOO_LARGE", "more than the limit of 8 files"),
    ] {
        let refused = open(&server, name, spec);
        assert_eq!(refused["isError"], true, "{name}: {refused}");
        let e = &refused["structuredContent"];
        eprintln!("{name}: {}", e["message"]);
        assert_eq!(e["code"], code, "{name}: {refused}");
        assert!(
            e["message"].as_str().unwrap().contains(says),
            "{name}: {refused}"
        );
        assert!(
            e["message"].as_str().unwrap().contains("refused"),
            "{name}: {refused}"
        );
        assert!(
            e["details"]["object"].is_string() || e["details"]["record"].is_string(),
            "{name} names what it refused: {refused}"
        );
        assert_eq!(
            snapshot(&store_dir),
            before,
            "{name}: the local store changed"
        );
    }

    let opened = open(&server, "good", &good);
    assert_eq!(opened["isError"], false, "{opened}");
    let toolkit = &opened["structuredContent"]["toolkits"][0];
    assert_eq!(toolkit["mode"], "remote", "{opened}");
    assert_eq!(toolkit["skillCount"], 1, "{opened}");

    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(
        peak_kib < 512 << 10,
        "the server used {} MiB",
        peak_kib >> 10
    );
}

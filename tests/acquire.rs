//! Toolkit acquisition against a local HTTPS git server (loopback, a test CA): real-world
//! layouts, SHA-256, tags, warm starts, the command line, concurrent acquisitions.
//! What acquisition refuses is in `tests/refusals.rs`.

use crate::support;

use cloud_harness_control::toolkit::{LayoutSpec, PresetSpec, ToolkitSpec};
use cloud_harness_error::Code;
use cloud_harness_provision::Acquired;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use support::acquisition::{git, names, world};
use support::{dir, file, skill, Node, Repo};

#[test]
fn a_bucketed_preset_through_a_mirror() {
    let w = world();
    let repo = Repo::create(&w.repos, "mattpocock/skills.git", false);
    let commit = repo.commit(dir(vec![
        ("README.md", file("# skills")),
        (
            "skills",
            dir(vec![
                (
                    "engineering",
                    dir(vec![
                        ("tdd", skill("tdd", "Red, green, refactor.")),
                        ("diagnose", skill("diagnose", "Find the bug.")),
                    ]),
                ),
                (
                    "architecture",
                    dir(vec![("codebase-map", skill("codebase-map", "Map it."))]),
                ),
                (
                    "productivity",
                    dir(vec![("triage", skill("triage", "Sort it."))]),
                ),
            ]),
        ),
    ]));
    // The preset names github.com; the operator's mirror serves it from the local server.
    let p = w.provisioner(&format!("https://github.com/={}", w.server.url("")));
    let spec = ToolkitSpec::Preset(PresetSpec {
        id: "mattpocock/skills".into(),
        scope: None,
        version: Some(commit.clone()),
        label: None,
    });
    let t = spec.resolve(p.hosts()).unwrap();
    let a = p.acquire(&t).unwrap();
    assert!(!a.warm);
    assert_eq!(
        a.record.skills, 4,
        "the count found, not a number from a description"
    );
    assert_eq!(a.record.key.commit, commit);
    assert_eq!(a.record.fetched_url, w.server.url("mattpocock/skills.git"));
    assert_eq!(a.record.key.url, "https://github.com/mattpocock/skills.git");
    let out = w.materialized(&a);
    assert_eq!(
        names(&out),
        ["codebase-map", "diagnose", "tdd", "triage"],
        "skills sit side by side in the bundle"
    );

    // The manifest records the source, every skill and its files' sizes and SHA-256 digests.
    let manifest: serde_json::Value =
        serde_json::from_slice(&w.store.blob(&a.record.manifest).unwrap()).unwrap();
    assert_eq!(manifest["source"]["commit"], commit);
    assert_eq!(
        manifest["source"]["url"],
        "https://github.com/mattpocock/skills.git"
    );
    let tdd = manifest["skills"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "tdd")
        .unwrap();
    assert_eq!(tdd["path"], "skills/engineering/tdd");
    let md = fs::read(out.join("tdd/SKILL.md")).unwrap();
    assert_eq!(tdd["files"][0]["path"], "SKILL.md");
    assert_eq!(tdd["files"][0]["size"], md.len());
    assert_eq!(
        tdd["files"][0]["sha256"],
        cloud_harness_store::cas::Digest::of(&md).hex()
    );
}

#[test]
fn a_flat_preset_keeps_sibling_links_and_executable_scripts() {
    let w = world();
    let repo = Repo::create(&w.repos, "obra/superpowers.git", false);
    let mut review = match skill("requesting-code-review", "Ask for review.") {
        Node::Dir(e) => e,
        _ => unreachable!(),
    };
    review.push((b"code-reviewer.md".to_vec(), file("You review code.")));
    let mut tdd = match skill(
        "test-driven-development",
        "See ../requesting-code-review/code-reviewer.md",
    ) {
        Node::Dir(e) => e,
        _ => unreachable!(),
    };
    tdd.push((
        b"run-tests".to_vec(),
        Node::Exec(b"#!/bin/sh\necho ok\n".to_vec()),
    ));
    tdd.push((b"helper.sh".to_vec(), file("echo no exec bit\n")));
    tdd.push((
        b"reviewer.md".to_vec(),
        Node::Link("../requesting-code-review/code-reviewer.md".into()),
    ));
    repo.commit(dir(vec![
        (
            ".claude-plugin",
            dir(vec![(
                "plugin.json",
                file(r#"{"name":"superpowers","version":"1.0.0"}"#),
            )]),
        ),
        (
            "skills",
            Node::Dir(vec![
                (
                    b"using-superpowers".to_vec(),
                    skill("using-superpowers", "Map tool names at session start."),
                ),
                (b"requesting-code-review".to_vec(), Node::Dir(review)),
                (b"test-driven-development".to_vec(), Node::Dir(tdd)),
            ]),
        ),
    ]));
    let p = w.provisioner(&format!("https://github.com/={}", w.server.url("")));
    let spec = ToolkitSpec::Preset(PresetSpec {
        id: "obra/superpowers".into(),
        scope: None,
        version: None,
        label: None,
    });
    let t = spec.resolve(p.hosts()).unwrap();
    assert_eq!(t.session_start_skill.as_deref(), Some("using-superpowers"));
    let a = p.acquire(&t).unwrap();
    assert_eq!(a.record.skills, 3);
    assert_eq!(a.record.requested, "default branch head");
    let out = w.materialized(&a);
    let tdd = out.join("test-driven-development");
    assert_eq!(
        fs::metadata(tdd.join("run-tests"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        fs::metadata(tdd.join("helper.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    // The sibling link resolves in the bundle, as a symlink and as a relative path in text.
    assert_eq!(
        fs::read_to_string(tdd.join("reviewer.md")).unwrap(),
        "You review code."
    );
    assert!(tdd
        .join("../requesting-code-review/code-reviewer.md")
        .exists());
}

#[test]
fn a_plugin_manifest_narrows_the_skills_only_when_asked() {
    let w = world();
    let repo = Repo::create(&w.repos, "plugin.git", false);
    let marketplace = r#"{"name":"m","plugins":[{"name":"docs","source":"./","skills":["./skills/xlsx","./skills/pdf"]}]}"#;
    let commit = repo.commit(dir(vec![
        (
            ".claude-plugin",
            dir(vec![("marketplace.json", file(marketplace))]),
        ),
        (
            "skills",
            dir(vec![
                ("xlsx", skill("xlsx", "x")),
                ("pdf", skill("pdf", "p")),
                ("internal-draft", skill("internal-draft", "not shipped")),
            ]),
        ),
    ]));
    let a = w
        .acquire(ToolkitSpec::Git(git(
            w.server.url("plugin.git"),
            "docs",
            Some(&commit),
        )))
        .unwrap();
    // The documented default (skill roots `skills`, recursive) installs every skill, and
    // says what the manifest would have left out.
    assert_eq!(
        names(&w.materialized(&a)),
        ["internal-draft", "pdf", "xlsx"]
    );
    assert!(
        a.record
            .warnings
            .iter()
            .any(|m| m.contains("marketplace.json lists 2 of the 3 skills")),
        "{:?}",
        a.record.warnings
    );

    // Asked for, the manifest narrows the skills to those its author ships.
    let mut spec = git(w.server.url("plugin.git"), "shipped", Some(&commit));
    spec.layout = Some(LayoutSpec {
        plugin_manifest: Some(true),
        ..LayoutSpec::default()
    });
    let a = w.acquire(ToolkitSpec::Git(spec)).unwrap();
    assert_eq!(names(&w.materialized(&a)), ["pdf", "xlsx"]);
    assert!(
        a.record
            .warnings
            .iter()
            .any(|m| m.contains("marketplace.json lists the skills")),
        "{:?}",
        a.record.warnings
    );
}

#[test]
fn a_symlink_at_the_repository_root_and_a_subdirectory() {
    let w = world();
    let repo = Repo::create(&w.repos, "mono.git", false);
    let commit = repo.commit(dir(vec![
        ("CLAUDE.md", file("# agents")),
        ("AGENTS.md", Node::Link("CLAUDE.md".into())),
        (
            "packages",
            dir(vec![(
                "kit",
                dir(vec![(
                    "skills",
                    dir(vec![("lint", skill("lint", "Lint."))]),
                )]),
            )]),
        ),
        ("skills", dir(vec![("top", skill("top", "Top level."))])),
    ]));
    let a = w
        .acquire(ToolkitSpec::Git(git(
            w.server.url("mono.git"),
            "mono",
            Some(&commit),
        )))
        .unwrap();
    assert_eq!(names(&w.materialized(&a)), ["top"]);
    let mut sub = git(w.server.url("mono.git"), "kit", Some(&commit));
    sub.subdirectory = Some("packages/kit".into());
    let a = w.acquire(ToolkitSpec::Git(sub)).unwrap();
    assert_eq!(names(&w.materialized(&a)), ["lint"]);

    let mut missing = git(w.server.url("mono.git"), "kit", Some(&commit));
    missing.subdirectory = Some("packages/nope".into());
    let err = w.acquire(ToolkitSpec::Git(missing)).unwrap_err();
    assert_eq!(
        (err.code, err.details["field"].as_str()),
        (Code::InvalidArgument, Some("subdirectory")),
        "{err}"
    );
}

#[test]
fn a_sha256_repository_end_to_end() {
    let w = world();
    let repo = Repo::create(&w.repos, "sha256.git", true);
    let first = repo.commit(dir(vec![(
        "skills",
        dir(vec![("alpha", skill("alpha", "v1"))]),
    )]));
    repo.commit(dir(vec![(
        "skills",
        dir(vec![
            ("alpha", skill("alpha", "v2")),
            ("beta", skill("beta", "b")),
        ]),
    )]));
    assert_eq!(first.len(), 64);
    let a = w
        .acquire(ToolkitSpec::Git(git(
            w.server.url("sha256.git"),
            "s",
            Some(&first),
        )))
        .unwrap();
    assert_eq!(a.record.object_format, "sha256");
    assert_eq!(a.record.skills, 1, "the pinned commit, not the head");
    assert!(
        fs::read_to_string(w.materialized(&a).join("alpha/SKILL.md"))
            .unwrap()
            .contains("v1")
    );
    let head = w
        .acquire(ToolkitSpec::Git(git(w.server.url("sha256.git"), "s", None)))
        .unwrap();
    assert_eq!(head.record.skills, 2);
    assert_eq!(head.record.key.commit.len(), 64);
}

#[test]
fn a_tag_version_is_resolved_once_then_pinned() {
    let w = world();
    let repo = Repo::create(&w.repos, "obra/superpowers.git", false);
    let c1 = repo.commit(dir(vec![(
        "skills",
        dir(vec![(
            "using-superpowers",
            skill("using-superpowers", "v1"),
        )]),
    )]));
    repo.tag("v1.0", &c1);
    let p = w.provisioner(&format!("https://github.com/={}", w.server.url("")));
    let spec = ToolkitSpec::Preset(PresetSpec {
        id: "obra/superpowers".into(),
        scope: None,
        version: Some("v1.0".into()),
        label: None,
    });
    let t = spec.resolve(p.hosts()).unwrap();
    let a = p.acquire(&t).unwrap();
    assert_eq!(a.record.key.commit, c1);
    assert!(p.acquire(&t).unwrap().warm);
}

#[test]
fn a_warm_start_makes_no_connection() {
    let mut w = world();
    let repo = Repo::create(&w.repos, "kit.git", false);
    let commit = repo.commit(dir(vec![(
        "skills",
        dir(vec![("a", skill("a", "a")), ("b", skill("b", "b"))]),
    )]));
    let spec = ToolkitSpec::Git(git(w.server.url("kit.git"), "kit", Some(&commit)));
    let cold = w.acquire(spec.clone()).unwrap();
    assert!(!cold.warm);
    let requests = w.server.requests();
    assert!(requests > 0);
    // No server any more: any connection attempt would fail the acquisition.
    w.server.stop();
    let warm = w.acquire(spec.clone()).unwrap();
    assert!(warm.warm);
    assert_eq!(warm.record.bundle, cold.record.bundle);
    assert_eq!(w.server.requests(), requests);

    // A missing object makes it cold again (and with the server gone, an UPSTREAM error).
    let blob = w.store.tree(&cold.record.bundle).unwrap().entries()[0].digest;
    let skill_tree = w.store.tree(&blob).unwrap();
    let md = skill_tree.get("SKILL.md").unwrap().digest;
    fs::remove_file(
        w.store
            .object_path(cloud_harness_store::cas::ObjectKind::Blob, &md),
    )
    .unwrap();
    let err = w.acquire(spec).unwrap_err();
    assert_eq!(err.code, Code::Upstream, "{err}");
}

#[test]
fn the_command_line_adds_lists_and_serves_a_bundle() {
    let w = world();
    let repo = Repo::create(&w.repos, "team/skills.git", false);
    let commit = repo.commit(dir(vec![(
        "skills",
        dir(vec![
            ("review", skill("review", "r")),
            ("lint", skill("lint", "l")),
        ]),
    )]));
    let harness = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
            .args(args)
            .env("TOOLKIT_CACHE_ROOT", w.store.root())
            .env("ALLOWED_GIT_HOSTS", w.server.host())
            .env("CLOUD_HARNESS_EXTRA_CA", &w.certs.ca)
            .env("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8")
            // In-process: helper containers could not reach a loopback server.
            .env("CLOUD_HARNESS_CONTAINERS", "off")
            .env_remove("HTTPS_PROXY")
            .output()
            .unwrap()
    };
    let url = w.server.url("team/skills.git");
    let out = harness(&[
        "toolkit",
        "add",
        "--url",
        &url,
        "--instance-id",
        "team",
        "--ref",
        &commit,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let added: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            added["warm"].as_bool(),
            added["mode"].as_str(),
            added["skills"].as_u64()
        ),
        (Some(false), Some("in-process"), Some(2))
    );
    let bundle = added["bundle"].as_str().unwrap().to_owned();

    let again = harness(&[
        "toolkit",
        "add",
        "--spec",
        &format!(r#"{{"kind":"git","instanceId":"team","url":"{url}","ref":"{commit}"}}"#),
        "--json",
    ]);
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        (again["warm"].as_bool(), again["bundle"].as_str()),
        (Some(true), Some(bundle.as_str()))
    );

    let list: serde_json::Value =
        serde_json::from_slice(&harness(&["toolkit", "list", "--json"]).stdout).unwrap();
    assert_eq!(list[0]["bundle"], bundle);
    assert_eq!(list[0]["key"]["commit"], commit);

    let view: serde_json::Value = serde_json::from_slice(
        &harness(&[
            "skills",
            "resolve",
            "--no-builtin",
            "--bundle",
            &bundle,
            "--json",
        ])
        .stdout,
    )
    .unwrap();
    let skills = view["skills"].as_array().unwrap();
    assert_eq!(skills.len(), 2);
    assert_eq!(
        (skills[0]["tier"].as_str(), skills[0]["source"].as_str()),
        (Some("owner"), Some("owner:team"))
    );

    let out = harness(&[
        "skills",
        "resolve",
        "--bundle",
        &format!("sha256:{}", "0".repeat(64)),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NOT_FOUND"));
    let out = harness(&[
        "toolkit",
        "add",
        "--url",
        "https://example.com/x.git",
        "--instance-id",
        "x",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("FORBIDDEN"));
}

/// Eight workspaces opening with one toolkit at once (different instance ids, as different
/// keys would): one fetch, one bundle, no collision between writers.
#[test]
fn concurrent_cold_acquisitions_of_one_toolkit_fetch_once() {
    let w = world();
    let repo = Repo::create(&w.repos, "shared.git", false);
    let commit = repo.commit(dir(vec![(
        "skills",
        dir(vec![("a", skill("a", "a")), ("b", skill("b", "b"))]),
    )]));
    let p = std::sync::Arc::new(w.provisioner(""));
    let url = w.server.url("shared.git");
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (p, url, commit) = (p.clone(), url.clone(), commit.clone());
            std::thread::spawn(move || {
                let spec = ToolkitSpec::Git(git(url, &format!("kit-{i}"), Some(&commit)));
                p.acquire(&spec.resolve(p.hosts()).unwrap())
            })
        })
        .collect();
    let results: Vec<Acquired> = threads
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    assert_eq!(results.iter().filter(|a| !a.warm).count(), 1, "one fetch");
    assert!(results
        .iter()
        .all(|a| a.record.bundle == results[0].record.bundle));
    let mut ids: Vec<&str> = results
        .iter()
        .map(|a| a.record.instance_id.as_str())
        .collect();
    ids.sort();
    assert_eq!(ids.len(), 8);
    ids.dedup();
    assert_eq!(ids.len(), 8, "each acquisition keeps its own instance id");
}

#[test]
fn a_store_above_its_cache_size_forgets_the_least_recently_used_bundle_it_may() {
    let w = world();
    // Three toolkits of the same size: each skill holds 64 KiB of its own bytes.
    let kit = |name: &str| {
        let body = format!("{name} ").repeat(64 << 10 >> 3);
        let repo = Repo::create(&w.repos, &format!("team/{name}.git"), false);
        let commit = repo.commit(dir(vec![("skills", dir(vec![(name, skill(name, &body))]))]));
        (w.server.url(&format!("team/{name}.git")), commit)
    };
    let kits = [kit("oldest"), kit("middle"), kit("newest")];
    let acquired: Vec<Acquired> = kits
        .iter()
        .map(|(url, commit)| {
            w.acquire(ToolkitSpec::Git(git(url.clone(), "t", Some(commit))))
                .unwrap()
        })
        .collect();
    // Used three, two and one hours ago; the oldest is what an open workspace serves.
    let index = w.provisioner("").index();
    for (i, a) in acquired.iter().enumerate() {
        let when =
            std::time::SystemTime::now() - std::time::Duration::from_secs(3600 * (3 - i as u64));
        let path = w
            .store
            .root()
            .join(format!("index/bundles/{}.json", a.record.key.id()));
        fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
    w.store
        .set_root("workspaces/ws_test/0", &acquired[0].record.bundle)
        .unwrap();
    let total = w.store.object_bytes().unwrap();

    // Room for two of the three.
    let max = total * 3 / 4;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
        .args(["cas", "gc", "--grace", "0"])
        .env("TOOLKIT_CACHE_ROOT", w.store.root())
        .env("TOOLKIT_CACHE_MAX_BYTES", max.to_string())
        .output()
        .unwrap();
    let (code, text) = support::code_and_output(out);
    assert_eq!(code, 0, "{text}");
    let forgot: Vec<&str> = text.lines().filter(|l| l.starts_with("forgot ")).collect();
    assert_eq!(
        forgot,
        vec![format!(
            "forgot {}@{} (least recently used)",
            kits[1].0, kits[1].1
        )],
        "{text}"
    );
    assert!(w.store.object_bytes().unwrap() <= max);
    let has = |a: &Acquired| index.get(&a.record.key).is_some_and(|r| index.complete(&r));
    assert!(
        has(&acquired[0]),
        "served by a workspace: kept although oldest"
    );
    assert!(!has(&acquired[1]));
    assert!(has(&acquired[2]));
    assert!(w.store.verify().unwrap().problems.is_empty());
    // Asked for again, the forgotten one comes back.
    let again = w
        .acquire(ToolkitSpec::Git(git(
            kits[1].0.clone(),
            "t",
            Some(&kits[1].1),
        )))
        .unwrap();
    assert_eq!(
        (again.warm, again.record.bundle),
        (false, acquired[1].record.bundle)
    );
}

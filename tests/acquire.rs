//! Toolkit acquisition against a local HTTPS git server (loopback, a test CA): real-world
//! layouts, SHA-256, hostile repositories, warm starts.

mod support;

use cloud_harness::provision::hosts::HostPolicy;
use cloud_harness::provision::{Acquired, Provisioner};
use cloud_harness::toolkit::{self, GitSpec, LayoutSpec, PresetSpec, ToolkitSpec};
use cloud_harness_fs::cas::{materialize, Store};
use cloud_harness_fs::{Code, Error};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use support::{dir, file, skill, Certs, GitServer, Node, Repo};

struct World {
    tmp: tempfile::TempDir,
    repos: PathBuf,
    certs: Certs,
    server: GitServer,
    store: Store,
}

fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    fs::create_dir_all(&repos).unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let server = GitServer::start(&repos, &certs);
    let store = Store::open(tmp.path().join("store")).unwrap();
    World {
        tmp,
        repos,
        certs,
        server,
        store,
    }
}

impl World {
    fn provisioner(&self, rewrites: &str) -> Provisioner {
        // The test server is on loopback, which the egress proxy opens only when told to.
        self.server
            .provisioner(&self.certs, self.store.clone(), rewrites, "127.0.0.0/8", "")
    }

    fn acquire(&self, spec: ToolkitSpec) -> Result<Acquired, Error> {
        let p = self.provisioner("");
        p.acquire(&spec.resolve(p.hosts())?)
    }

    /// The bundle written out as plain files.
    fn materialized(&self, a: &Acquired) -> PathBuf {
        let dest = self
            .tmp
            .path()
            .join(format!("bundle-{}", &a.record.bundle.hex()[..8]));
        if !dest.exists() {
            materialize(&self.store, &a.record.bundle, &dest).unwrap();
        }
        dest
    }

    /// Every file of the store (objects, roots, index, temp), for "left as it was" checks.
    fn snapshot(&self) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(self.store.root(), self.store.root(), &mut out);
        out.retain(|p| p != "lock");
        out.sort();
        out
    }
}

fn git(url: String, id: &str, commit: Option<&str>) -> GitSpec {
    GitSpec {
        instance_id: id.into(),
        url,
        git_ref: commit.map(str::to_owned),
        scope: None,
        subdirectory: None,
        layout: None,
        skills: None,
    }
}

fn names(path: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

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
        cloud_harness_fs::cas::Digest::of(&md).hex()
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
            .object_path(cloud_harness_fs::cas::ObjectKind::Blob, &md),
    )
    .unwrap();
    let err = w.acquire(spec).unwrap_err();
    assert_eq!(err.code, Code::Upstream, "{err}");
}

fn refused(w: &World, name: &str, root: Node, code: Code, needle: &str) {
    let repo = Repo::create(&w.repos, name, false);
    let commit = repo.commit(root);
    let before = w.snapshot();
    let started = std::time::Instant::now();
    let err = w
        .acquire(ToolkitSpec::Git(git(
            w.server.url(name),
            "hostile",
            Some(&commit),
        )))
        .unwrap_err();
    eprintln!("{name}: refused in {:?}", started.elapsed());
    assert_eq!(err.code, code, "{name}: {err}");
    assert!(
        err.message.contains(needle),
        "{name}: {err} should say {needle:?}"
    );
    assert_eq!(w.snapshot(), before, "{name} changed the store");
}

#[test]
fn hostile_repositories_are_refused_and_leave_the_store_as_it_was() {
    let w = world();
    // Something in the store already, so "as it was" is not just "empty".
    let ok = Repo::create(&w.repos, "ok.git", false);
    let c = ok.commit(dir(vec![(
        "skills",
        dir(vec![("fine", skill("fine", "fine"))]),
    )]));
    w.acquire(ToolkitSpec::Git(git(
        w.server.url("ok.git"),
        "ok",
        Some(&c),
    )))
    .unwrap();

    let with = |name: &str, node: Node| {
        dir(vec![(
            "skills",
            dir(vec![(
                "a",
                dir(vec![
                    ("SKILL.md", file("---\ndescription: a\n---\n")),
                    (name, node),
                ]),
            )]),
        )])
    };
    refused(
        &w,
        "link-out.git",
        with("evil", Node::Link("../../../etc/passwd".into())),
        Code::InvalidArgument,
        "outside the toolkit",
    );
    refused(
        &w,
        "link-abs.git",
        with("evil", Node::Link("/etc/passwd".into())),
        Code::InvalidArgument,
        "outside the toolkit",
    );
    refused(
        &w,
        "dotdot.git",
        with("..", file("x")),
        Code::InvalidArgument,
        "skills/a/..",
    );
    for (i, disguise) in [
        ".git",
        ".GIT",
        ".Git",
        ".git.",
        ".git ",
        "git~1",
        ".g\u{200c}it",
        ".git::$INDEX_ALLOCATION",
    ]
    .iter()
    .enumerate()
    {
        refused(
            &w,
            &format!("dotgit{i}.git"),
            with(disguise, dir(vec![("config", file("[core]"))])),
            Code::InvalidArgument,
            "refused name",
        );
    }
    refused(
        &w,
        "slash.git",
        with("a\\b", file("x")),
        Code::InvalidArgument,
        "refused name",
    );
    refused(
        &w,
        "case.git",
        dir(vec![(
            "skills",
            dir(vec![(
                "a",
                dir(vec![
                    ("SKILL.md", file("---\ndescription: a\n---\n")),
                    ("skill.md", file("x")),
                ]),
            )]),
        )]),
        Code::InvalidArgument,
        "collides",
    );
    refused(
        &w,
        "nfc.git",
        with("caf\u{e9}", file("x")).merge(("cafe\u{301}", file("y"))),
        Code::InvalidArgument,
        "collides",
    );
    let many: Vec<(Vec<u8>, Node)> = (0..30_000)
        .map(|i| (format!("f{i}").into_bytes(), file("same content")))
        .collect();
    refused(
        &w,
        "many.git",
        dir(vec![("skills", Node::Dir(many))]),
        Code::TooLarge,
        "20000 files",
    );
    refused(
        &w,
        "huge.git",
        with("model.bin", Node::File(vec![0u8; 300 << 20])),
        Code::TooLarge,
        "bytes per file",
    );
}

trait Merge {
    fn merge(self, extra: (&str, Node)) -> Node;
}

impl Merge for Node {
    /// Adds an entry next to the deepest first folder's entries (skills/a/…).
    fn merge(self, extra: (&str, Node)) -> Node {
        match self {
            Node::Dir(mut entries)
                if entries.len() == 1 && matches!(entries[0].1, Node::Dir(_)) =>
            {
                let (name, inner) = entries.pop().unwrap();
                Node::Dir(vec![(name, inner.merge(extra))])
            }
            Node::Dir(mut entries) => {
                entries.push((extra.0.as_bytes().to_vec(), extra.1));
                Node::Dir(entries)
            }
            other => other,
        }
    }
}

#[test]
fn submodules_are_skipped_with_a_warning() {
    let w = world();
    let repo = Repo::create(&w.repos, "sub.git", false);
    let commit = repo.commit(dir(vec![(
        "skills",
        dir(vec![
            ("a", skill("a", "a")),
            (
                "vendored",
                Node::Submodule("1111111111111111111111111111111111111111".into()),
            ),
        ]),
    )]));
    let a = w
        .acquire(ToolkitSpec::Git(git(
            w.server.url("sub.git"),
            "sub",
            Some(&commit),
        )))
        .unwrap();
    assert_eq!(a.record.skills, 1);
    assert!(
        a.record
            .warnings
            .iter()
            .any(|m| m.contains("skills/vendored") && m.contains("submodule")),
        "{:?}",
        a.record.warnings
    );
}

#[test]
fn a_commit_the_server_does_not_have_is_not_found() {
    let w = world();
    let repo = Repo::create(&w.repos, "kit.git", false);
    repo.commit(dir(vec![("skills", dir(vec![("a", skill("a", "a"))]))]));
    let before = w.snapshot();
    let err = w
        .acquire(ToolkitSpec::Git(git(
            w.server.url("kit.git"),
            "kit",
            Some(&"ab".repeat(20)),
        )))
        .unwrap_err();
    assert!(matches!(err.code, Code::NotFound | Code::Upstream), "{err}");
    assert_eq!(w.snapshot(), before);
}

#[test]
fn bad_specs_are_typed_errors_naming_the_field() {
    let hosts = HostPolicy::new("github.com", "").unwrap();
    let cases = [
        (
            r#"{"kind":"preset","id":"nobody/nothing"}"#,
            Code::InvalidArgument,
            "id",
        ),
        (
            r#"{"kind":"preset","id":"obra/superpowers","scope":"everywhere"}"#,
            Code::InvalidArgument,
            "scope",
        ),
        (
            r#"{"kind":"preset","id":"obra/superpowers","version":"-rf"}"#,
            Code::InvalidArgument,
            "version",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":"http://github.com/a/b.git"}"#,
            Code::InvalidArgument,
            "url",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":"https://gitlab.com/a/b.git"}"#,
            Code::Forbidden,
            "url",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":"https://github.com@evil.example/a.git"}"#,
            Code::InvalidArgument,
            "url",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":"https://github.com/a/b.git","ref":"main"}"#,
            Code::InvalidArgument,
            "ref",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":"https://github.com/a/b.git","ref":"ABCDEF0123456789ABCDEF0123456789ABCDEF01"}"#,
            Code::InvalidArgument,
            "ref",
        ),
        (
            r#"{"kind":"git","instanceId":"has space","url":"https://github.com/a/b.git"}"#,
            Code::InvalidArgument,
            "instanceId",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":"https://github.com/a/b.git","subdirectory":"../up"}"#,
            Code::InvalidArgument,
            "subdirectory",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":"https://github.com/a/b.git","skills":{"include":["["]}}"#,
            Code::InvalidArgument,
            "skills.include",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":"https://github.com/a/b.git","layout":{"skillRoots":["/abs"]}}"#,
            Code::InvalidArgument,
            "layout.skillRoots",
        ),
        (
            r#"{"kind":"git","instanceId":"x","url":5}"#,
            Code::InvalidArgument,
            "url",
        ),
        (
            r#"{"kind":"git","url":"https://github.com/a/b.git"}"#,
            Code::InvalidArgument,
            "instanceId",
        ),
        (
            r#"{"kind":"svn","url":"https://github.com/a/b.git"}"#,
            Code::InvalidArgument,
            "kind",
        ),
    ];
    for (json, code, field) in cases {
        let err = toolkit::parse_spec(json)
            .and_then(|s| s.resolve(&hosts))
            .unwrap_err();
        assert_eq!(err.code, code, "{json}: {err}");
        assert!(
            err.message.contains(field),
            "{json}: {err} should name {field}"
        );
    }
    let two = [
        toolkit::parse_spec(
            r#"{"kind":"git","instanceId":"x","url":"https://github.com/a/b.git"}"#,
        )
        .unwrap(),
        toolkit::parse_spec(
            r#"{"kind":"git","instanceId":"x","url":"https://github.com/c/d.git"}"#,
        )
        .unwrap(),
    ];
    let err = toolkit::resolve_request(&two, &hosts).unwrap_err();
    assert_eq!(err.details["field"], "toolkits[1].instanceId");
    let bad = [toolkit::parse_spec(
        r#"{"kind":"git","instanceId":"x","url":"https://gitlab.com/a.git"}"#,
    )
    .unwrap()];
    let err = toolkit::resolve_request(&bad, &hosts).unwrap_err();
    assert_eq!(err.details["field"], "toolkits[0].url");
    assert!(err.message.starts_with("toolkits[0].url: "), "{err}");
}

#[test]
fn a_mirror_off_the_allowlist_is_forbidden() {
    let hosts =
        HostPolicy::new("github.com", "https://github.com/=https://mirror.example/").unwrap();
    let spec = ToolkitSpec::Preset(PresetSpec {
        id: "obra/superpowers".into(),
        scope: None,
        version: None,
    });
    let err = spec.resolve(&hosts).unwrap_err();
    assert_eq!(err.code, Code::Forbidden);
    assert!(err.message.contains("mirror.example"), "{err}");
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

#[test]
fn the_egress_proxy_refuses_a_loopback_server_unless_its_range_is_opened() {
    let w = world();
    let repo = Repo::create(&w.repos, "kit.git", false);
    let commit = repo.commit(dir(vec![("skills", dir(vec![("a", skill("a", "a"))]))]));
    let closed = w.server.provisioner(&w.certs, w.store.clone(), "", "", "");
    let spec = ToolkitSpec::Git(git(w.server.url("kit.git"), "kit", Some(&commit)));
    let before = w.server.requests();
    let err = closed
        .acquire(&spec.resolve(closed.hosts()).unwrap())
        .unwrap_err();
    assert_eq!(err.code, Code::Forbidden, "{err}");
    assert!(err.message.contains("loopback"), "{err}");
    assert_eq!(w.server.requests(), before, "nothing reached the server");
    assert!(w.acquire(spec).is_ok(), "with 127.0.0.0/8 opened it works");
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

/// A helper container stands in for the fetch: its pack may name another commit than the one
/// asked for (a pack of a commit the server does have). The host compares and refuses.
#[test]
fn a_pack_naming_another_commit_than_the_one_asked_for_is_refused() {
    let w = world();
    let repo = Repo::create(&w.repos, "two.git", false);
    let first = repo.commit(dir(vec![("skills", dir(vec![("a", skill("a", "a"))]))]));
    let second = repo.commit(dir(vec![("skills", dir(vec![("b", skill("b", "b"))]))]));
    // What a lying helper would print: a well-formed pack of `second`, saying so.
    let mut pack_objects = std::process::Command::new("git")
        .arg("-C")
        .arg(&repo.path)
        .args(["pack-objects", "--revs", "--stdout", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    writeln!(pack_objects.stdin.take().unwrap(), "{second}").unwrap();
    let out = pack_objects.wait_with_output().unwrap();
    assert!(out.status.success());
    let mut output = format!(
        "{} sha1 {second}\n",
        cloud_harness::provision::sandbox::PACK_MAGIC
    )
    .into_bytes();
    output.extend_from_slice(&out.stdout);
    let scratch = w.tmp.path().join("scratch");
    let fetched = cloud_harness::provision::sandbox::index_pack(
        &output,
        &scratch,
        cloud_harness::provision::staging::Limits::default(),
    )
    .unwrap();
    let url = w.server.url("two.git");
    let asked = toolkit::Revision::Commit(first.clone());
    let err = cloud_harness::provision::verify_fetched(&asked, &fetched, &url).unwrap_err();
    assert_eq!(err.code, Code::Upstream, "{err}");
    assert!(
        err.message.contains(&first) && err.message.contains(&second),
        "{err}"
    );
    let honest = toolkit::Revision::Commit(second.clone());
    cloud_harness::provision::verify_fetched(&honest, &fetched, &url).unwrap();
}

/// Links that stay inside the repository (so staging keeps them) but lead above the bundle
/// once the skill folder is served at its top — one step too many, or a chain — are dropped
/// from the served tree with a warning naming them; links within the skill and to siblings
/// stay.
#[test]
fn links_escaping_the_served_bundle_are_dropped_with_a_warning() {
    let w = world();
    let repo = Repo::create(&w.repos, "links.git", false);
    let with_links = match skill("a", "A.") {
        Node::Dir(mut entries) => {
            for (name, target) in [
                ("readme.md", "../../README.md"),
                ("up", ".."),
                ("chain.md", "up/../../README.md"),
                ("sibling.md", "../b/SKILL.md"),
                ("self.md", "SKILL.md"),
            ] {
                entries.push((name.as_bytes().to_vec(), Node::Link(target.into())));
            }
            Node::Dir(entries)
        }
        other => other,
    };
    let commit = repo.commit(dir(vec![
        ("README.md", file("# the repository's own\n")),
        (
            "skills",
            dir(vec![("a", with_links), ("b", skill("b", "B."))]),
        ),
    ]));
    let a = w
        .acquire(ToolkitSpec::Git(git(
            w.server.url("links.git"),
            "links",
            Some(&commit),
        )))
        .unwrap();
    let bundle = w.materialized(&a);
    let served = names(&bundle.join("a"));
    assert_eq!(
        served,
        ["SKILL.md", "self.md", "sibling.md", "up"],
        "{served:?}"
    );
    for dropped in ["readme.md", "chain.md"] {
        assert!(
            a.record
                .warnings
                .iter()
                .any(|m| m.contains(dropped) && m.contains("outside")),
            "{dropped}: {:?}",
            a.record.warnings
        );
    }
    // What stays resolves inside the bundle.
    let root = fs::canonicalize(&bundle).unwrap();
    for name in &served {
        if let Ok(real) = fs::canonicalize(bundle.join("a").join(name)) {
            assert!(real.starts_with(&root), "{name} -> {}", real.display());
        }
    }
}

/// Bytes that do not compress: a pack holding them is as large as they are.
fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn an_in_process_download_stops_at_twice_the_byte_ceiling() {
    let w = world();
    let name = "noise.git";
    let commit = Repo::create(&w.repos, name, false).commit(dir(vec![
        ("skills", dir(vec![("a", skill("a", "A."))])),
        ("blob.bin", Node::File(noise(6 << 20))),
    ]));
    let before = w.snapshot();
    let mut p = w.provisioner("");
    p.limits.max_bytes = 1 << 20;
    p.limits.max_file_bytes = 1 << 20;
    let spec = ToolkitSpec::Git(git(w.server.url(name), "noise", Some(&commit)));
    let err = p.acquire(&spec.resolve(p.hosts()).unwrap()).unwrap_err();
    assert_eq!(err.code, Code::TooLarge, "{err}");
    // Cut while downloading (2 MiB of the 6), not refused later by staging.
    assert!(
        err.message.contains("the download passed 2097152 bytes"),
        "{err}"
    );
    assert_eq!(
        w.snapshot(),
        before,
        "the refused download changed the store"
    );
    // The same toolkit under a ceiling it fits is fetched.
    p.limits.max_bytes = 16 << 20;
    p.limits.max_file_bytes = 16 << 20;
    p.acquire(&spec.resolve(p.hosts()).unwrap()).unwrap();
}

/// An outage on the way to a git host (a name without an address, a dial refused) is
/// UPSTREAM and retryable, never FORBIDDEN. The CLI runs in a network namespace of its own, so
/// no lookup or dial leaves this machine.
#[test]
fn an_outage_is_upstream_and_retryable_not_a_refusal() {
    if !nix::unistd::geteuid().is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("skipped: unshare -n needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let add = |host: &str, url: &str, env: &[(&str, &str)]| {
        // Loopback up (the built-in egress proxy listens there), nothing else.
        let out = std::process::Command::new("unshare")
            .args(["-n", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
            .args([env!("CARGO_BIN_EXE_cloud-harness"), "toolkit", "add"])
            .args(["--url", url, "--instance-id", "x"])
            .env("TOOLKIT_CACHE_ROOT", tmp.path().join("store"))
            .env("ALLOWED_GIT_HOSTS", host)
            .env("CLOUD_HARNESS_CONTAINERS", "off")
            .env_remove("HTTPS_PROXY")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.contains("FORBIDDEN"), "{err}");
        err
    };
    // No address: the namespace has no network, so resolving fails at once.
    let err = add("git.example.test", "https://git.example.test/x.git", &[]);
    assert!(
        err.contains("UPSTREAM") && err.contains("could not reach"),
        "{err}"
    );
    assert!(err.contains("\"retryable\":true"), "{err}");
    // A dial that fails: the name pinned to a loopback port nothing listens on.
    let err = add(
        "git.example.test:4431",
        "https://git.example.test:4431/x.git",
        &[
            ("CLOUD_HARNESS_RESOLVE", "git.example.test=127.0.0.1"),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
        ],
    );
    assert!(
        err.contains("UPSTREAM") && err.contains("dialling"),
        "{err}"
    );
}

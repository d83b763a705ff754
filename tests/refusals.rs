//! What toolkit acquisition refuses or leaves out, against a local HTTPS git server: hostile
//! repositories, bad specs, hosts off the allowlist, a pack naming another commit, links
//! escaping the bundle, downloads past their ceiling, outages on the way, submodules and
//! commits the server does not have. A refusal leaves the store as it was.

use crate::support;

use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_control::toolkit::{self, PresetSpec, ToolkitSpec};
use cloud_harness_error::Code;
use std::fs;
use support::acquisition::{git, names, world, World};
use support::{dir, file, skill, Node, Repo};

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
        label: None,
    });
    let err = spec.resolve(&hosts).unwrap_err();
    assert_eq!(err.code, Code::Forbidden);
    assert!(err.message.contains("mirror.example"), "{err}");
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
        cloud_harness_provision::sandbox::PACK_MAGIC
    )
    .into_bytes();
    output.extend_from_slice(&out.stdout);
    let scratch = w.tmp.path().join("scratch");
    let fetched = cloud_harness_provision::sandbox::index_pack(
        &output,
        &scratch,
        cloud_harness_provision::staging::Limits::default(),
    )
    .unwrap();
    let url = w.server.url("two.git");
    let asked = toolkit::Revision::Commit(first.clone());
    let err = cloud_harness_provision::verify_fetched(&asked, &fetched, &url).unwrap_err();
    assert_eq!(err.code, Code::Upstream, "{err}");
    assert!(
        err.message.contains(&first) && err.message.contains(&second),
        "{err}"
    );
    let honest = toolkit::Revision::Commit(second.clone());
    cloud_harness_provision::verify_fetched(&honest, &fetched, &url).unwrap();
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

/// A folder of 200 folders, each the same folder of 200, and so on: a small repository whose
/// walk is 200^3 folders. Refused once it has met as many folders as a toolkit may have files,
/// not walked until the deadline.
#[test]
fn a_tree_naming_one_folder_many_times_is_refused_not_walked() {
    let w = world();
    let name = "fanout.git";
    let repo = Repo::create(&w.repos, name, false);
    let mut level = repo.tree(&Node::Dir(vec![]));
    for _ in 0..3 {
        let many = (0..200)
            .map(|i| (format!("d{i}").into_bytes(), Node::Tree(level.clone())))
            .collect();
        level = repo.tree(&Node::Dir(many));
    }
    let commit = repo.commit(dir(vec![
        ("skills", dir(vec![("a", skill("a", "A."))])),
        ("fan", Node::Tree(level)),
    ]));
    let before = w.snapshot();
    let started = std::time::Instant::now();
    let spec = ToolkitSpec::Git(git(w.server.url(name), "fanout", Some(&commit)));
    let err = w.acquire(spec).unwrap_err();
    eprintln!("refused in {:?}", started.elapsed());
    assert_eq!(err.code, Code::TooLarge, "{err}");
    assert!(err.message.contains("20000 folders"), "{err}");
    assert_eq!(w.snapshot(), before, "the refusal changed the store");
}

/// A blob of 300 MiB of zeros is a pack of a few hundred KiB: it is refused before it is
/// unpacked (gix's allocation limit), named as a file too large.
#[test]
fn a_highly_compressed_object_is_refused_unpacked() {
    let w = world();
    let name = "zeros.git";
    let commit = Repo::create(&w.repos, name, false).commit(dir(vec![
        ("skills", dir(vec![("a", skill("a", "A."))])),
        ("zeros.bin", Node::File(vec![0u8; 300 << 20])),
    ]));
    let spec = ToolkitSpec::Git(git(w.server.url(name), "zeros", Some(&commit)));
    let err = w.acquire(spec).unwrap_err();
    assert_eq!(err.code, Code::TooLarge, "{err}");
    assert!(err.message.contains("bytes per file"), "{err}");
    assert_eq!(err.details["limit"], 64u64 << 20, "{err}");
}

#[test]
fn an_in_process_download_stops_at_twice_the_byte_ceiling() {
    let w = world();
    let name = "noise.git";
    // 6 MiB in files each under the per-file limit (one larger would be refused unpacked):
    // the download's ceiling is what stops it.
    let blobs = support::noise(6 << 20, 0x9e37_79b9_7f4a_7c15)
        .chunks(1000 << 10)
        .enumerate()
        .map(|(i, c)| (format!("blob{i}.bin").into_bytes(), Node::File(c.to_vec())))
        .collect();
    let commit = Repo::create(&w.repos, name, false).commit(dir(vec![
        ("skills", dir(vec![("a", skill("a", "A."))])),
        ("blobs", Node::Dir(blobs)),
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

//! Discovery of skills in trees, by layout, with the real-world shapes and bad input.

use cloud_harness_error::Code;
use cloud_harness_skills::discovery::{discover, Discovery, Layout, SkillCache};
use cloud_harness_skills::resolver::{resolve, Tier};
use cloud_harness_skills::stack;
use cloud_harness_store::cas::{Digest, Entry, Kind, Limits, Store, Tree, MAX_WALK_ENTRIES};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

fn write(root: &Path, rel: &str, content: impl AsRef<[u8]>) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

fn skill_md(name: &str) -> String {
    format!("---\nname: {name}\ndescription: The {name} skill.\n---\n# {name}\n")
}

fn run(root: &Path, layout: &Layout) -> Discovery {
    let store = Store::open(root.with_extension("store")).unwrap();
    let tree = store.import_dir(root, &Limits::default()).unwrap().digest;
    discover(&store, &tree, layout, &SkillCache::default()).unwrap()
}

fn names(d: &Discovery) -> Vec<(&str, &str)> {
    d.skills
        .iter()
        .map(|s| (s.name.as_str(), s.path.as_str()))
        .collect()
}

#[test]
fn bucketed_and_flat_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    write(&root, "skills/engineering/tdd/SKILL.md", skill_md("tdd"));
    write(
        &root,
        "skills/engineering/tdd/references/deep/notes.md",
        "not a skill",
    );
    write(
        &root,
        "skills/productivity/triage/SKILL.md",
        skill_md("triage"),
    );
    write(&root, "skills/flat-one/SKILL.md", skill_md("flat-one"));
    write(&root, "custom/workflows/ship/SKILL.md", skill_md("ship"));
    write(&root, "README.md", "# repo");

    let d = run(&root, &Layout::default());
    assert_eq!(
        names(&d),
        [
            ("flat-one", "skills/flat-one"),
            ("tdd", "skills/engineering/tdd"),
            ("triage", "skills/productivity/triage")
        ]
    );
    assert!(d.skipped.is_empty() && d.warnings.is_empty(), "{d:?}");

    // Not recursive: category folders are not searched.
    let flat = Layout {
        recursive: false,
        ..Layout::default()
    };
    assert_eq!(names(&run(&root, &flat)), [("flat-one", "skills/flat-one")]);

    // Several roots, one of them missing (a warning, not an error).
    let roots = Layout {
        skill_roots: vec!["skills".into(), "custom/workflows".into(), "nope".into()],
        ..Layout::default()
    };
    let d = run(&root, &roots);
    assert_eq!(d.skills.len(), 4);
    assert!(
        d.warnings.iter().any(|w| w.contains("`nope`")),
        "{:?}",
        d.warnings
    );
}

#[test]
fn include_and_exclude_take_names_and_globs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    for n in [
        "review-code",
        "review-docs",
        "review-legacy",
        "tdd",
        "triage",
    ] {
        write(&root, &format!("skills/{n}/SKILL.md"), skill_md(n));
    }
    let layout = Layout {
        include: vec!["review-*".into(), "tdd".into(), "nothing-*".into()],
        exclude: vec!["*-legacy".into()],
        ..Layout::default()
    };
    let d = run(&root, &layout);
    let found: Vec<_> = d.skills.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(found, ["review-code", "review-docs", "tdd"]);
    let skipped: Vec<_> = d
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), s.code.as_str()))
        .collect();
    assert!(
        skipped.contains(&("skills/review-legacy", "EXCLUDED")),
        "{skipped:?}"
    );
    assert!(
        skipped.contains(&("skills/triage", "NOT_INCLUDED")),
        "{skipped:?}"
    );
    assert!(
        d.warnings.iter().any(|w| w.contains("nothing-*")),
        "{:?}",
        d.warnings
    );

    let bad = Layout {
        include: vec!["[".into()],
        ..Layout::default()
    };
    let err = bad.validate().unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.starts_with("skills.include"), "{err}");
    let escape = Layout {
        skill_roots: vec!["../up".into()],
        ..Layout::default()
    };
    assert!(escape
        .validate()
        .unwrap_err()
        .message
        .starts_with("layout.skillRoots"));
}

/// A front matter that expands through aliases of aliases (40,000 copies of a 16 KB string:
/// what once made the server allocate 640 MB and more), and one of nothing but brackets: each
/// skips its own skill, naming the file and the bound, and the rest is found.
#[test]
fn expanding_and_deep_front_matters_skip_their_skill_naming_the_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    write(&root, "skills/good/SKILL.md", skill_md("good"));
    let laughs = format!(
        "---\nname: laughs\ndescription: x\na0: &a0 {}\na1: &a1 [{}]\na2: [{}]\n---\nbody\n",
        "x".repeat(16_000),
        vec!["*a0"; 200].join(", "),
        vec!["*a1"; 200].join(", ")
    );
    write(&root, "skills/laughs/SKILL.md", laughs);
    write(
        &root,
        "skills/brackets/SKILL.md",
        format!("---\ndescription: {}\n---\n", "[".repeat(300 << 10)),
    );
    let d = run(&root, &Layout::default());
    assert_eq!(names(&d), [("good", "skills/good")]);
    let skipped: std::collections::BTreeMap<_, _> =
        d.skipped.iter().map(|s| (s.path.as_str(), s)).collect();
    for (path, bound) in [
        ("skills/laughs", "text_bytes"),
        ("skills/brackets", "front_matter_bytes"),
    ] {
        let s = skipped[path];
        assert_eq!(s.code, "TOO_LARGE", "{s:?}");
        assert_eq!(s.details["bound"], bound, "{s:?}");
        assert!(s.details["limit"].as_u64().unwrap() > 0, "{s:?}");
        assert_eq!(s.details["file"], format!("{path}/SKILL.md"), "{s:?}");
        assert!(s.reason.contains(bound), "{s:?}");
    }
    // Within the size bound, the brackets are refused before the YAML parser sees them.
    write(
        &root,
        "skills/brackets/SKILL.md",
        format!("---\ndescription: {}\n---\n", "[".repeat(60 << 10)),
    );
    let d = run(&root, &Layout::default());
    let s = d
        .skipped
        .iter()
        .find(|s| s.path == "skills/brackets")
        .unwrap();
    assert_eq!(s.details["bound"], "flow_openings", "{s:?}");
}

#[test]
fn bad_skills_are_skipped_with_typed_reasons_and_never_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    write(&root, "skills/good/SKILL.md", skill_md("good"));
    let mut huge = skill_md("huge").into_bytes();
    huge.resize(10 << 20, b'x');
    write(&root, "skills/huge/SKILL.md", huge);
    write(
        &root,
        "skills/junk/SKILL.md",
        (0..4096u32)
            .map(|i| (i * 7919 % 251) as u8)
            .collect::<Vec<_>>(),
    );
    write(
        &root,
        "skills/list/SKILL.md",
        "---\n- just\n- a list\n---\n",
    );
    write(
        &root,
        "skills/broken/SKILL.md",
        "---\nname: broken\ndescription: \"unclosed\n---\n",
    );
    write(&root, "skills/nodesc/SKILL.md", "---\nname: nodesc\n---\n");
    fs::create_dir_all(root.join("skills/dirmd/SKILL.md")).unwrap();
    write(
        &root,
        "skills/dirmd/SKILL.md/x",
        "a directory named SKILL.md",
    );
    fs::create_dir_all(root.join("skills/looped")).unwrap();
    symlink("SKILL.md", root.join("skills/looped/SKILL.md")).unwrap();

    let d = run(&root, &Layout::default());
    assert_eq!(names(&d), [("good", "skills/good")]);
    let reasons: std::collections::BTreeMap<_, _> = d
        .skipped
        .iter()
        .map(|s| {
            (
                s.path.trim_start_matches("skills/"),
                (s.code.as_str(), s.reason.as_str()),
            )
        })
        .collect();
    assert_eq!(reasons["huge"].0, "TOO_LARGE");
    assert!(
        reasons["junk"].1.contains("UTF-8") || reasons["junk"].1.contains("binary"),
        "{reasons:?}"
    );
    assert!(reasons["list"].1.contains("not a mapping"), "{reasons:?}");
    assert!(reasons["broken"].1.contains("YAML"), "{reasons:?}");
    assert!(
        reasons["nodesc"].1.contains("no description"),
        "{reasons:?}"
    );
    assert!(
        reasons["dirmd"].1.contains("not a regular file"),
        "{reasons:?}"
    );
    assert!(
        reasons["looped"].1.contains("not a regular file"),
        "{reasons:?}"
    );
    assert_eq!(reasons.len(), 7, "{reasons:?}");
    for (code, _) in reasons.values() {
        assert!(matches!(*code, "TOO_LARGE" | "INVALID_ARGUMENT"), "{code}");
    }
}

#[test]
fn a_single_skill_repository_is_one_skill_named_by_its_front_matter() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    write(&root, "SKILL.md", skill_md("solo"));
    write(&root, "scripts/run.py", "print('hi')");
    let d = run(&root, &Layout::folder());
    assert_eq!(names(&d), [("solo", "")]);
}

#[test]
fn repository_tier_reads_agents_and_claude_skills_through_a_root_symlink() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    write(&project, "skills/shared/SKILL.md", skill_md("shared"));
    write(
        &project,
        ".claude/skills/claude-only/SKILL.md",
        skill_md("claude-only"),
    );
    fs::create_dir_all(project.join(".agents")).unwrap();
    symlink("../skills", project.join(".agents/skills")).unwrap();

    let store = Store::open(tmp.path().join("store")).unwrap();
    let cache = SkillCache::default();
    let sources = stack::repository_sources(&store, &cache, &project).unwrap();
    assert_eq!(sources.len(), 2);
    assert!(sources.iter().all(|s| s.tier == Tier::Repository));
    let index = resolve(&sources, &[]);
    let winners: Vec<_> = index.winners().map(|c| c.name.as_str()).collect();
    assert_eq!(winners, ["claude-only", "shared"]);
    // The source id names where the skills really are.
    let shared = index.winner("shared").unwrap();
    assert!(
        index.source(shared).id.ends_with("/project/skills"),
        "{}",
        index.source(shared).id
    );
}

/// The cache of parsed skills is bounded; what it forgets is read again, with the same result.
#[test]
fn the_skill_cache_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("src");
    for i in 0..20 {
        write(
            &root,
            &format!("skills/s{i:02}/SKILL.md"),
            skill_md(&format!("s{i:02}")),
        );
    }
    let store = Store::open(tmp.path().join("store")).unwrap();
    let tree = store.import_dir(&root, &Limits::default()).unwrap().digest;
    let cache = SkillCache::with_capacity(5);
    let first = discover(&store, &tree, &Layout::default(), &cache).unwrap();
    assert_eq!(first.skills.len(), 20);
    assert_eq!(cache.len(), 5);
    let again = discover(&store, &tree, &Layout::default(), &cache).unwrap();
    assert_eq!(again, first);
    assert_eq!(cache.len(), 5);
}

/// A tree of `width` entries, all naming `child` (a folder), written into `w`.
fn fan(w: &mut cloud_harness_store::cas::Writer<'_>, width: usize, child: Digest) -> Digest {
    let entries = (0..width)
        .map(|i| Entry {
            name: format!("d{i:04}"),
            kind: Kind::Tree,
            size: 0,
            digest: child,
        })
        .collect();
    w.put_tree(&Tree::new(entries).unwrap()).unwrap()
}

fn entry(name: &str, kind: Kind, digest: Digest) -> Entry {
    Entry {
        name: name.into(),
        kind,
        size: 0,
        digest,
    }
}

/// Trees that name the same folders over and over (a handful of objects, 512^4 paths), as a
/// tree that got into the store past its producer's count could be: the search for skill
/// folders stops at its entry budget with TOO_LARGE naming where; a skill holding such a tree
/// is skipped, naming the bound, and the skills beside it are found.
#[test]
fn folders_named_over_and_over_stop_the_walk_at_its_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let mut w = store.writer().unwrap();
    let md = w.put_blob(skill_md("good").as_bytes()).unwrap();
    let leaf = w.put_blob(b"see ../good/SKILL.md\n").unwrap();
    let mut deep = w
        .put_tree(&Tree::new(vec![entry("note.md", Kind::File, leaf)]).unwrap())
        .unwrap();
    for _ in 0..4 {
        deep = fan(&mut w, 512, deep);
    }
    let good = w
        .put_tree(&Tree::new(vec![entry("SKILL.md", Kind::File, md)]).unwrap())
        .unwrap();
    let bad_md = w.put_blob(skill_md("vast").as_bytes()).unwrap();
    let vast = w
        .put_tree(
            &Tree::new(vec![
                entry("SKILL.md", Kind::File, bad_md),
                entry("refs", Kind::Tree, deep),
            ])
            .unwrap(),
        )
        .unwrap();
    let skills = w
        .put_tree(
            &Tree::new(vec![
                entry("good", Kind::Tree, good),
                entry("vast", Kind::Tree, vast),
            ])
            .unwrap(),
        )
        .unwrap();
    let with_skill = w
        .put_tree(&Tree::new(vec![entry("skills", Kind::Tree, skills)]).unwrap())
        .unwrap();
    let categories = w
        .put_tree(
            &Tree::new(vec![
                entry("skills", Kind::Tree, deep),
                entry("other", Kind::Tree, skills),
            ])
            .unwrap(),
        )
        .unwrap();
    w.commit().unwrap();

    let found = discover(
        &store,
        &with_skill,
        &Layout::default(),
        &SkillCache::default(),
    )
    .unwrap();
    assert_eq!(names(&found), [("good", "skills/good")]);
    assert_eq!(found.skipped.len(), 1, "{:?}", found.skipped);
    assert_eq!(found.skipped[0].path, "skills/vast");
    assert_eq!(found.skipped[0].code, "TOO_LARGE");
    assert_eq!(found.skipped[0].details["limit"], MAX_WALK_ENTRIES);

    let e = discover(
        &store,
        &categories,
        &Layout::default(),
        &SkillCache::default(),
    )
    .unwrap_err();
    assert_eq!(e.code, Code::TooLarge, "{e}");
    assert!(e.message.starts_with("`skills/d"), "{e}");
    assert_eq!(e.details["bound"], "walk_entries");
}

/// A root named twice, or inside another, finds each skill folder once.
#[test]
fn a_skill_folder_reached_by_two_roots_is_found_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("kit");
    write(&root, "skills/a/SKILL.md", skill_md("a"));
    write(&root, "skills/cat/b/SKILL.md", skill_md("b"));
    let layout = Layout {
        skill_roots: vec![
            "skills".into(),
            "./skills/".into(),
            "skills/cat".into(),
            ".".into(),
        ],
        ..Layout::default()
    };
    let found = run(&root, &layout);
    assert_eq!(names(&found), [("a", "skills/a"), ("b", "skills/cat/b")]);
}

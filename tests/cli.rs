//! The `cloud-harness` command line, as a user runs it.

use serde_json::Value;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

fn harness(store: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
        .args(args)
        .env("TOOLKIT_CACHE_ROOT", store)
        .output()
        .unwrap()
}

fn write(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

fn skill(root: &Path, rel: &str, name: &str, body: &str) {
    write(
        root,
        &format!("{rel}/SKILL.md"),
        &format!("---\nname: {name}\ndescription: {name} from {rel}\n---\n{body}\n"),
    );
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn skill_named<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["skills"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no skill {name} in {doc:#}"))
}

#[test]
fn resolve_json_reports_winners_shadowed_skipped_and_warnings() {
    let tmp = tempfile::tempdir().unwrap();
    let (owner, ws, project) = (
        tmp.path().join("owner"),
        tmp.path().join("ws"),
        tmp.path().join("project"),
    );
    skill(
        &owner,
        "engineering/tdd",
        "tdd",
        "owner copy, see ../cloud-harness-skills/SKILL.md",
    );
    // A sibling that the built-in tier shadows: tdd's link leads elsewhere in the merged view.
    skill(
        &owner,
        "engineering/cloud-harness-skills",
        "cloud-harness-skills",
        "owner's",
    );
    skill(&ws, "tdd", "tdd", "workspace copy");
    skill(&ws, "review", "review", "workspace review");
    skill(
        &project,
        ".agents/skills/review",
        "review",
        "repository review",
    );
    skill(&project, ".claude/skills/lint", "lint", "repository lint");
    write(
        &project,
        ".claude/skills/broken/SKILL.md",
        "---\nname: broken\n---\n",
    );
    // A repository copy of a built-in skill is shadowed by the built-in tier.
    skill(
        &project,
        ".claude/skills/cloud-harness-skills",
        "cloud-harness-skills",
        "mine",
    );

    let o = owner.to_str().unwrap();
    let w = ws.to_str().unwrap();
    let p = project.to_str().unwrap();
    let out = harness(
        &tmp.path().join("store"),
        &[
            "skills",
            "resolve",
            "--owner",
            o,
            "--workspace",
            w,
            "--repository",
            p,
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json(&out);

    let tdd = skill_named(&doc, "tdd");
    assert_eq!(tdd["tier"], "owner");
    assert!(tdd["source"].as_str().unwrap().starts_with("owner:"));
    assert!(tdd["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(tdd["shadowed"][0]["tier"], "workspace");

    let review = skill_named(&doc, "review");
    assert_eq!(review["tier"], "workspace");
    assert_eq!(review["shadowed"][0]["tier"], "repository");
    assert_eq!(skill_named(&doc, "lint")["tier"], "repository");

    let builtin = skill_named(&doc, "cloud-harness-skills");
    assert_eq!(builtin["tier"], "builtin");
    assert_eq!(builtin["shadowed"][0]["tier"], "owner");
    assert_eq!(builtin["shadowed"][1]["tier"], "repository");

    let skipped = doc["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0]["path"], "broken");
    assert_eq!(skipped[0]["code"], "INVALID_ARGUMENT");

    // tdd (owner) links to its sibling, which the merged view serves from the built-in tier.
    let warnings = doc["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w["skill"] == "tdd"
            && w["message"]
                .as_str()
                .unwrap()
                .contains("../cloud-harness-skills/")),
        "{warnings:?}"
    );
    assert_eq!(doc["conflicts"].as_array().unwrap().len(), 0);
}

#[test]
fn builtin_skills_are_valid_and_can_be_left_out() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let doc = json(&harness(&store, &["skills", "resolve", "--json"]));
    let builtins: Vec<&Value> = doc["skills"].as_array().unwrap().iter().collect();
    assert!(builtins.len() >= 2, "{doc:#}");
    for s in &builtins {
        assert_eq!(s["tier"], "builtin");
        let description = s["description"].as_str().unwrap();
        assert!(!description.is_empty() && description.chars().count() <= 1024);
    }
    // Valid per the Agent Skills spec: no warnings of any kind.
    assert_eq!(
        doc["warnings"].as_array().unwrap().len(),
        0,
        "{:#}",
        doc["warnings"]
    );
    assert_eq!(doc["skipped"].as_array().unwrap().len(), 0);

    let none = json(&harness(
        &store,
        &["skills", "resolve", "--no-builtin", "--json"],
    ));
    assert_eq!(none["skills"].as_array().unwrap().len(), 0);
}

#[test]
fn a_same_tier_conflict_exits_1_until_an_override_settles_it() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    skill(&a, "review", "review", "from a");
    skill(&b, "review", "review", "from b");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());

    let out = harness(
        &store,
        &[
            "skills",
            "resolve",
            "--no-builtin",
            "--owner",
            a,
            "--owner",
            b,
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("CONFLICT") && stderr.contains("review"),
        "{stderr}"
    );
    let doc = json(&out);
    assert_eq!(
        doc["skills"].as_array().unwrap().len(),
        0,
        "a conflicted skill is not served"
    );
    let conflict = &doc["conflicts"][0];
    assert_eq!(conflict["skill"], "review");
    assert_eq!(conflict["status"], 409);
    let sources: Vec<_> = conflict["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["source"].clone())
        .collect();
    assert_eq!(sources, [format!("owner:{a}"), format!("owner:{b}")]);

    let choice = format!("review=owner:{b}");
    let out = harness(
        &store,
        &[
            "skills",
            "resolve",
            "--no-builtin",
            "--owner",
            a,
            "--owner",
            b,
            "--override",
            &choice,
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json(&out);
    let review = skill_named(&doc, "review");
    assert_eq!(review["source"], format!("owner:{b}"));
    assert_eq!(review["settledByOverride"], true);
    assert_eq!(review["shadowed"][0]["source"], format!("owner:{a}"));
}

#[test]
fn human_output_lists_skills_and_bad_paths_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let out = harness(&store, &["skills", "resolve"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("cloud-harness-skills") && text.contains("builtin"),
        "{text}"
    );

    let missing = tmp.path().join("missing");
    let out = harness(
        &store,
        &["skills", "resolve", "--owner", missing.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("NOT_FOUND") && stderr.contains("missing"),
        "{stderr}"
    );
}

#[test]
fn cas_verify_exits_1_naming_a_corrupt_object() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = tmp.path().join("dir");
    write(&dir, "a.txt", "hello");
    let out = harness(
        &store,
        &["cas", "import", dir.to_str().unwrap(), "--root", "test/dir"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(harness(&store, &["cas", "verify"]).status.success());

    // sha256("hello")
    let hex = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    let blob = store.join("objects/blob").join(&hex[..2]).join(&hex[2..]);
    let mut perms = fs::metadata(&blob).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
    fs::set_permissions(&blob, perms).unwrap();
    fs::write(&blob, "jello").unwrap();
    let out = harness(&store, &["cas", "verify", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report = json(&out);
    assert_eq!(report["problems"][0]["problem"], "corrupt");
    assert!(report["problems"][0]["object"]
        .as_str()
        .unwrap()
        .contains(hex));
}

/// A skill at the top of a folder takes its name from front matter; a name that is a path, a
/// hidden name or one longer than a file name can be is skipped with its reason, never used.
#[test]
fn front_matter_names_that_are_paths_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let long = "x".repeat(300);
    for (i, name) in [
        "../repo", "/usr/bin", "a/b", ".hidden", &long, "..", "a\\\\b",
    ]
    .iter()
    .enumerate()
    {
        let dir = tmp.path().join(format!("top-{i}"));
        write(
            &dir,
            "SKILL.md",
            &format!("---\nname: \"{name}\"\ndescription: A hostile name.\n---\nBody.\n"),
        );
        let out = harness(
            &store,
            &[
                "skills",
                "resolve",
                "--no-builtin",
                "--owner",
                dir.to_str().unwrap(),
                "--json",
            ],
        );
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc = json(&out);
        assert_eq!(doc["skills"], serde_json::json!([]), "{name}: {doc}");
        let reason = doc["skipped"][0]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("skill name"), "{name}: {doc}");
        assert_eq!(
            doc["skipped"][0]["code"], "INVALID_ARGUMENT",
            "{name}: {doc}"
        );
    }
    // An ordinary one is served under its name.
    let dir = tmp.path().join("fine");
    write(
        &dir,
        "SKILL.md",
        "---\nname: fine\ndescription: Fine.\n---\nBody.\n",
    );
    let doc = json(&harness(
        &store,
        &[
            "skills",
            "resolve",
            "--no-builtin",
            "--owner",
            dir.to_str().unwrap(),
            "--json",
        ],
    ));
    assert_eq!(doc["skills"][0]["name"], "fine", "{doc}");
}

/// `serve` on stdio with its state under `dir`, all three streams piped.
fn stdio_server(dir: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
        .args(["serve", "--no-mount"])
        .env("TOOLKIT_CACHE_ROOT", dir.join("store"))
        .env("CLOUD_HARNESS_HOME", dir.join("home"))
        .env("CLOUD_HARNESS_EXECUTOR", "none")
        .env("CLOUD_HARNESS_STANDBY_HELPERS", "0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A stdio client that goes away before a session begins (nothing sent, or only
/// `server/discover`, as SDKs probing a server do) ends `serve` normally: exit 0.
#[test]
fn serve_on_stdio_ends_with_0_when_the_client_leaves_before_a_session() {
    let tmp = tempfile::tempdir().unwrap();
    let discover = r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}"#;
    for input in ["", discover] {
        let mut child = stdio_server(tmp.path());
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            writeln!(stdin, "{input}").unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{input:?}: {stderr}");
        assert!(!stderr.contains("error"), "{stderr}");
        if !input.is_empty() {
            let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(answer["id"], 1, "{answer}");
        }
    }
}

/// On stdio every line gets an answer: a line that is not JSON, a batch, one that is not a
/// JSON-RPC message, and one over 16 MiB get their JSON-RPC errors, and the server goes on.
#[test]
fn serve_on_stdio_answers_every_malformed_line() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = stdio_server(tmp.path());
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let huge = format!(
            r#"{{"jsonrpc":"2.0","id":9,"x":"{}"}}"#,
            "a".repeat(17 << 20)
        );
        for line in [
            "{not json",
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            r#"{"jsonrpc":"2.0","id":2}"#,
            &huge,
            r#"{"jsonrpc":"2.0","id":3,"method":"server/discover","params":{}}"#,
        ] {
            writeln!(stdin, "{line}").unwrap();
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Answers come as they are ready, not in the order asked (JSON-RPC pairs them by id).
    let mut codes: Vec<(String, i64)> = answers
        .iter()
        .map(|a| {
            (
                a["id"].to_string(),
                a["error"]["code"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    codes.sort();
    let mut want = vec![
        ("null".to_owned(), -32700),
        ("null".to_owned(), -32600),
        ("2".to_owned(), -32600),
        ("null".to_owned(), -32600),
    ];
    want.sort();
    // And the server went on to answer the next line (with whatever its answer is).
    let next = codes
        .iter()
        .position(|(id, _)| id == "3")
        .expect("line 5 answered");
    codes.remove(next);
    assert_eq!(codes, want, "{answers:?}");
}

/// `cas verify` and `cas gc` draw a progress bar on a terminal (a pseudo-terminal made by
/// `script`), and nothing but their output when stderr is not one.
#[test]
fn long_commands_draw_a_bar_on_a_terminal_and_none_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let src = tmp.path().join("src");
    for i in 0..50 {
        write(&src, &format!("f{i}.txt"), &format!("file {i}\n"));
    }
    let imported = harness(
        &store,
        &["cas", "import", src.to_str().unwrap(), "--root", "kept"],
    );
    assert!(imported.status.success(), "{imported:?}");

    for args in [["cas", "verify"], ["cas", "gc"]] {
        let plain = harness(&store, &args);
        assert!(plain.status.success(), "{plain:?}");
        let err = String::from_utf8_lossy(&plain.stderr);
        assert!(!err.contains(args[1]), "a bar without a terminal: {err}");

        let line = format!("{BIN} {}", args.join(" "));
        let tty = Command::new("script")
            .args(["-qfec", &line, "/dev/null"])
            .env("TOOLKIT_CACHE_ROOT", &store)
            .output()
            .unwrap();
        assert!(tty.status.success(), "{tty:?}");
        let shown = String::from_utf8_lossy(&tty.stdout);
        let done = match args[1] {
            "verify" => "cas verify: 51 objects hashed",
            _ => "cas gc: 0 objects removed",
        };
        assert!(shown.contains(done), "no bar on a terminal: {shown}");
        if args[1] == "verify" {
            assert!(shown.contains("hashing blobs ["), "{shown}");
        }
    }
}

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

//! What a pin's move would change, before it moves: a registry entry of a local HTTPS git
//! server's toolkit, pinned at a first commit, compared with a second one through the API
//! (`POST /api/v1/registry/{id}/diff`) and the CLI: every kind of change, exactly, and the open
//! workspace still serving the old bundle; nothing pinned by the comparison.

use crate::support;

use serde_json::{json, Value};
use support::api::{github_world, mcp_session, tool};
use support::{dir, file, Certs, GitServer, Node, Repo};

/// An added skill that breaks the specification (an unknown field).
const TRIAGE: &str = "---\nname: triage\ndescription: Triage an issue.\nversion: 2\n---\nTriage.\n";

fn skill_md(name: &str, description: &str, body: &str) -> Node {
    file(&format!(
        "---\nname: {name}\ndescription: {description}\n---\n{body}"
    ))
}

/// A workspace opened through MCP on `toolkit`: its id.
fn open_on(w: &support::api::World, key: &str, toolkit: Value) -> String {
    let session = mcp_session(w.server.addr, &w.operator);
    let opened = tool(
        w.server.addr,
        &w.operator,
        &session,
        "workspace_open",
        json!({"idempotencyKey": key, "toolkits": [toolkit]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn exec(text: &str) -> Node {
    Node::Exec(text.as_bytes().to_vec())
}

/// The diff with each skill's digests checked (present where they should be, different where
/// the folder changed) and taken out, and each problem's message checked and taken out: what
/// is left is compared whole.
fn comparable(diff: &Value) -> Value {
    let mut d = diff.clone();
    for s in d["skills"].as_array_mut().unwrap() {
        let o = s.as_object_mut().unwrap();
        let before = o.remove("digestBefore");
        let after = o.remove("digestAfter");
        match o["change"].as_str().unwrap() {
            "added" => assert!(before.is_none() && after.is_some(), "{diff}"),
            "removed" => assert!(before.is_some() && after.is_none(), "{diff}"),
            _ => assert!(
                before.is_some() && after.is_some() && before != after,
                "{diff}"
            ),
        }
        for side in ["problemsBefore", "problemsAfter"] {
            for p in o[side].as_array_mut().unwrap() {
                let msg = p.as_object_mut().unwrap().remove("message").unwrap();
                assert!(!msg.as_str().unwrap().is_empty());
            }
        }
    }
    d
}

/// A server and a git server with `team/kit.git` at two commits that differ every way.
struct Kit {
    w: support::api::World,
    git: GitServer,
    first: String,
    second: String,
    _certs: Certs,
}

fn kit() -> Kit {
    let tmp = tempfile::tempdir().unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let repo = Repo::create(&repos, "team/kit.git", false);
    let steady = || {
        (
            "steady",
            dir(vec![(
                "SKILL.md",
                skill_md("steady", "Never changes.", "Same.\n"),
            )]),
        )
    };
    let first = repo.commit(dir(vec![(
        "skills",
        dir(vec![
            (
                "lint",
                dir(vec![
                    (
                        "SKILL.md",
                        skill_md(
                            "lint",
                            "Lint the code.",
                            "# Lint\n\nRun `scripts/run.sh`.\nThen read the guide.\n",
                        ),
                    ),
                    (
                        "scripts",
                        dir(vec![("run.sh", exec("#!/bin/sh\necho one\n"))]),
                    ),
                    ("references", dir(vec![("guide.md", file("Two spaces.\n"))])),
                ]),
            ),
            (
                "fmt",
                dir(vec![
                    ("SKILL.md", skill_md("fmt", "Format the code.", "Format.\n")),
                    ("tool.sh", file("#!/bin/sh\necho fmt\n")),
                ]),
            ),
            (
                "old-name",
                dir(vec![
                    (
                        "SKILL.md",
                        skill_md("old-name", "Deploys the app.", "Deploy.\n"),
                    ),
                    (
                        "scripts",
                        dir(vec![("deploy.sh", exec("#!/bin/sh\necho deploy\n"))]),
                    ),
                ]),
            ),
            (
                "gone",
                dir(vec![("SKILL.md", skill_md("gone", "Goes away.", "Bye.\n"))]),
            ),
            steady(),
        ]),
    )]));
    let second = repo.commit(dir(vec![(
        "skills",
        dir(vec![
            (
                "lint",
                dir(vec![
                    ("SKILL.md", skill_md("lint", "Lint the code.", "# Lint\n\nRun `scripts/run.sh` and `scripts/check.sh`.\nThen read the guide.\n")),
                    (
                        "scripts",
                        dir(vec![
                            ("run.sh", exec("#!/bin/sh\necho two, longer\n")),
                            ("check.sh", exec("#!/bin/sh\ntrue\n")),
                        ]),
                    ),
                ]),
            ),
            (
                "fmt",
                dir(vec![
                    ("SKILL.md", skill_md("fmt", "Format the code.", "Format.\n")),
                    ("tool.sh", exec("#!/bin/sh\necho fmt\n")),
                ]),
            ),
            (
                "new-name",
                dir(vec![
                    ("SKILL.md", skill_md("new-name", "Deploys the app.", "Deploy.\n")),
                    ("scripts", dir(vec![("deploy.sh", exec("#!/bin/sh\necho deploy\n"))])),
                ]),
            ),
            ("triage", dir(vec![("SKILL.md", file(TRIAGE))])),
            steady(),
        ]),
    )]));
    let git = GitServer::start(&repos, &certs);
    let w = github_world(tmp, &git, &certs);
    Kit {
        w,
        git,
        first,
        second,
        _certs: certs,
    }
}

#[test]
fn a_pin_move_is_shown_skill_by_skill_and_file_by_file_before_it_is_made() {
    let Kit {
        w,
        git,
        first,
        second,
        _certs,
    } = kit();
    let url = git.url("team/kit.git");
    w.op(
        "POST",
        "/api/v1/registry",
        Some(json!({"id": "team/kit", "name": "Team kit", "description": "The team's skills.", "url": url, "commit": first})),
    );
    // A workspace opened on the pin serves the first commit's bundle.
    let ws = open_on(
        &w,
        "on-the-pin",
        json!({"kind": "preset", "id": "team/kit"}),
    );

    let answer = w.op(
        "POST",
        "/api/v1/registry/team/kit/diff",
        Some(json!({"to": second})),
    );
    let diff = &answer["diff"];
    assert_eq!(
        (&diff["from"]["commit"], &diff["to"]["commit"]),
        (&json!(first), &json!(second))
    );
    let me = w.op("GET", "/api/v1/whoami", None)["actor"].clone();
    assert_eq!(
        answer["servingFrom"],
        json!([{"workspace": ws, "owner": me}]),
        "{answer}"
    );
    let file = |path: &str,
                change: &str,
                before: Option<u64>,
                after: Option<u64>,
                xb: bool,
                xa: bool,
                script: bool| {
        let kind = |x: bool| if x { "executable" } else { "file" };
        let mut f = json!({"path": path, "change": change, "script": script});
        if let Some(b) = before {
            f["sizeBefore"] = json!(b);
            f["kindBefore"] = json!(kind(xb));
        }
        if let Some(a) = after {
            f["sizeAfter"] = json!(a);
            f["kindAfter"] = json!(kind(xa));
        }
        f
    };
    let md = |name: &str, description: &str, body: &str| {
        format!("---\nname: {name}\ndescription: {description}\n---\n{body}").len() as u64
    };
    let lint_md = |body: &str| md("lint", "Lint the code.", body);
    let want = json!([
        {"name": "fmt", "change": "changed", "files": [file("tool.sh", "mode", Some(19), Some(19), false, true, true)],
         "scriptsChanged": 1, "filesLeftOut": 0, "problemsBefore": [], "problemsAfter": []},
        {"name": "gone", "change": "removed",
         "files": [file("SKILL.md", "removed", Some(md("gone", "Goes away.", "Bye.\n")), None, false, false, false)],
         "scriptsChanged": 0, "filesLeftOut": 0,
         "skillMd": {"unified": "--- a/SKILL.md\n+++ b/SKILL.md\n@@ -1,5 +0,0 @@\n----\n-name: gone\n-description: Goes away.\n----\n-Bye.\n", "truncated": false},
         "problemsBefore": [], "problemsAfter": []},
        {"name": "lint", "change": "changed", "files": [
            file("scripts/check.sh", "added", None, Some(15), false, true, true),
            file("scripts/run.sh", "modified", Some(19), Some(27), true, true, true),
            file("SKILL.md", "modified",
                 Some(lint_md("# Lint\n\nRun `scripts/run.sh`.\nThen read the guide.\n")),
                 Some(lint_md("# Lint\n\nRun `scripts/run.sh` and `scripts/check.sh`.\nThen read the guide.\n")),
                 false, false, false),
            file("references/guide.md", "removed", Some(12), None, false, false, false),
         ],
         "scriptsChanged": 2, "filesLeftOut": 0,
         "skillMd": {"unified": "--- a/SKILL.md\n+++ b/SKILL.md\n@@ -4,5 +4,5 @@\n ---\n # Lint\n \n-Run `scripts/run.sh`.\n+Run `scripts/run.sh` and `scripts/check.sh`.\n Then read the guide.\n", "truncated": false},
         "problemsBefore": [], "problemsAfter": []},
        {"name": "new-name", "change": "renamed", "renamedFrom": "old-name", "files": [
            file("SKILL.md", "modified", Some(md("old-name", "Deploys the app.", "Deploy.\n")),
                 Some(md("new-name", "Deploys the app.", "Deploy.\n")), false, false, false),
         ],
         "scriptsChanged": 0, "filesLeftOut": 0,
         "skillMd": {"unified": "--- a/SKILL.md\n+++ b/SKILL.md\n@@ -1,5 +1,5 @@\n ---\n-name: old-name\n+name: new-name\n description: Deploys the app.\n ---\n Deploy.\n", "truncated": false},
         "problemsBefore": [], "problemsAfter": []},
        {"name": "triage", "change": "added",
         "files": [file("SKILL.md", "added", None, Some(TRIAGE.len() as u64), false, false, false)],
         "scriptsChanged": 0, "filesLeftOut": 0,
         "skillMd": {"unified": format!("--- a/SKILL.md\n+++ b/SKILL.md\n@@ -0,0 +1,6 @@\n{}", TRIAGE.lines().map(|l| format!("+{l}\n")).collect::<String>()), "truncated": false},
         "problemsBefore": [], "problemsAfter": [{"rule": "field-unknown"}]},
    ]);
    let got = comparable(diff);
    assert_eq!(
        got["skills"],
        want,
        "{}",
        serde_json::to_string_pretty(&got).unwrap()
    );
    assert_eq!(
        (
            &got["unchanged"],
            &got["problemsBefore"],
            &got["problemsAfter"],
            &got["filesLeftOut"]
        ),
        (&json!(1), &json!(0), &json!(1), &json!(0))
    );

    // Nothing moved: the pin is the first commit still.
    let entry = w.op("GET", "/api/v1/registry/team/kit", None);
    assert_eq!(entry["entry"]["pin"]["commit"], json!(first));
    // The other way, named explicitly, from the command line: each change turned around.
    // (Both commits are in the store: nothing is fetched, but the allowlist is still asked.)
    let (code, out) = w.cli_with(
        &["registry", "diff", "team/kit", &first, "--from", &second],
        &[("ALLOWED_GIT_HOSTS", &git.host())],
    );
    assert_eq!(code, 0, "{out}");
    let back: Value = serde_json::from_str(&out).unwrap();
    let changes: Vec<(String, String)> = back["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["change"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let pairs = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        changes,
        pairs(&[
            ("fmt", "changed"),
            ("gone", "added"),
            ("lint", "changed"),
            ("old-name", "renamed"),
            ("triage", "removed")
        ])
    );
    // A commit the repository does not have is refused, and pins nothing.
    let (status, refused) = w.call(
        "POST",
        "/api/v1/registry/team/kit/diff",
        Some(&w.operator),
        Some(&json!({"to": "0".repeat(40)}).to_string()),
    );
    assert!(status >= 400, "{status} {refused}");
    let (status, refused) = w.call(
        "POST",
        "/api/v1/registry/team/kit/diff",
        Some(&w.operator),
        Some(&json!({"to": second, "extra": 1}).to_string()),
    );
    assert_eq!(status, 400, "{refused}");
    let (status, refused) = w.call(
        "POST",
        "/api/v1/registry/team/kit/diff",
        Some(&w.operator),
        Some(&json!({"to": "main"}).to_string()),
    );
    assert_eq!(
        (status, &refused["details"]["field"]),
        (400, &json!("to")),
        "{refused}"
    );
    let (status, _) = w.call(
        "POST",
        "/api/v1/registry/team/nope/diff",
        Some(&w.operator),
        Some(&json!({"to": second}).to_string()),
    );
    assert_eq!(status, 404);
    // A client may not compare (a comparison may fetch).
    let client = w.client("reader");
    let (status, _) = w.call(
        "POST",
        "/api/v1/registry/team/kit/diff",
        Some(&client),
        Some(&json!({"to": second}).to_string()),
    );
    assert_eq!(status, 403);
    assert_eq!(
        w.op("GET", "/api/v1/registry/team/kit", None)["entry"]["pin"]["commit"],
        json!(first)
    );
    // The comparison is in the audit log.
    let audit = w.op("GET", "/api/v1/audit?action=registry.diff", None);
    assert!(!audit["entries"].as_array().unwrap().is_empty(), "{audit}");
    // A move confirmed against the pin it was compared with: refused once another moved it.
    let (status, moved) = w.call(
        "POST",
        "/api/v1/registry/team/kit/pin",
        Some(&w.operator),
        Some(&json!({"commit": second, "from": second}).to_string()),
    );
    assert_eq!(
        (status, &moved["code"]),
        (409, &json!("CONFLICT")),
        "{moved}"
    );
    let moved = w.op(
        "POST",
        "/api/v1/registry/team/kit/pin",
        Some(json!({"commit": second, "from": first})),
    );
    assert_eq!(moved["commit"], json!(second));
}

#[test]
fn a_sets_new_revision_is_shown_as_the_skills_its_workspaces_would_serve() {
    let Kit {
        w,
        git,
        first,
        second,
        _certs,
    } = kit();
    let url = git.url("team/kit.git");
    let member = |commit: &str, exclude: &[&str]| json!({"kind": "git", "url": url, "instanceId": "kit", "ref": commit, "skills": {"exclude": exclude}});
    w.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "team", "members": [member(&first, &[])]})),
    );
    // One revision: nothing before it.
    let (status, refused) = w.call("POST", "/api/v1/sets/team/diff", Some(&w.operator), None);
    assert_eq!(
        (status, &refused["details"]["field"]),
        (400, &json!("from")),
        "{refused}"
    );
    // A workspace of revision 1, then revision 2: the second commit, fmt excluded.
    let ws = open_on(&w, "set-1", json!({"kind": "set", "id": "team"}));
    w.op(
        "PUT",
        "/api/v1/sets/team",
        Some(json!({"revision": 1, "members": [member(&second, &["fmt"])]})),
    );
    let d = w.op("POST", "/api/v1/sets/team/diff", None);
    assert_eq!((&d["from"], &d["to"]), (&json!(1), &json!(2)), "{d}");
    let changes: Vec<(&str, &str)> = d["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["change"].as_str().unwrap()))
        .collect();
    assert_eq!(
        changes,
        [
            ("fmt", "removed"),
            ("gone", "removed"),
            ("lint", "changed"),
            ("new-name", "renamed"),
            ("triage", "added"),
        ],
        "{d}"
    );
    assert_eq!(
        (&d["conflictsBefore"], &d["conflictsAfter"]),
        (&json!([]), &json!([]))
    );
    // steady, and the built-in tier's three.
    assert_eq!(d["unchanged"], json!(4), "{d}");
    let me = w.op("GET", "/api/v1/whoami", None)["actor"].clone();
    assert_eq!(
        d["servingFrom"],
        json!([{"workspace": ws, "owner": me}]),
        "{d}"
    );
    // Named revisions, the other way: each change turned around; an unknown one refused.
    let back = w.op(
        "POST",
        "/api/v1/sets/team/diff",
        Some(json!({"from": 2, "to": 1})),
    );
    assert_eq!(back["servingFrom"], json!([]), "{back}");
    assert_eq!(back["skills"].as_array().unwrap().len(), 5, "{back}");
    let (status, _) = w.call(
        "POST",
        "/api/v1/sets/team/diff",
        Some(&w.operator),
        Some(&json!({"from": 1, "to": 9}).to_string()),
    );
    assert_eq!(status, 404);
}

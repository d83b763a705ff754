//! The library through the API, against a real `serve --http` on loopback: every skill of the
//! store and the built-in tier, searched, filtered and paged, with where each is used.

use crate::support;

use serde_json::{json, Value};
use support::api::{warm_world, World};
use support::{dir, file, skill};

fn setup() -> (World, Value, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let a_src = tmp.path().join("src/kit-a");
    support::materialize(
        &a_src,
        &dir(vec![(
            "alpha",
            dir(vec![
                ("SKILL.md", file("---\nname: alpha\ndescription: Reviews pull requests carefully.\n---\nReview.\n")),
                ("references", dir(vec![("checklist.md", file("- tests\n"))])),
            ]),
        )]),
    );
    let a = serde_json::to_value(support::warm_toolkit(&store, &a_src, "kit-a")).unwrap();
    let b_src = tmp.path().join("src/kit-b");
    support::materialize(
        &b_src,
        &dir(vec![
            ("beta", skill("beta", "Body.")),
            ("gamma", skill("gamma", "Body.")),
        ]),
    );
    let b = serde_json::to_value(support::warm_toolkit(&store, &b_src, "kit-b")).unwrap();
    let w = warm_world(tmp);
    (w, a, b)
}

fn names(v: &Value) -> Vec<String> {
    let mut n: Vec<String> = v["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    n.sort();
    n
}

#[test]
fn the_library_finds_every_skill_and_says_where_each_is_used() {
    let (w, a, _) = setup();
    let all = w.op("GET", "/api/v1/skills?limit=500", None);
    assert_eq!(all["total"], 6, "{all}");
    assert_eq!(
        names(&w.op("GET", "/api/v1/skills?tier=builtin", None)).len(),
        3
    );
    assert_eq!(
        names(&w.op("GET", "/api/v1/skills?toolkit=kit-b", None)),
        ["beta", "gamma"]
    );
    // Every word, any case, in the name, the description or the toolkit.
    assert_eq!(
        names(&w.op("GET", "/api/v1/skills?q=PULL%20requests", None)),
        ["alpha"]
    );
    assert_eq!(
        names(&w.op("GET", "/api/v1/skills?q=kit-b%20gam", None)),
        ["gamma"]
    );
    assert_eq!(
        w.op("GET", "/api/v1/skills?q=nothing-like-it", None)["total"],
        0
    );
    // Paged.
    let first = w.op("GET", "/api/v1/skills?limit=4", None);
    assert_eq!(first["skills"].as_array().unwrap().len(), 4);
    let rest = w.op(
        "GET",
        &format!(
            "/api/v1/skills?limit=4&cursor={}",
            first["nextCursor"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(rest["skills"].as_array().unwrap().len(), 2);
    assert!(rest.get("nextCursor").is_none());

    // The CLI searches the same library.
    let (code, out) = w.cli(&["library", "pull", "REQUESTS"]);
    assert_eq!(code, 0, "{out}");
    let found: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (found["total"].as_i64(), found["skills"][0]["name"].as_str()),
        (Some(1), Some("alpha"))
    );
    // Used by a set, then by a workspace opened from it.
    w.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "reviewers", "members": [a]})),
    );
    let session = w.session();
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "k", "toolkits": [{"kind": "set", "id": "reviewers"}]}),
    );
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let found = w.op("GET", "/api/v1/skills?q=alpha", None);
    let alpha = &found["skills"][0];
    assert_eq!(
        (alpha["toolkit"].as_str(), alpha["tier"].as_str()),
        (Some("kit-a"), Some("store"))
    );
    assert_eq!(
        alpha["usedBy"]["sets"],
        json!([{"id": "reviewers", "revision": 1}]),
        "{alpha}"
    );
    assert_eq!(alpha["usedBy"]["workspaces"], json!([ws]), "{alpha}");
    assert!(alpha["url"].is_string() && alpha["commit"].is_string() && alpha["bundle"].is_string());
    let one = w.op(
        "GET",
        &format!("/api/v1/skills/{}", alpha["digest"].as_str().unwrap()),
        None,
    );
    let files: Vec<&str> = one["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["SKILL.md", "references/checklist.md"]);
    assert_eq!(one["copies"].as_array().unwrap().len(), 1);
    // The built-in skills are used by every workspace.
    let builtin = w.op("GET", "/api/v1/skills?tier=builtin", None);
    assert!(
        builtin["skills"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["usedBy"]["workspaces"] == json!([ws])),
        "{builtin}"
    );

    for (path, code) in [
        ("/api/v1/skills?limit=0", "INVALID_ARGUMENT"),
        ("/api/v1/skills?tier=owner", "INVALID_ARGUMENT"),
        ("/api/v1/skills?cursor=xyz", "INVALID_ARGUMENT"),
        ("/api/v1/skills?sort=name", "INVALID_ARGUMENT"),
        ("/api/v1/skills/not-a-digest", "INVALID_ARGUMENT"),
    ] {
        let (_, v) = w.call("GET", path, Some(&w.operator), None);
        assert_eq!(v["code"], code, "{path}: {v}");
    }
    let unknown = format!("/api/v1/skills/sha256:{}", "0".repeat(64));
    assert_eq!(w.call("GET", &unknown, Some(&w.operator), None).0, 404);
}

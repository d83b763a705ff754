//! Skill sets through the API and the CLI, against a real `serve --http` on loopback: made,
//! edited by revision (a stale edit refused), expanded by `workspace_open`, replayed after an
//! edit, bad members refused with nothing stored.

use crate::support;

use serde_json::{json, Value};
use support::api::{mcp_session, tool, warm_world, World};
use support::{dir, skill};

/// A server whose store holds two warm toolkits, `kit-a` (skill `alpha`) and `kit-b` (skill
/// `beta`); their specs.
fn setup() -> (World, Value, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let make = |name: &str, skill_name: &str| {
        let src = tmp.path().join("src").join(name);
        support::materialize(&src, &dir(vec![(skill_name, skill(skill_name, "Body."))]));
        serde_json::to_value(support::warm_toolkit(&store, &src, name)).unwrap()
    };
    let a = make("kit-a", "alpha");
    let b = make("kit-b", "beta");
    let w = warm_world(tmp);
    (w, a, b)
}

fn names(result: &Value) -> Vec<String> {
    let mut n: Vec<String> = result["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .filter(|n| !n.starts_with("cloud-harness"))
        .collect();
    n.sort();
    n
}

#[test]
fn a_set_is_made_and_edited_by_revision_and_a_stale_edit_is_refused() {
    let (w, a, b) = setup();
    let made = w.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "backend-team", "description": "What the backend team uses.", "members": [a, b]})),
    );
    assert_eq!(made["revision"], 1);
    assert_eq!(made["actor"], "token:operator");
    // Two operators read revision 1; the first edit wins, the second is told.
    let edited = w.op(
        "PUT",
        "/api/v1/sets/backend-team",
        Some(json!({"revision": 1, "members": [a]})),
    );
    assert_eq!(edited["revision"], 2);
    assert_eq!(edited["description"], "What the backend team uses.");
    let (status, v) = w.call(
        "PUT",
        "/api/v1/sets/backend-team",
        Some(&w.operator),
        Some(&json!({"revision": 1, "description": "mine"}).to_string()),
    );
    assert_eq!((status, v["code"].as_str()), (409, Some("CONFLICT")), "{v}");
    assert_eq!(v["details"]["latest"], 2, "{v}");
    assert_eq!(
        w.op("GET", "/api/v1/sets/backend-team", None)["revision"],
        2
    );
    let first = w.op("GET", "/api/v1/sets/backend-team?revision=1", None);
    assert_eq!(first["members"].as_array().unwrap().len(), 2);
    let history = w.op("GET", "/api/v1/sets/backend-team/revisions", None);
    let revisions = history["revisions"].as_array().unwrap();
    assert_eq!(revisions.len(), 2, "{history}");
    assert_eq!(revisions[0]["revision"], 2);
    assert_eq!(revisions[0]["changes"]["removed"], json!(["kit-b"]));
    assert_eq!(revisions[1]["changes"]["added"], json!(["kit-a", "kit-b"]));
    // The CLI sees the same and edits the same way.
    let (code, out) = w.cli(&["set", "show", "backend-team"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["revision"], 2);
    let (code, out) = w.cli(&[
        "set",
        "edit",
        "backend-team",
        "--revision",
        "1",
        "--description",
        "late",
    ]);
    assert_ne!(code, 0);
    assert!(out.contains("CONFLICT"), "{out}");
    let actions = w.audit_actions();
    assert!(actions.contains(&"set.create".to_owned()));
    assert_eq!(actions.iter().filter(|a| *a == "set.edit").count(), 1);
}

#[test]
fn workspace_open_expands_a_set_and_a_replay_after_an_edit_returns_the_first_workspace() {
    let (w, a, b) = setup();
    w.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "team", "members": [a, b]})),
    );
    let addr = w.server.addr;
    let session = mcp_session(addr, &w.operator);
    let open = |key: &str, set: Value| {
        let r = tool(
            addr,
            &w.operator,
            &session,
            "workspace_open",
            json!({"idempotencyKey": key, "toolkits": [set]}),
        );
        assert_eq!(r["isError"], false, "{r}");
        r["structuredContent"].clone()
    };
    let first = open("k1", json!({"kind": "set", "id": "team"}));
    assert_eq!(names(&first), ["alpha", "beta"]);
    for t in first["toolkits"].as_array().unwrap() {
        assert_eq!(t["set"], json!({"id": "team", "revision": 1}), "{t}");
    }
    w.op(
        "PUT",
        "/api/v1/sets/team",
        Some(json!({"revision": 1, "members": [b]})),
    );
    // The same request: the workspace it opened, as it was.
    let replay = open("k1", json!({"kind": "set", "id": "team"}));
    assert_eq!(replay, first);
    // A new key gets the set as it is now, or as it was when asked for by revision.
    let now = open("k2", json!({"kind": "set", "id": "team"}));
    assert_eq!(names(&now), ["beta"]);
    assert_eq!(now["toolkits"][0]["set"]["revision"], 2);
    let then = open("k3", json!({"kind": "set", "id": "team", "revision": 1}));
    assert_eq!(names(&then), ["alpha", "beta"]);
    // A set that does not exist, or a revision it does not have, opens nothing.
    for (set, code) in [
        (json!({"kind": "set", "id": "nobody"}), "NOT_FOUND"),
        (
            json!({"kind": "set", "id": "team", "revision": 9}),
            "NOT_FOUND",
        ),
        (
            json!({"kind": "set", "id": "team", "revision": 0}),
            "INVALID_ARGUMENT",
        ),
    ] {
        let r = tool(
            addr,
            &w.operator,
            &session,
            "workspace_open",
            json!({"idempotencyKey": "bad", "toolkits": [set]}),
        );
        assert_eq!(r["structuredContent"]["code"], code, "{r}");
        assert!(r["structuredContent"]["details"]["field"]
            .as_str()
            .unwrap()
            .starts_with("toolkits[0]."));
    }
    let open_now = w.op("GET", "/api/v1/workspaces", None);
    assert_eq!(open_now["workspaces"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_members_are_refused_by_field_and_store_nothing() {
    let (w, a, _) = setup();
    let unpinned = {
        let mut m = a.clone();
        m.as_object_mut().unwrap().remove("ref");
        m
    };
    let elsewhere = {
        let mut m = a.clone();
        m["url"] = json!("https://localhost:1/x.git");
        m
    };
    let cases = [
        (
            json!({"id": "x", "members": []}),
            "members",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "x", "members": [unpinned]}),
            "members[0].ref",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "x", "members": [a, {"kind": "set", "id": "y"}]}),
            "members[1].kind",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "x", "members": [a, a]}),
            "members[1].instanceId",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "x", "members": [elsewhere]}),
            "members[0].url",
            "FORBIDDEN",
        ),
        (
            json!({"id": "x", "members": [{"kind": "preset", "id": "nobody/nothing"}]}),
            "members[0].id",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "Has Spaces", "members": [a]}),
            "id",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "x", "members": [a], "owner": "me"}),
            "owner",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "x", "description": "a\u{7}b", "members": [a]}),
            "description",
            "INVALID_ARGUMENT",
        ),
    ];
    for (body, field, code) in cases {
        let (status, v) = w.call(
            "POST",
            "/api/v1/sets",
            Some(&w.operator),
            Some(&body.to_string()),
        );
        assert_eq!(v["code"], code, "{body}: {status} {v}");
        if field != "owner" {
            assert_eq!(v["details"]["field"], field, "{body}: {v}");
        }
    }
    assert_eq!(w.op("GET", "/api/v1/sets", None)["sets"], json!([]));
    assert_eq!(
        w.call("GET", "/api/v1/sets/x", Some(&w.operator), None).0,
        404
    );
}

#[test]
fn sixteen_concurrent_opens_of_a_set_under_one_key_make_one_workspace() {
    let (w, a, b) = setup();
    w.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "team", "members": [a, b]})),
    );
    let addr = w.server.addr;
    let results: Vec<Value> = std::thread::scope(|s| {
        let w = &w;
        let handles: Vec<_> = (0..16)
            .map(|_| {
                s.spawn(move || {
                    let session = mcp_session(addr, &w.operator);
                    tool(
                        addr,
                        &w.operator,
                        &session,
                        "workspace_open",
                        json!({"idempotencyKey": "together", "toolkits": [{"kind": "set", "id": "team"}]}),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert_eq!(r["isError"], false, "{r}");
        assert_eq!(r["structuredContent"], results[0]["structuredContent"]);
    }
    let open = w.op("GET", "/api/v1/workspaces", None);
    assert_eq!(open["workspaces"].as_array().unwrap().len(), 1, "{open}");
    assert_eq!(open["workspaces"][0]["idempotencyKey"], "together");
}

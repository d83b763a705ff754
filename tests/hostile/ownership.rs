//! Two client tokens trying each other's workspaces through every tool, list and API route:
//! each reaches only its own (anything else is NOT_FOUND, as for an id that names nothing),
//! idempotency keys are per principal, and an operator reaches all, audited with both names.

use crate::support::api::{mcp_session, tool, warm_world, World};
use crate::support::http::{answer_of, raw};
use crate::support::{dir, skill, warm_toolkit, Node};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// A warm toolkit with a skill that has a script.
fn toolkit(w: &World) -> Value {
    let store = cloud_harness_store::cas::Store::open(w.server.tmp.path().join("store")).unwrap();
    let src = w.server.tmp.path().join("src/kit");
    crate::support::materialize(
        &src,
        &dir(vec![
            ("shared", skill("shared", "A skill both clients get.")),
            (
                "scripted",
                dir(vec![
                    (
                        "SKILL.md",
                        crate::support::file(
                            "---\nname: scripted\ndescription: Runs a script.\n---\nRun it.\n",
                        ),
                    ),
                    (
                        "scripts",
                        dir(vec![(
                            "hi.sh",
                            Node::Exec(b"#!/bin/sh\necho hi\n".to_vec()),
                        )]),
                    ),
                ]),
            ),
        ]),
    );
    serde_json::to_value(warm_toolkit(&store, &src, "kit")).unwrap()
}

/// A JSON-RPC request in `session` with `token`; the answer.
fn rpc(w: &World, token: &str, session: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let auth = format!("Bearer {token}");
    answer_of(&raw(
        w.server.addr,
        &body.to_string(),
        &[("Mcp-Session-Id", session), ("Authorization", &auth)],
    ))
}

fn not_found(result: &Value, what: &str) {
    assert_eq!(result["isError"], true, "{what}: {result}");
    assert_eq!(
        result["structuredContent"]["code"], "NOT_FOUND",
        "{what}: {result}"
    );
}

#[test]
fn clients_reach_only_their_own_workspaces_and_operators_all() {
    let w = warm_world(tempfile::tempdir().unwrap());
    let kit = toolkit(&w);
    let (alice, bob) = (w.client("alice"), w.client("bob"));
    let (sa, sb) = (
        mcp_session(w.server.addr, &alice),
        mcp_session(w.server.addr, &bob),
    );
    let open = |token: &str, session: &str, key: &str| {
        let r = tool(
            w.server.addr,
            token,
            session,
            "workspace_open",
            json!({"idempotencyKey": key, "toolkits": [kit]}),
        );
        assert_eq!(r["isError"], false, "{r}");
        r["structuredContent"]["workspace"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    // The same key, two principals: two workspaces, neither given the other's.
    let a = open(&alice, &sa, "same-key");
    let b = open(&bob, &sb, "same-key");
    assert_ne!(a, b);
    assert_eq!(open(&alice, &sa, "same-key"), a, "a replay is idempotent");

    // Bob, through every tool, on Alice's workspace: NOT_FOUND, worded as for an id that
    // names nothing.
    let nothing = tool(
        w.server.addr,
        &bob,
        &sb,
        "skills_list",
        json!({"workspace": "ws_00000000000000000000000000000000"}),
    );
    not_found(&nothing, "an unknown id");
    let calls = [
        ("skills_list", json!({"workspace": a})),
        ("skills_read", json!({"workspace": a, "skill": "shared"})),
        (
            "skills_run",
            json!({"workspace": a, "skill": "scripted", "script": "scripts/hi.sh"}),
        ),
        ("workspace_close", json!({"workspace": a})),
    ];
    for (name, args) in calls {
        let r = tool(w.server.addr, &bob, &sb, name, args);
        not_found(&r, name);
        let message = r["structuredContent"]["message"].as_str().unwrap();
        assert_eq!(
            message.replace(&a, "ID"),
            nothing["structuredContent"]["message"]
                .as_str()
                .unwrap()
                .replace("ws_00000000000000000000000000000000", "ID"),
            "{name} says more than an unknown id would"
        );
    }
    // Resources, the skills extension and the session-start prompt.
    let uri = format!("skill://{a}/shared/SKILL.md");
    let listed = rpc(&w, &bob, &sb, "resources/list", json!({})).to_string();
    assert!(!listed.contains(&a), "{listed}");
    assert!(listed.contains(&b), "{listed}");
    let read = rpc(&w, &bob, &sb, "resources/read", json!({"uri": uri}));
    assert!(read.get("error").is_some(), "{read}");
    let skills = rpc(&w, &bob, &sb, "skills/list", json!({})).to_string();
    assert!(!skills.contains(&a) && skills.contains(&b), "{skills}");
    let got = rpc(&w, &bob, &sb, "skills/get", json!({"uri": uri}));
    assert!(got.get("error").is_some(), "{got}");
    let prompt = rpc(
        &w,
        &bob,
        &sb,
        "prompts/get",
        json!({"name": "session-start", "arguments": {"workspace": a}}),
    );
    assert!(prompt.get("error").is_some(), "{prompt}");

    // The API: a client's list is its own; the operator's holds both, with their owners.
    let (status, mine) = w.call("GET", "/api/v1/workspaces", Some(&bob), None);
    assert_eq!(status, 200);
    let ids: Vec<&str> = mine["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["workspace"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [b.as_str()]);
    let all = w.op("GET", "/api/v1/workspaces", None);
    let owners: Vec<(&str, &str)> = all["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["workspace"].as_str().unwrap(),
                w["owner"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(owners.contains(&(a.as_str(), "token:alice")), "{all}");
    assert!(owners.contains(&(b.as_str(), "token:bob")), "{all}");
    // The library names only the caller's workspaces where a skill is used.
    let (_, library) = w.call("GET", "/api/v1/skills?q=shared", Some(&bob), None);
    let library = library.to_string();
    assert!(library.contains(&b) && !library.contains(&a), "{library}");
    // What is not a client's: other principals' imports, history, usage, the dashboard.
    for path in [
        "/api/v1/imports",
        "/api/v1/acquisitions",
        "/api/v1/usage",
        "/api/v1/usage/skills",
        "/api/v1/usage/totals",
        "/api/v1/usage/unused",
        "/api/v1/audit",
        "/workspaces",
        "/usage",
        "/",
    ] {
        let (status, v) = w.call("GET", path, Some(&bob), None);
        assert_eq!(status, 403, "{path}: {v}");
    }

    // The operator reaches Alice's workspace, and the audit log says who did, and whose.
    let so = w.session();
    let r = w.tool(&so, "skills_list", json!({"workspace": a}));
    assert_eq!(r["isError"], false, "{r}");
    // (Written off the request's thread: looked for a little while.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let audit = loop {
        let audit = w.op(
            "GET",
            "/api/v1/audit?action=workspace.access&limit=100",
            None,
        );
        if audit["entries"][0].is_object() || std::time::Instant::now() > deadline {
            break audit;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let entry = &audit["entries"][0];
    assert_eq!(entry["actor"], "token:operator", "{audit}");
    assert_eq!(entry["subject"], format!("workspace:{a}"), "{audit}");
    assert_eq!(entry["details"]["owner"], "token:alice", "{audit}");
    assert_eq!(entry["details"]["action"], "skills_list", "{audit}");

    // Alice still has hers, and closes it; Bob's is untouched.
    let r = tool(
        w.server.addr,
        &alice,
        &sa,
        "workspace_close",
        json!({"workspace": a}),
    );
    assert_eq!(r["isError"], false, "{r}");
    let r = tool(
        w.server.addr,
        &bob,
        &sb,
        "skills_list",
        json!({"workspace": b}),
    );
    assert_eq!(r["isError"], false, "{r}");

    // The same through the official Python SDK.
    sdk(&w, &bob, &alice, &kit);
}

/// `tests/hostile/two_clients.py` with the MCP Python SDK: Alice's workspace, opened by the
/// script, is out of Bob's reach through every method the SDK has.
fn sdk(w: &World, bob: &str, alice: &str, kit: &Value) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/two_clients.py");
    let config = json!({
        "url": format!("http://{}/mcp", w.server.addr),
        "alice": alice,
        "bob": bob,
        "toolkit": kit,
    });
    let out = Command::new("python3")
        .arg(script)
        .arg(config.to_string())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success()
        && text.contains("No module named 'mcp'")
        && std::env::var_os("CI").is_none()
    {
        eprintln!("skipped: the MCP Python SDK is not installed (.ci/setup installs it)");
        return;
    }
    assert!(out.status.success(), "{text}");
}

//! Operator decisions through the API, against a real `serve --http` on loopback: overrides
//! settling launch conflicts, approvals letting scripts run, the audit log, and the database
//! under concurrent writers and a killed server.

use crate::support;

use cloud_harness_control::params;
use serde_json::{json, Value};
use std::time::Duration;
use support::api::{conflicting_kits, mcp_session, tool, warm_world, world, world_with};

#[test]
fn a_launch_conflict_is_recorded_and_settling_it_lets_the_same_request_open_with_the_winner() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two, _) = conflicting_kits(&tmp);
    let w = warm_world(tmp);
    let session = w.session();
    let request = json!({"idempotencyKey": "conflict", "toolkits": [one, two]});
    let refused = w.tool(&session, "workspace_open", request.clone());
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(
        refused["structuredContent"]["code"], "CONFLICT",
        "{refused}"
    );
    // Asked again, the same conflict counts on its record.
    w.tool(&session, "workspace_open", request.clone());
    let recorded = w.op("GET", "/api/v1/conflicts", None);
    let conflicts = recorded["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{recorded}");
    let c = &conflicts[0];
    assert_eq!(
        (
            c["skill"].as_str(),
            c["tier"].as_str(),
            c["refusals"].as_i64()
        ),
        (Some("dup"), Some("owner"), Some(2))
    );
    assert_eq!(c["request"]["idempotencyKey"], "conflict");
    assert_eq!(c["actor"], "token:operator");
    let candidates = c["candidates"].as_array().unwrap();
    let of = |source: &str| {
        candidates
            .iter()
            .find(|x| x["source"] == source)
            .unwrap_or_else(|| panic!("{recorded}"))
    };
    assert!(of("owner:one")["skillMd"]
        .as_str()
        .unwrap()
        .contains("One's copy."));
    assert!(of("owner:two")["skillMd"]
        .as_str()
        .unwrap()
        .contains("Two's copy."));
    assert_eq!(
        of("owner:two")["url"],
        format!("https://{}/two.git", support::WARM_HOST)
    );
    assert!(of("owner:two")["commit"].is_string() && of("owner:two")["digest"].is_string());
    let id = c["id"].as_str().unwrap().to_owned();
    assert_eq!(
        w.op("GET", &format!("/api/v1/conflicts/{id}"), None)["id"],
        id.as_str()
    );
    // Only a candidate can win.
    let (status, v) = w.call(
        "POST",
        &format!("/api/v1/conflicts/{id}/settle"),
        Some(&w.operator),
        Some(&json!({"source": "owner:three"}).to_string()),
    );
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{v}"
    );
    // Nothing of the refused open stays: the same key opens once the conflict is settled.
    let settled = w.op(
        "POST",
        &format!("/api/v1/conflicts/{id}/settle"),
        Some(json!({"source": "owner:two", "reason": "two's is current"})),
    );
    assert_eq!(settled["override"]["source"], "owner:two");
    assert_eq!(
        w.op("GET", "/api/v1/conflicts", None)["conflicts"],
        json!([])
    );
    let (status, v) = w.call(
        "POST",
        &format!("/api/v1/conflicts/{id}/settle"),
        Some(&w.operator),
        Some(&json!({"source": "owner:one"}).to_string()),
    );
    assert_eq!((status, v["code"].as_str()), (409, Some("CONFLICT")), "{v}");
    let opened = w.tool(&session, "workspace_open", request);
    assert_eq!(opened["isError"], false, "{opened}");
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let read = w.tool(
        &session,
        "skills_read",
        json!({"workspace": ws, "skill": "dup"}),
    );
    assert!(
        read["structuredContent"]["content"]
            .as_str()
            .unwrap()
            .contains("Two's copy."),
        "{read}"
    );
    let overrides = w.op("GET", "/api/v1/overrides", None);
    let o = &overrides["overrides"][0];
    assert_eq!(
        (
            o["skill"].as_str(),
            o["source"].as_str(),
            o["actor"].as_str()
        ),
        (Some("dup"), Some("owner:two"), Some("token:operator"))
    );
    // Moving it supersedes the first; both stay in the history.
    w.op(
        "POST",
        "/api/v1/overrides",
        Some(json!({"skill": "dup", "source": "owner:one"})),
    );
    let all = w.op("GET", "/api/v1/overrides?revoked=true", None);
    assert_eq!(all["overrides"].as_array().unwrap().len(), 2, "{all}");
    assert_eq!(
        w.op("GET", "/api/v1/overrides", None)["overrides"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let actions = w.audit_actions();
    assert_eq!(actions.iter().filter(|a| *a == "override.set").count(), 2);
    assert!(
        actions.contains(&"conflict.recorded".to_owned())
            && actions.contains(&"conflict.settle".to_owned()),
        "{actions:?}"
    );
}

#[test]
fn an_approval_through_the_api_lets_a_script_run_and_its_revocation_stops_it() {
    if !support::executor_backend("bwrap") {
        assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, _, scripted) = conflicting_kits(&tmp);
    let w = world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
        ],
    );
    let made = w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "agent", "role": "client"})),
    );
    let client = made["token"].as_str().unwrap().to_owned();
    let session = mcp_session(w.server.addr, &client);
    let opened = tool(
        w.server.addr,
        &client,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "runs", "toolkits": [scripted]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = || {
        tool(
            w.server.addr,
            &client,
            &session,
            "skills_run",
            json!({"workspace": ws, "skill": "alpha", "script": "scripts/hello.sh"}),
        )
    };
    let refused = run();
    assert_eq!(
        refused["structuredContent"]["code"], "FORBIDDEN",
        "{refused}"
    );
    let digest = refused["structuredContent"]["details"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    // The refusal waits for the operator, with what it asked to run.
    let pending = w.op("GET", "/api/v1/approvals/pending", None);
    assert_eq!(pending["pending"][0]["digest"], digest, "{pending}");
    assert_eq!(pending["pending"][0]["script"], "scripts/hello.sh");
    let files: Vec<&str> = pending["pending"][0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["SKILL.md", "scripts/hello.sh"], "{pending}");
    let approval = w.op(
        "POST",
        "/api/v1/approvals",
        Some(json!({"digest": digest, "skill": "alpha", "reason": "read it"})),
    );
    let ran = run();
    assert_eq!(ran["isError"], false, "{ran}");
    assert!(
        ran["structuredContent"]["stdout"]
            .as_str()
            .unwrap()
            .contains("hello from alpha"),
        "{ran}"
    );
    assert_eq!(
        w.op("GET", "/api/v1/approvals/pending", None)["pending"],
        json!([])
    );
    w.op(
        "DELETE",
        &format!(
            "/api/v1/approvals/{}?reason=done",
            approval["id"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(run()["structuredContent"]["code"], "FORBIDDEN");
    let audit = w.op("GET", "/api/v1/audit?limit=1000", None);
    let entries = audit["entries"].as_array().unwrap();
    let by = |action: &str| {
        entries
            .iter()
            .filter(|e| e["action"] == action)
            .collect::<Vec<_>>()
    };
    assert_eq!(by("run.refused").len(), 2, "{audit}");
    assert_eq!(by("run.refused")[0]["actor"], "token:agent");
    assert_eq!(by("approval.grant")[0]["actor"], "token:operator");
    assert_eq!(by("approval.revoke").len(), 1);
    // Filtered and paged: newest first, a cursor to the rest.
    let page = w.op("GET", "/api/v1/audit?limit=2", None);
    assert_eq!(page["entries"].as_array().unwrap().len(), 2);
    let next = page["nextCursor"].as_str().unwrap();
    let rest = w.op(
        "GET",
        &format!("/api/v1/audit?limit=1000&cursor={next}"),
        None,
    );
    assert_eq!(rest["entries"].as_array().unwrap().len() + 2, entries.len());
    let mine = w.op("GET", "/api/v1/audit?actor=token:agent", None);
    assert!(mine["entries"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["actor"] == "token:agent"));
}

fn digest_n(prefix: u8, i: usize) -> String {
    format!("sha256:{:02x}{:062x}", prefix, i)
}

#[test]
fn two_clis_and_serve_writing_at_once_lose_nothing() {
    let w = world();
    const EACH: usize = 15;
    std::thread::scope(|s| {
        for cli in 0..2u8 {
            let w = &w;
            s.spawn(move || {
                for i in 0..EACH {
                    let (code, out) =
                        w.cli(&["approve", "add", &digest_n(cli, i), "--reason", "cli"]);
                    assert_eq!(code, 0, "{out}");
                }
            });
        }
        s.spawn(|| {
            for i in 0..EACH {
                w.op(
                    "POST",
                    "/api/v1/approvals",
                    Some(json!({"digest": digest_n(9, i)})),
                );
            }
        });
    });
    let approvals = w.op("GET", "/api/v1/approvals", None);
    let listed: std::collections::HashSet<String> = approvals["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["digest"].as_str().unwrap().to_owned())
        .collect();
    for prefix in [0, 1, 9] {
        for i in 0..EACH {
            assert!(
                listed.contains(&digest_n(prefix, i)),
                "{} is missing",
                digest_n(prefix, i)
            );
        }
    }
    assert_eq!(listed.len(), 3 * EACH);
    let grants = w
        .audit_actions()
        .iter()
        .filter(|a| *a == "approval.grant")
        .count();
    assert_eq!(grants, 3 * EACH);
}

#[test]
fn a_server_killed_mid_write_leaves_the_database_whole_with_every_acknowledged_decision() {
    let mut w = world();
    let acknowledged = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let (w, acknowledged) = (&w, &acknowledged);
        for t in 0..4u8 {
            s.spawn(move || {
                for i in 0.. {
                    let body =
                        json!({"digest": digest_n(t, i), "reason": "x".repeat(900)}).to_string();
                    let sent = w
                        .http
                        .post(w.url("/api/v1/approvals"))
                        .bearer_auth(&w.operator)
                        .header("Content-Type", "application/json")
                        .body(body)
                        .send();
                    match sent {
                        Ok(r) if r.status().as_u16() == 201 => {
                            acknowledged.lock().unwrap().push(digest_n(t, i))
                        }
                        _ => break,
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(700));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w.server.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    });
    w.server.child.wait().unwrap();
    let acknowledged = acknowledged.into_inner().unwrap();
    assert!(
        acknowledged.len() > 10,
        "only {} writes before the kill",
        acknowledged.len()
    );
    let db = w.state();
    if db.engine() == "sqlite" {
        let check: String = db
            .with(|c| c.query_row("PRAGMA integrity_check", params![], |r| r.get(0)))
            .unwrap();
        assert_eq!(check, "ok");
    }
    let stored: std::collections::HashSet<String> = db
        .with(|c| {
            c.query_map("SELECT digest FROM approvals", params![], |r| r.get(0))?
                .collect()
        })
        .unwrap();
    for d in &acknowledged {
        assert!(stored.contains(d), "{d} was acknowledged and lost");
    }
    // Each stored approval has its audit entry: written in the same transaction.
    let audited: i64 = db
        .with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM audit WHERE action = 'approval.grant'",
                params![],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert_eq!(audited as usize, stored.len());
    // And a new server takes the database as it is.
    drop(db);
    let (code, out) = w.cli(&["approve", "list"]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn an_override_for_one_set_applies_to_its_workspaces_only_and_wins_there() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two, _) = conflicting_kits(&tmp);
    let w = warm_world(tmp);
    w.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "team", "members": [one, two]})),
    );
    let session = w.session();
    let open = |key: &str, toolkits: Value| {
        w.tool(
            &session,
            "workspace_open",
            json!({"idempotencyKey": key, "toolkits": toolkits}),
        )
    };
    let via_set = json!([{"kind": "set", "id": "team"}]);
    let direct = json!([one, two]);
    let refused = open("s1", via_set.clone());
    assert_eq!(
        refused["structuredContent"]["code"], "CONFLICT",
        "{refused}"
    );
    let id = w.op("GET", "/api/v1/conflicts", None)["conflicts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let settled = w.op(
        "POST",
        &format!("/api/v1/conflicts/{id}/settle"),
        Some(json!({"source": "owner:two", "set": "team"})),
    );
    assert_eq!(settled["override"]["set"], "team", "{settled}");
    let read = |r: &Value| {
        let ws = r["structuredContent"]["workspace"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_owned();
        let page = w.tool(
            &session,
            "skills_read",
            json!({"workspace": ws, "skill": "dup"}),
        );
        page["structuredContent"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(read(&open("s1", via_set.clone())).contains("Two's copy."));
    // The set's override is not the others'.
    let refused = open("d1", direct.clone());
    assert_eq!(
        refused["structuredContent"]["code"], "CONFLICT",
        "{refused}"
    );
    // A global override serves everyone else; the set's still wins in its workspaces.
    w.op(
        "POST",
        "/api/v1/overrides",
        Some(json!({"skill": "dup", "source": "owner:one"})),
    );
    assert!(read(&open("d2", direct)).contains("One's copy."));
    assert!(read(&open("s2", via_set)).contains("Two's copy."));
    let both = w.op("GET", "/api/v1/overrides", None);
    assert_eq!(both["overrides"].as_array().unwrap().len(), 2, "{both}");
    // An override for a set that does not exist is refused.
    let (status, v) = w.call(
        "POST",
        "/api/v1/overrides",
        Some(&w.operator),
        Some(&json!({"skill": "dup", "source": "owner:one", "set": "nobody"}).to_string()),
    );
    assert_eq!(
        (status, v["details"]["field"].as_str()),
        (404, Some("set")),
        "{v}"
    );
}

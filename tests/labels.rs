//! Version labels, from the outside: a registry entry of a local HTTPS git server's toolkit
//! with two commits, a label moved between them through the API and the CLI, workspaces
//! opened on it through MCP (each result naming the label's revision and the commit it gave),
//! rolled back, a replay of the first open stable across the moves; a canary's share over a
//! few hundred opens; a set's label over its revisions.

use crate::support;

use serde_json::{json, Value};
use support::api::{github_world, mcp_session, tool, World};
use support::{dir, file, Certs, GitServer, Repo};

struct Kit {
    w: World,
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
    let version = |n: &str| {
        dir(vec![(
            "skills",
            dir(vec![(
                "lint",
                dir(vec![(
                    "SKILL.md",
                    file(&format!(
                        "---\nname: lint\ndescription: Lint the code.\n---\nVersion {n}.\n"
                    )),
                )]),
            )]),
        )])
    };
    let first = repo.commit(version("one"));
    let second = repo.commit(version("two"));
    let git = GitServer::start(&repos, &certs);
    let w = github_world(tmp, &git, &certs);
    let url = git.url("team/kit.git");
    w.op(
        "POST",
        "/api/v1/registry",
        Some(json!({"id": "team/kit", "name": "Team kit", "description": "The team's skills.", "url": url, "commit": first})),
    );
    Kit {
        w,
        git,
        first,
        second,
        _certs: certs,
    }
}

/// `workspace_open` through MCP: its structured result, or its error.
fn open(w: &World, session: &str, key: &str, toolkit: Value) -> Value {
    let opened = tool(
        w.server.addr,
        &w.operator,
        session,
        "workspace_open",
        json!({"idempotencyKey": key, "toolkits": [toolkit]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    opened["structuredContent"].clone()
}

fn close(w: &World, session: &str, workspace: &str) {
    let closed = tool(
        w.server.addr,
        &w.operator,
        session,
        "workspace_close",
        json!({"workspace": workspace}),
    );
    assert_eq!(closed["isError"], false, "{closed}");
}

fn stable() -> Value {
    json!({"kind": "preset", "id": "team/kit", "label": "stable"})
}

#[test]
fn a_label_moved_opened_on_and_rolled_back_leaves_a_replay_of_the_first_open_as_it_was() {
    let Kit {
        w,
        first,
        second,
        _certs,
        git: _git,
    } = kit();
    let session = mcp_session(w.server.addr, &w.operator);
    let made = w.op(
        "PUT",
        "/api/v1/registry/team/kit/labels/stable",
        Some(json!({"commit": first, "from": 0, "reason": "the first release"})),
    );
    assert_eq!(
        (&made["revision"], &made["value"]),
        (&json!(1), &json!(first))
    );
    let listed = w.op("GET", "/api/v1/registry/team/kit", None);
    assert_eq!(
        listed["entry"]["labels"]["stable"],
        json!({"revision": 1, "value": first}),
        "{listed}"
    );

    let one = open(&w, &session, "on-stable", stable());
    let t = &one["toolkits"][0];
    assert_eq!(
        (&t["commit"], &t["label"]),
        (&json!(first), &json!({"name": "stable", "revision": 1})),
        "{one}"
    );

    // Moved by another operator's view of revision 1: the first move wins, the stale one is
    // refused and changes nothing.
    w.op(
        "PUT",
        "/api/v1/registry/team/kit/labels/stable",
        Some(json!({"commit": second, "from": 1})),
    );
    let (status, stale) = w.call(
        "PUT",
        "/api/v1/registry/team/kit/labels/stable",
        Some(&w.operator),
        Some(&json!({"commit": first, "from": 1}).to_string()),
    );
    assert_eq!(
        (status, &stale["code"], &stale["details"]["field"]),
        (409, &json!("CONFLICT"), &json!("from")),
        "{stale}"
    );
    let two = open(&w, &session, "after-the-move", stable());
    assert_eq!(
        (&two["toolkits"][0]["commit"], &two["toolkits"][0]["label"]),
        (&json!(second), &json!({"name": "stable", "revision": 2})),
        "{two}"
    );
    assert!(two["skills"].to_string().contains("lint"), "{two}");

    // The first request again: its workspace, on the commit the label gave it then.
    let replay = open(&w, &session, "on-stable", stable());
    assert_eq!(replay["workspace"], one["workspace"], "{replay}");
    assert_eq!(replay["toolkits"][0]["commit"], json!(first));

    let back = w.op(
        "POST",
        "/api/v1/registry/team/kit/labels/stable/rollback",
        None,
    );
    assert_eq!(
        (&back["revision"], &back["value"], &back["reason"]),
        (&json!(3), &json!(first), &json!("rollback to revision 1")),
        "{back}"
    );
    let three = open(&w, &session, "after-the-rollback", stable());
    assert_eq!(
        (
            &three["toolkits"][0]["commit"],
            &three["toolkits"][0]["label"]
        ),
        (&json!(first), &json!({"name": "stable", "revision": 3}))
    );
    let replay = open(&w, &session, "on-stable", stable());
    assert_eq!(replay["workspace"], one["workspace"]);

    let history = w.op("GET", "/api/v1/registry/team/kit/labels/stable", None);
    let revisions: Vec<(i64, &str)> = history["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["revision"].as_i64().unwrap(),
                r["value"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        revisions,
        [
            (3, first.as_str()),
            (2, second.as_str()),
            (1, first.as_str())
        ]
    );
    let moves = w
        .audit_actions()
        .iter()
        .filter(|a| *a == "label.move")
        .count();
    assert_eq!(moves, 3);

    // The CLI sees the same labels, and moves them too.
    let (code, out) = w.cli(&["registry", "label", "list", "team/kit"]);
    assert_eq!(code, 0, "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["labels"][0]["name"], "stable", "{out}");
    assert_eq!(listed["labels"][0]["revision"], 3, "{out}");
    let (code, out) = w.cli_with(
        &["registry", "label", "move", "team/kit", "next", &second],
        &[("ALLOWED_GIT_HOSTS", &_git.host())],
    );
    assert_eq!(code, 0, "{out}");
    let labels = w.op("GET", "/api/v1/registry/team/kit/labels", None);
    let names: Vec<&str> = labels["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["next", "stable"]);

    // Removed: an open naming it is refused by name, the entry's other labels kept; a
    // rollback brings it back.
    w.op("DELETE", "/api/v1/registry/team/kit/labels/next", None);
    let refused = tool(
        w.server.addr,
        &w.operator,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "on-next", "toolkits": [{"kind": "preset", "id": "team/kit", "label": "next"}]}),
    );
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(
        refused.to_string().contains("toolkits[0].label"),
        "{refused}"
    );
    let back = w.op(
        "POST",
        "/api/v1/registry/team/kit/labels/next/rollback",
        None,
    );
    assert_eq!(
        (&back["revision"], &back["value"]),
        (&json!(3), &json!(second))
    );

    // A request on a label removed since still finds the workspace it opened.
    w.op("DELETE", "/api/v1/registry/team/kit/labels/stable", None);
    let replay = open(&w, &session, "on-stable", stable());
    assert_eq!(
        (&replay["workspace"], &replay["toolkits"][0]["commit"]),
        (&one["workspace"], &json!(first)),
        "{replay}"
    );
}

#[test]
fn label_moves_that_cannot_be_made_are_refused_by_field_and_change_nothing() {
    let Kit {
        w,
        first,
        second,
        _certs,
        git: _git,
    } = kit();
    w.op(
        "PUT",
        "/api/v1/registry/team/kit/labels/stable",
        Some(json!({"commit": first})),
    );
    let refused = |method: &str, path: &str, body: Value| {
        let (status, v) = w.call(method, path, Some(&w.operator), Some(&body.to_string()));
        (
            status,
            v["details"]["field"].as_str().unwrap_or("").to_owned(),
        )
    };
    let path = "/api/v1/registry/team/kit/labels/stable";
    let missing = "0".repeat(40);
    for (body, field) in [
        (json!({"commit": "main"}), "commit"),
        (
            json!({"commit": second, "canary": {"commit": second, "percent": 10}}),
            "canary.commit",
        ),
        (
            json!({"commit": second, "canary": {"commit": first, "percent": 0}}),
            "canary.percent",
        ),
        (
            json!({"commit": second, "canary": {"commit": first, "percent": 100}}),
            "canary.percent",
        ),
        (json!({"commit": second, "from": 7}), "from"),
        (json!({"commit": second, "reason": "a\u{7}b"}), "reason"),
    ] {
        let (status, f) = refused("PUT", path, body.clone());
        assert!((400..500).contains(&status), "{body}: {status}");
        assert_eq!(f, field, "{body}");
    }
    // A commit the repository does not have: the fetch fails (an upstream error).
    let (status, _) = refused("PUT", path, json!({"commit": missing}));
    assert!(status >= 400, "{status}");
    let (status, _) = refused(
        "PUT",
        "/api/v1/registry/team/kit/labels/Not%20a%20label",
        json!({"commit": first}),
    );
    assert_eq!(status, 400);
    let (status, _) = refused(
        "PUT",
        "/api/v1/registry/team/none/labels/stable",
        json!({"commit": first}),
    );
    assert_eq!(status, 404);
    let (status, _) = refused(
        "POST",
        "/api/v1/registry/team/kit/labels/stable/rollback",
        json!({}),
    );
    assert_eq!(status, 409, "one revision: nothing to roll back to");
    // A client reads labels, and moves none.
    let client = w.client("agent");
    let (status, _) = w.call("GET", path, Some(&client), None);
    assert_eq!(status, 200);
    let (status, _) = w.call(
        "PUT",
        path,
        Some(&client),
        Some(&json!({"commit": second}).to_string()),
    );
    assert_eq!(status, 403);
    // Nothing above moved it.
    let history = w.op("GET", path, None);
    assert_eq!(
        history["revisions"].as_array().unwrap().len(),
        1,
        "{history}"
    );

    // An open naming a version and a label, or a label the entry does not have.
    let session = mcp_session(w.server.addr, &w.operator);
    for (toolkit, said) in [
        (
            json!({"kind": "preset", "id": "team/kit", "label": "stable", "version": first}),
            "not both",
        ),
        (
            json!({"kind": "preset", "id": "team/kit", "label": "beta"}),
            "its labels: stable",
        ),
    ] {
        let r = tool(
            w.server.addr,
            &w.operator,
            &session,
            "workspace_open",
            json!({"idempotencyKey": "refused", "toolkits": [toolkit]}),
        );
        assert_eq!(r["isError"], true, "{r}");
        assert!(r.to_string().contains(said), "{r}");
    }
    for (body, field) in [
        (json!({"commit": second, "reason": ""}), "reason"),
        (json!({"commit": second, "from": -1}), "from"),
    ] {
        let (status, f) = refused("PUT", path, body.clone());
        assert_eq!((status, f.as_str()), (400, field), "{body}");
    }
    // The same move again writes no revision.
    let same = w.op("PUT", path, Some(json!({"commit": first})));
    assert_eq!(same["revision"], 1, "{same}");

    // A rollback names the revision it undoes: a second click on an old page undoes nothing.
    w.op("PUT", path, Some(json!({"commit": second})));
    let (status, f) = refused("POST", &format!("{path}/rollback?from=1"), json!({}));
    assert_eq!((status, f.as_str()), (409, "from"));
    let back = w.op("POST", &format!("{path}/rollback?from=2"), None);
    assert_eq!(
        (&back["revision"], &back["value"]),
        (&json!(3), &json!(first))
    );
    let (status, _) = refused("POST", &format!("{path}/rollback?from=2"), json!({}));
    assert_eq!(status, 409);

    // At most 32 labels on an entry; a removed one makes room.
    for i in 0..31 {
        w.op(
            "PUT",
            &format!("/api/v1/registry/team/kit/labels/l{i}"),
            Some(json!({"commit": first})),
        );
    }
    let (status, v) = w.call(
        "PUT",
        "/api/v1/registry/team/kit/labels/one-more",
        Some(&w.operator),
        Some(&json!({"commit": first}).to_string()),
    );
    assert_eq!(v["code"], "RESOURCE_EXHAUSTED", "{status} {v}");
    w.op("DELETE", "/api/v1/registry/team/kit/labels/l0", None);
    w.op(
        "PUT",
        "/api/v1/registry/team/kit/labels/one-more",
        Some(json!({"commit": first})),
    );
    // Brought back by a move (or a rollback), a removed label needs room as a new one does.
    let (status, v) = w.call(
        "PUT",
        "/api/v1/registry/team/kit/labels/l0",
        Some(&w.operator),
        Some(&json!({"commit": first}).to_string()),
    );
    assert_eq!(v["code"], "RESOURCE_EXHAUSTED", "{status} {v}");
}

#[test]
fn a_canary_serves_about_its_share_of_new_workspaces_and_each_request_stays_on_its_side() {
    let Kit {
        w,
        first,
        second,
        _certs,
        git: _git,
    } = kit();
    w.op(
        "PUT",
        "/api/v1/registry/team/kit/labels/stable",
        Some(json!({"commit": first, "canary": {"commit": second, "percent": 30}})),
    );
    let session = mcp_session(w.server.addr, &w.operator);
    const OPENS: usize = 300;
    let mut canaries = Vec::new();
    for i in 0..OPENS {
        let opened = open(&w, &session, &format!("canary-{i}"), stable());
        let t = &opened["toolkits"][0];
        let canary = t["label"]["canary"] == true;
        assert_eq!(
            t["commit"],
            json!(if canary { &second } else { &first }),
            "{opened}"
        );
        if canary {
            canaries.push(i);
        }
        close(&w, &session, opened["workspace"].as_str().unwrap());
    }
    let share = canaries.len() as f64 / OPENS as f64;
    // 30% of 300: a standard deviation is about 8 opens (2.6%); 10% either way is far beyond
    // chance for a fair split, and well inside a broken one (0% or 100%).
    assert!(
        (0.2..=0.4).contains(&share),
        "{} of {OPENS}",
        canaries.len()
    );

    // The same request lands on the same side again; a larger share keeps every canary.
    w.op(
        "PUT",
        "/api/v1/registry/team/kit/labels/stable",
        Some(json!({"commit": first, "canary": {"commit": second, "percent": 60}})),
    );
    for &i in canaries.iter().take(10) {
        let again = open(&w, &session, &format!("canary-{i}"), stable());
        assert_eq!(again["toolkits"][0]["commit"], json!(second), "{again}");
        close(&w, &session, again["workspace"].as_str().unwrap());
    }
}

#[test]
fn a_sets_label_opens_the_revision_it_points_at_and_a_member_may_name_an_entrys_label() {
    let Kit {
        w,
        git,
        first,
        second,
        _certs,
    } = kit();
    let url = git.url("team/kit.git");
    let member =
        |commit: &str| json!({"kind": "git", "url": url, "instanceId": "kit", "ref": commit});
    w.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "team", "members": [member(&first)]})),
    );
    w.op(
        "PUT",
        "/api/v1/sets/team",
        Some(json!({"revision": 1, "members": [member(&second)]})),
    );
    w.op(
        "PUT",
        "/api/v1/sets/team/labels/stable",
        Some(json!({"revision": 1})),
    );
    let (status, v) = w.call(
        "PUT",
        "/api/v1/sets/team/labels/stable",
        Some(&w.operator),
        Some(&json!({"revision": 3}).to_string()),
    );
    assert_eq!(
        (status, &v["details"]["field"]),
        (404, &json!("revision")),
        "{v}"
    );
    let session = mcp_session(w.server.addr, &w.operator);
    let set = json!({"kind": "set", "id": "team", "label": "stable"});
    let one = open(&w, &session, "set-stable", set.clone());
    let t = &one["toolkits"][0];
    assert_eq!(t["commit"], json!(first), "{one}");
    assert_eq!(
        t["set"],
        json!({"id": "team", "revision": 1, "label": {"name": "stable", "revision": 1}}),
        "{one}"
    );
    let (code, out) = w.cli(&["set", "label", "move", "team", "stable", "2", "--from", "1"]);
    assert_eq!(code, 0, "{out}");
    let two = open(&w, &session, "set-stable-2", set.clone());
    assert_eq!(two["toolkits"][0]["commit"], json!(second), "{two}");
    let replay = open(&w, &session, "set-stable", set);
    assert_eq!(replay["workspace"], one["workspace"]);
    assert_eq!(replay["toolkits"][0]["commit"], json!(first));

    // A set's member naming an entry's label takes the commit the label points at.
    w.op(
        "PUT",
        "/api/v1/registry/team/kit/labels/stable",
        Some(json!({"commit": second})),
    );
    w.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "on-label", "members": [stable()]})),
    );
    let on = open(
        &w,
        &session,
        "member-label",
        json!({"kind": "set", "id": "on-label"}),
    );
    // While a set names it, the label stays.
    let (status, v) = w.call(
        "DELETE",
        "/api/v1/registry/team/kit/labels/stable",
        Some(&w.operator),
        None,
    );
    assert_eq!(
        (status, &v["details"]["field"]),
        (409, &json!("label")),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("on-label"), "{v}");
    // A set that does not exist is not found, label or not.
    let none = tool(
        w.server.addr,
        &w.operator,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "no-set", "toolkits": [{"kind": "set", "id": "nope", "label": "stable"}]}),
    );
    assert!(none.to_string().contains("NOT_FOUND"), "{none}");
    let t = &on["toolkits"][0];
    assert_eq!(
        (&t["commit"], &t["label"]),
        (&json!(second), &json!({"name": "stable", "revision": 1})),
        "{on}"
    );
}

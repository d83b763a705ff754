//! Import jobs and the acquisition history through the API, against a real `serve --http` on
//! loopback and a local HTTPS git server: a job that runs to done, one that fails with its
//! error kept, one cancelled while it fetches, and the history of every acquisition.

use crate::support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::api::{mcp_session, tool, world_with, World};
use support::{dir, skill, Certs, GitServer, Repo};

struct Fixture {
    w: World,
    git: GitServer,
    repo: Repo,
    kit: String,
    _certs: Certs,
}

/// `slow`: seconds the git server waits before answering each fetch.
fn fixture(slow: f64) -> Fixture {
    fixture_with(slow, &[])
}

fn fixture_with(slow: f64, extra: &[(&str, &str)]) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let repo = Repo::create(&repos, "team/kit.git", false);
    let kit = repo.commit(dir(vec![(
        "skills",
        dir(vec![
            ("lint", skill("lint", "Lint it.")),
            ("fmt", skill("fmt", "Format it.")),
        ]),
    )]));
    let git = GitServer::start_with(&repos, &certs, "127.0.0.1", slow);
    let ca = certs.ca.display().to_string();
    let host = git.host();
    let mut env = vec![
        ("CLOUD_HARNESS_EXECUTOR", "none"),
        ("CLOUD_HARNESS_CONTAINERS", "off"),
        ("ALLOWED_GIT_HOSTS", host.as_str()),
        ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
        ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
    ];
    env.extend_from_slice(extra);
    let w = world_with(tmp, &env);
    Fixture {
        w,
        git,
        repo,
        kit,
        _certs: certs,
    }
}

fn spec(f: &Fixture, commit: &str) -> Value {
    json!({"kind": "git", "instanceId": "kit", "url": f.git.url("team/kit.git"), "ref": commit})
}

/// Polls the job until `done(job)`; the job then.
fn wait_for(w: &World, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let job = w.op("GET", &format!("/api/v1/imports/{id}"), None);
        if done(&job) {
            return job;
        }
        assert!(Instant::now() < deadline, "the job never got there: {job}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ended(job: &Value) -> bool {
    matches!(job["state"].as_str(), Some("done" | "failed" | "cancelled"))
}

#[test]
fn an_import_runs_to_done_and_one_that_fails_keeps_its_error() {
    let f = fixture(0.0);
    let w = &f.w;
    let queued = w.op(
        "POST",
        "/api/v1/imports",
        Some(json!({"toolkit": spec(&f, &f.kit)})),
    );
    assert!(
        queued["id"].as_str().unwrap().starts_with("imp_"),
        "{queued}"
    );
    let done = wait_for(w, queued["id"].as_str().unwrap(), ended);
    assert_eq!(done["state"], "done", "{done}");
    let result = &done["result"];
    assert_eq!(
        (
            result["commit"].as_str(),
            result["skills"].as_i64(),
            result["warm"].as_bool()
        ),
        (Some(f.kit.as_str()), Some(2), Some(false)),
        "{done}"
    );
    assert!(result["bytes"].as_i64().unwrap() > 0, "{done}");
    assert!(done["startedAt"].is_i64() && done["finishedAt"].is_i64());

    // A commit the server does not have: failed, with the error's code and message.
    let missing = "0".repeat(40);
    let queued = w.op(
        "POST",
        "/api/v1/imports",
        Some(json!({"toolkit": spec(&f, &missing)})),
    );
    let failed = wait_for(w, queued["id"].as_str().unwrap(), ended);
    assert_eq!(failed["state"], "failed", "{failed}");
    assert!(
        failed["error"]["code"].is_string()
            && failed["error"]["message"].as_str().unwrap().len() > 5,
        "{failed}"
    );

    // A toolkit this server may not fetch is refused before it is queued.
    let (status, v) = w.call("POST", "/api/v1/imports", Some(&w.operator), Some(&json!({"toolkit": {"kind": "git", "instanceId": "x", "url": "https://localhost:1/x.git"}}).to_string()));
    assert_eq!(
        (status, v["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "{v}"
    );
    let (status, v) = w.call(
        "POST",
        "/api/v1/imports",
        Some(&w.operator),
        Some(&json!({"toolkit": {"kind": "set", "id": "x"}}).to_string()),
    );
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{v}"
    );
    assert_eq!(
        w.op("GET", "/api/v1/imports", None)["imports"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // The history has both, newest first, and an open's acquisition too.
    let session = w.session();
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "k", "toolkits": [spec(&f, &f.kit)]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let ws = opened["structuredContent"]["workspace"].as_str().unwrap();
    let history = w.op("GET", "/api/v1/acquisitions", None);
    let all = history["acquisitions"].as_array().unwrap();
    assert_eq!(all.len(), 3, "{history}");
    assert_eq!(
        (
            all[0]["via"].as_str(),
            all[0]["subject"].as_str(),
            all[0]["mode"].as_str()
        ),
        (Some("workspace_open"), Some(ws), Some("warm"))
    );
    assert_eq!(all[0]["actor"], "token:operator");
    assert_eq!(
        (all[1]["result"].as_str(), all[1]["via"].as_str()),
        (Some("error"), Some("import"))
    );
    assert!(all[1]["errorCode"].is_string());
    assert_eq!(
        (
            all[2]["result"].as_str(),
            all[2]["commit"].as_str(),
            all[2]["skills"].as_i64()
        ),
        (Some("ok"), Some(f.kit.as_str()), Some(2))
    );
    assert!(all[2]["bytes"].as_i64().unwrap() > 0 && all[2]["millis"].is_i64());
    let (code, out) = w.cli(&["acquisitions", "--limit", "2"]);
    assert_eq!(code, 0, "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["acquisitions"].as_array().unwrap().len(), 2);
    assert_eq!(listed["acquisitions"][0]["via"], "workspace_open");
    let page = w.op("GET", "/api/v1/acquisitions?limit=1", None);
    let rest = w.op(
        "GET",
        &format!(
            "/api/v1/acquisitions?cursor={}",
            page["nextCursor"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(rest["acquisitions"].as_array().unwrap().len(), 2);
}

#[test]
fn an_import_is_cancelled_while_it_fetches_and_publishes_nothing() {
    let f = fixture(2.0);
    let w = &f.w;
    let queued = w.op(
        "POST",
        "/api/v1/imports",
        Some(json!({"toolkit": spec(&f, &f.kit)})),
    );
    let id = queued["id"].as_str().unwrap().to_owned();
    let running = wait_for(w, &id, |j| j["phase"] == "fetching" || ended(j));
    assert_eq!(
        (running["state"].as_str(), running["phase"].as_str()),
        (Some("running"), Some("fetching")),
        "{running}"
    );
    w.op("POST", &format!("/api/v1/imports/{id}/cancel"), None);
    let cancelled = wait_for(w, &id, ended);
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["error"]["code"], "CANCELLED");
    let (status, v) = w.call(
        "POST",
        &format!("/api/v1/imports/{id}/cancel"),
        Some(&w.operator),
        None,
    );
    assert_eq!((status, v["code"].as_str()), (409, Some("CONFLICT")), "{v}");
    // Nothing was published: the toolkit is not in the store's index.
    let (code, out) = w.cli(&["toolkit", "list", "--json"]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains(&f.kit), "{out}");
}

#[test]
fn a_default_head_is_resolved_once_and_reused_for_the_time_allowed() {
    for ttl in ["600", "0"] {
        default_head_reuse(ttl);
    }
}

fn default_head_reuse(ttl: &str) {
    let f = fixture_with(0.0, &[("CLOUD_HARNESS_HEAD_TTL", ttl)]);
    let w = &f.w;
    let session = w.session();
    let unpinned = json!({"kind": "git", "instanceId": "kit", "url": f.git.url("team/kit.git")});
    let open = |key: &str| {
        let r = w.tool(
            &session,
            "workspace_open",
            json!({"idempotencyKey": key, "toolkits": [unpinned]}),
        );
        assert_eq!(r["isError"], false, "{r}");
        r["structuredContent"]["toolkits"][0].clone()
    };
    let first = open("one");
    assert_eq!(
        (first["commit"].as_str(), first["warm"].as_bool()),
        (Some(f.kit.as_str()), Some(false)),
        "{first}"
    );
    assert!(first["resolvedAt"].is_i64(), "{first}");
    // The branch moves on; within the time allowed, opens keep the head they found, warm.
    let moved = f.repo.commit(dir(vec![(
        "skills",
        dir(vec![("lint", skill("lint", "Lint it, v2."))]),
    )]));
    let asked = f.git.requests();
    let second = open("two");
    if ttl == "0" {
        // Asked every time.
        assert_eq!(
            (second["commit"].as_str(), second["warm"].as_bool()),
            (Some(moved.as_str()), Some(false)),
            "{second}"
        );
        return;
    }
    assert_eq!(
        (second["commit"].as_str(), second["warm"].as_bool()),
        (Some(f.kit.as_str()), Some(true)),
        "{second}"
    );
    assert_eq!(second["resolvedAt"], first["resolvedAt"]);
    assert_eq!(f.git.requests(), asked, "a warm open asked the git server");
}

#[test]
fn refused_egress_is_in_the_audit_log() {
    // Loopback is a special-purpose address the egress proxy refuses unless told otherwise.
    let f = fixture_with(0.0, &[("CLOUD_HARNESS_ALLOW_CIDRS", "")]);
    let w = &f.w;
    let queued = w.op(
        "POST",
        "/api/v1/imports",
        Some(json!({"toolkit": spec(&f, &f.kit)})),
    );
    let failed = wait_for(w, queued["id"].as_str().unwrap(), ended);
    assert_eq!(
        (failed["state"].as_str(), failed["error"]["code"].as_str()),
        (Some("failed"), Some("FORBIDDEN")),
        "{failed}"
    );
    // A host off the allowlist, asked by an agent through workspace_open.
    let made = w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "agent", "role": "client"})),
    );
    let client = made["token"].as_str().unwrap();
    let session = mcp_session(w.server.addr, client);
    let refused = tool(
        w.server.addr,
        client,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "x", "toolkits": [{"kind": "git", "instanceId": "x", "url": "https://localhost:1/x.git"}]}),
    );
    assert_eq!(
        refused["structuredContent"]["code"], "FORBIDDEN",
        "{refused}"
    );
    let log = w.op("GET", "/api/v1/audit?action=egress.refused", None);
    let entries = log["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{log}");
    assert_eq!(
        (
            entries[0]["actor"].as_str(),
            entries[0]["details"]["via"].as_str()
        ),
        (Some("token:agent"), Some("workspace_open"))
    );
    assert!(
        entries[0]["details"]["message"]
            .as_str()
            .unwrap()
            .contains("localhost:1"),
        "{log}"
    );
    assert_eq!(entries[1]["details"]["via"], "import");
}

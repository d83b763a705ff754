//! Two runners, one bucket, one PostgreSQL database: each `serve --http` has its own home and
//! local store; they share the store of record (`s3s-fs` on loopback) and the control plane
//! (Debian's PostgreSQL on loopback). What an operator does on one runner holds on the other,
//! and one idempotency key makes one workspace across the fleet.

use crate::support;

use serde_json::{json, Value};
use support::api::{mcp_session, tool, world_of, World};
use support::http::{server_in, Server};
use support::postgres::Database;
use support::s3::S3Server;
use support::{dir, file, Node, Repo};

const PREFIX: &str = "fleet";

/// A toolkit whose one skill has a script.
fn scripted() -> Node {
    dir(vec![(
        "skills",
        dir(vec![(
            "alpha",
            dir(vec![
                (
                    "SKILL.md",
                    file(
                        "---\nname: alpha\ndescription: Says hello.\n---\nRun scripts/hello.sh.\n",
                    ),
                ),
                (
                    "scripts",
                    dir(vec![(
                        "hello.sh",
                        Node::Exec(b"#!/bin/sh\necho hello from alpha\n".to_vec()),
                    )]),
                ),
            ]),
        )]),
    )])
}

struct Fleet {
    git: support::acquisition::World,
    s3: S3Server,
    db: Database,
}

fn fleet() -> Option<Fleet> {
    if !support::s3::available() {
        assert!(std::env::var_os("CI").is_none(), "s3s-fs is missing");
        eprintln!("skipped: s3s-fs is not installed");
        return None;
    }
    if !support::postgres::available() {
        return None;
    }
    let git = support::acquisition::world();
    let s3 = S3Server::start(&git.tmp.path().join("s3"));
    Some(Fleet {
        git,
        s3,
        db: Database::new(),
    })
}

impl Fleet {
    /// A runner named `name`: its own home and store, the shared bucket and database.
    fn runner(&self, name: &str, executor: &str) -> Server {
        self.runner_on(name, executor, &self.db.url())
    }

    /// [`Fleet::runner`] reaching the database at `db`.
    fn runner_on(&self, name: &str, executor: &str, db: &str) -> Server {
        let settings = self.s3.settings();
        let store_url = self.s3.url(PREFIX);
        let host = self.git.server.host();
        let ca = self.git.certs.ca.display().to_string();
        let mut env: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.extend([
            ("TOOLKIT_STORE_URL", store_url.as_str()),
            ("CLOUD_HARNESS_DATABASE_URL", db),
            ("CLOUD_HARNESS_RUNNER", name),
            ("ALLOWED_GIT_HOSTS", host.as_str()),
            ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            // The test git server is on loopback, which egress opens only when told to.
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
            ("CLOUD_HARNESS_EXECUTOR", executor),
        ]);
        server_in(tempfile::tempdir().unwrap(), &[], &env)
    }

    fn repo(&self, name: &str, root: Node) -> (String, String) {
        let repo = Repo::create(&self.git.repos, name, false);
        let commit = repo.commit(root);
        (self.git.server.url(name), commit)
    }

    fn count(&self, sql: &str) -> i64 {
        self.db.query(sql).unwrap().parse().unwrap()
    }
}

/// An MCP tool call on `runner` with `token`, in a session of its own.
fn call(runner: &Server, token: &str, name: &str, args: Value) -> Value {
    let session = mcp_session(runner.addr, token);
    tool(runner.addr, token, &session, name, args)
}

#[test]
fn what_an_operator_does_on_one_runner_holds_on_the_other() {
    if !support::executor_backend("bwrap") {
        assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
        return;
    }
    let Some(mut f) = fleet() else { return };
    let (url, commit) = f.repo("team/scripted.git", scripted());
    // Runner A starts first: the database is new, so A makes the first operator token. B
    // finds tokens there and makes none; A's token works on B.
    let a: World = world_of(f.runner("runner-a", "bwrap"));
    let b = f.runner("runner-b", "none");
    assert!(
        !b.log.lock().unwrap().contains("first start")
            && !b.tmp.path().join("home/operator-token").exists(),
        "the second runner made a token of its own"
    );
    let member = json!({"kind": "git", "instanceId": "team", "url": url, "ref": commit});
    let set = a.op(
        "POST",
        "/api/v1/sets",
        Some(json!({"id": "team", "description": "The team's.", "members": [member]})),
    );
    assert_eq!(set["revision"], 1, "{set}");

    // A opens the set from git, and so publishes the toolkit to the bucket.
    let opened_a = call(
        &a.server,
        &a.operator,
        "workspace_open",
        json!({"idempotencyKey": "on-a", "toolkits": [{"kind": "set", "id": "team"}]}),
    );
    assert_eq!(opened_a["isError"], false, "{opened_a}");
    f.git.server.stop();

    // B knows the set from the shared database and the toolkit from the bucket: no git.
    let opened_b = call(
        &b,
        &a.operator,
        "workspace_open",
        json!({"idempotencyKey": "on-b", "toolkits": [{"kind": "set", "id": "team"}]}),
    );
    let result = &opened_b["structuredContent"];
    assert_eq!(opened_b["isError"], false, "{opened_b}");
    assert_eq!(result["toolkits"][0]["mode"], "remote", "{opened_b}");
    assert_eq!(result["toolkits"][0]["set"]["id"], "team", "{opened_b}");
    assert_eq!(result["toolkits"][0]["set"]["revision"], 1, "{opened_b}");

    // A script on A waits for an approval; the operator gives it on B; A then runs it.
    let ws = opened_a["structuredContent"]["workspace"].as_str().unwrap();
    let run = || {
        call(
            &a.server,
            &a.operator,
            "skills_run",
            json!({"workspace": ws, "skill": "alpha", "script": "scripts/hello.sh"}),
        )
    };
    let refused = run();
    assert_eq!(
        refused["structuredContent"]["code"], "FORBIDDEN",
        "{refused}"
    );
    let digest = refused["structuredContent"]["details"]["digest"].clone();
    let approval = a
        .http
        .post(format!("http://{}/api/v1/approvals", b.addr))
        .bearer_auth(&a.operator)
        .header("Content-Type", "application/json")
        .body(json!({"digest": digest, "skill": "alpha", "reason": "read it on B"}).to_string())
        .send()
        .unwrap();
    assert_eq!(approval.status(), 201, "{:?}", approval.text());
    let ran = run();
    assert_eq!(ran["isError"], false, "{ran}");
    assert!(
        ran["structuredContent"]["stdout"]
            .as_str()
            .unwrap()
            .contains("hello from alpha"),
        "{ran}"
    );
    // One audit log for the fleet: A's set and B's approval are both in it.
    let actions = a.audit_actions();
    assert!(actions.iter().any(|x| x == "set.create"), "{actions:?}");
    assert!(actions.iter().any(|x| x == "approval.grant"), "{actions:?}");
}

#[test]
fn one_key_opened_on_two_runners_at_once_makes_one_workspace() {
    let Some(f) = fleet() else { return };
    let (url, commit) = f.repo("team/skills.git", scripted());
    let a = world_of(f.runner("runner-a", "none"));
    let b = f.runner("runner-b", "none");
    let args = json!({
        "idempotencyKey": "once",
        "toolkits": [{"kind": "git", "instanceId": "team", "url": url, "ref": commit}],
    });
    let answers: Vec<Value> = std::thread::scope(|s| {
        let on_a = s.spawn(|| call(&a.server, &a.operator, "workspace_open", args.clone()));
        let on_b = s.spawn(|| call(&b, &a.operator, "workspace_open", args.clone()));
        vec![on_a.join().unwrap(), on_b.join().unwrap()]
    });
    let opened: Vec<&Value> = answers.iter().filter(|r| r["isError"] == false).collect();
    assert_eq!(opened.len(), 1, "{answers:?}");
    let ws = opened[0]["structuredContent"]["workspace"].clone();
    // The other runner names the workspace and where it is, so a platform can route there.
    let refused = answers.iter().find(|r| r["isError"] == true).unwrap();
    assert_eq!(
        refused["structuredContent"]["code"], "CONFLICT",
        "{refused}"
    );
    assert_eq!(
        refused["structuredContent"]["details"]["workspace"], ws,
        "{refused}"
    );
    assert_eq!(
        f.count("SELECT COUNT(*) FROM workspaces WHERE idempotency_key = 'once'"),
        1
    );

    // A runner starting up frees the keys of half-made workspaces, but only its own: a third
    // runner (nothing on its disk) leaves the other's workspace its key.
    drop(f.runner("runner-c", "none"));
    assert_eq!(
        f.count("SELECT COUNT(*) FROM workspaces WHERE idempotency_key = 'once'"),
        1,
        "a third runner starting up freed the key"
    );
}

#[test]
fn a_runner_whose_database_connection_is_cut_connects_again() {
    let Some(f) = fleet() else { return };
    let a = world_of(f.runner("runner-a", "none"));
    a.op("GET", "/api/v1/sets", None);
    // The server (or a proxy in front of it) drops every connection of the harness.
    let cut = cut_every_connection(&f.db);
    assert_ne!(cut, 0, "no connection to cut");
    // A read and a write after it both succeed, on a new connection.
    a.op("GET", "/api/v1/sets", None);
    let made = a.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "after-the-cut", "role": "client"})),
    );
    assert!(
        made["token"].as_str().unwrap().starts_with("cht_"),
        "{made}"
    );
    let cut = cut_every_connection(&f.db);
    assert_ne!(cut, 0);
    a.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "after-the-second-cut", "role": "client"})),
    );
    assert!(
        a.server.log.lock().unwrap().contains("connecting again"),
        "the server did not say it reconnected"
    );
}

/// Ends every other session on the test's database, as an administrator or a failover does,
/// and waits until their server processes are gone; returns how many there were.
fn cut_every_connection(db: &Database) -> usize {
    let others =
        "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()";
    let cut: usize = db
        .query(&format!("SELECT COUNT(pg_terminate_backend(pid)) {others}"))
        .unwrap()
        .parse()
        .unwrap();
    // pg_terminate_backend only signals: a statement sent at once may still be answered by
    // the old session (or by its FATAL message).
    for _ in 0..100 {
        if db.query(&format!("SELECT COUNT(*) {others}")).unwrap() == "0" {
            return cut;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("the sessions cut are still there after 2 s");
}

/// A database that stays out of reach: what needs it fails `UPSTREAM` with `retryable`, an
/// agent at work goes on reading its workspace's skills (its token was checked within the
/// last minute), and once the database answers again everything does.
#[test]
fn a_runner_whose_database_stays_down_says_upstream_and_goes_on_when_it_is_back() {
    let Some(f) = fleet() else { return };
    let relay = support::postgres::Relay::start();
    let a = world_of(f.runner_on("runner-a", "none", &relay.url(&f.db.url())));
    let session = mcp_session(a.server.addr, &a.operator);
    let opened = a.tool(
        session.as_str(),
        "workspace_open",
        json!({"idempotencyKey": "down"}),
    );
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let read = json!({"workspace": ws, "skill": "cloud-harness-conflicts"});
    assert_ne!(
        a.tool(&session, "skills_read", read.clone())["isError"],
        true
    );

    relay.cut();
    let (status, body) = a.call("GET", "/api/v1/sets", Some(&a.operator), None);
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["code"], "UPSTREAM", "{body}");
    assert_eq!(body["details"]["retryable"], true, "{body}");
    // A second call past the auth check's cache: the same answer, never a 401.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (status, body) = a.call(
        "POST",
        "/api/v1/tokens",
        Some(&a.operator),
        Some(r#"{"name":"down","role":"client"}"#),
    );
    assert_eq!((status, &body["code"]), (502, &json!("UPSTREAM")), "{body}");
    let still = a.tool(&session, "skills_read", read.clone());
    assert_ne!(still["isError"], true, "{still}");
    assert!(still["structuredContent"]["content"]
        .as_str()
        .unwrap()
        .contains("name: cloud-harness-conflicts"));

    relay.restore();
    a.op("GET", "/api/v1/sets", None);
    a.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "back", "role": "client"})),
    );
}

/// The database goes away under load and comes back: eight writers keep making tokens
/// through it. Every call ends within its bound and either succeeds or is refused
/// `UPSTREAM`/`TIMEOUT` (never a 500, never a hang); once it is back every call succeeds,
/// with no restart of the harness; and every token whose making was acknowledged is there.
#[test]
fn writes_under_load_through_a_database_outage_are_kept_or_refused_typed() {
    let Some(f) = fleet() else { return };
    let relay = support::postgres::Relay::start();
    let a = world_of(f.runner_on("runner-a", "none", &relay.url(&f.db.url())));
    let started = std::time::Instant::now();
    let (cut_at, back_at, end_at) = (1500, 3500, 6500);
    // A call: the token's name, the status and answer, when it started and how long it took.
    type Call = (String, u16, Value, u128, u128);
    let outcomes: Vec<Vec<Call>> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let a = &a;
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    let mut i = 0;
                    while started.elapsed().as_millis() < end_at {
                        let name = format!("load-{w}-{i}");
                        let at = started.elapsed().as_millis();
                        let body = json!({"name": name, "role": "client"}).to_string();
                        let (status, v) =
                            a.call("POST", "/api/v1/tokens", Some(&a.operator), Some(&body));
                        let took = started.elapsed().as_millis() - at;
                        seen.push((name, status, v, at, took));
                        i += 1;
                    }
                    seen
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(cut_at as u64));
        relay.cut();
        std::thread::sleep(std::time::Duration::from_millis((back_at - cut_at) as u64));
        relay.restore();
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let all: Vec<_> = outcomes.iter().flatten().collect();
    let refused = all.iter().filter(|o| o.1 >= 300).count();
    for (name, status, v, at, took) in &all {
        assert!(
            matches!(status, 200 | 201 | 502 | 504),
            "{name} at {at} ms: {status} {v}"
        );
        if *status >= 300 {
            assert!(
                matches!(v["code"].as_str(), Some("UPSTREAM" | "TIMEOUT")),
                "{name}: {v}"
            );
            assert_eq!(v["details"]["retryable"], true, "{name}: {v}");
        }
        assert!(*took < 40_000, "{name} took {took} ms");
    }
    assert!(
        refused > 0,
        "the outage refused nothing: was the relay cut?"
    );
    // Back: the calls made a second after it came back all succeeded.
    let late: Vec<_> = all.iter().filter(|o| o.3 > back_at + 1000).collect();
    assert!(!late.is_empty(), "no call after the database came back");
    for (name, status, v, at, _) in &late {
        assert!(
            (200..300).contains(status),
            "{name} at {at} ms, after the outage: {v}"
        );
    }
    // Every acknowledged token is there.
    let listed = a.op("GET", "/api/v1/tokens", None).to_string();
    for (name, status, ..) in &all {
        if (200..300).contains(status) {
            assert!(
                listed.contains(&format!("\"{name}\"")),
                "{name} was acknowledged and lost"
            );
        }
    }
    println!(
        "database outage under load: {} calls, {} refused typed, every acknowledged one kept",
        all.len(),
        refused
    );
}

//! One client at each of its quotas while another is served: the refusal names the limit and
//! its value (HTTP 429 with `Retry-After`, a JSON-RPC error, a tool error result), and the
//! other principal's calls go through at once.

use crate::support::api::{mcp_session, tool, world_with, World};
use crate::support::http::{raw, raw_as};
use crate::support::{dir, file, skill, warm_toolkit, Certs, GitServer, Node, Repo};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A tool error result of RESOURCE_EXHAUSTED at `limit` of `value`.
fn exhausted(result: &Value, limit: &str, value: u64) {
    let s = &result["structuredContent"];
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(s["code"], "RESOURCE_EXHAUSTED", "{result}");
    assert_eq!(s["status"], 429, "{result}");
    assert_eq!(s["details"]["limit"], limit, "{result}");
    assert_eq!(s["details"]["value"], value, "{result}");
    assert!(
        s["details"]["retryAfter"].as_u64().unwrap() >= 1,
        "{result}"
    );
    assert!(s["message"].as_str().unwrap().contains(limit), "{result}");
}

fn ok(result: &Value) -> &Value {
    assert_eq!(result["isError"], false, "{result}");
    &result["structuredContent"]
}

/// The raw HTTP answer's header `name`, if any.
fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    answer.lines().take_while(|l| !l.is_empty()).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn workspaces_sessions_requests_acquisitions_and_imports_are_bounded_per_principal() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let repo = Repo::create(&tmp.path().join("repos"), "team/kit.git", false);
    let commits: Vec<String> = (1..=2)
        .map(|i| {
            repo.commit(dir(vec![(
                "skills",
                dir(vec![(
                    "lint",
                    skill("lint", &format!("Lint it, take {i}.")),
                )]),
            )]))
        })
        .collect();
    let git = GitServer::start_with(&tmp.path().join("repos"), &certs, "127.0.0.1", 0.0);
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/warm");
    crate::support::materialize(&src, &dir(vec![("tidy", skill("tidy", "Tidy up."))]));
    let warm = serde_json::to_value(warm_toolkit(&store, &src, "warm")).unwrap();
    drop(store);
    let hosts = format!("{},{}", git.host(), crate::support::WARM_HOST);
    let ca = certs.ca.display().to_string();
    let w = world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", hosts.as_str()),
            ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
            ("CLOUD_HARNESS_LIMIT_WORKSPACES", "2"),
            ("CLOUD_HARNESS_LIMIT_SESSIONS", "3"),
            ("CLOUD_HARNESS_LIMIT_ACQUISITIONS_PER_HOUR", "1"),
            ("CLOUD_HARNESS_LIMIT_IMPORTS_PER_HOUR", "1"),
            ("CLOUD_HARNESS_LIMIT_REQUESTS_PER_SECOND", "20"),
        ],
    );
    let (alice, bob) = (w.client("alice"), w.client("bob"));
    let (sa, sb) = (
        mcp_session(w.server.addr, &alice),
        mcp_session(w.server.addr, &bob),
    );
    let addr = w.server.addr;
    let open = |token: &str, session: &str, key: &str, kit: &Value| {
        tool(
            addr,
            token,
            session,
            "workspace_open",
            json!({"idempotencyKey": key, "toolkits": [kit]}),
        )
    };
    let kit = |commit: &str| json!({"kind": "git", "instanceId": "kit", "url": git.url("team/kit.git"), "ref": commit});

    // Acquisitions from the network: one an hour. The second commit is refused for Alice,
    // a warm start of the first is not (it fetches nothing), and Bob has his own budget.
    ok(&open(&alice, &sa, "cold-1", &kit(&commits[0])));
    exhausted(
        &open(&alice, &sa, "cold-2", &kit(&commits[1])),
        "acquisitions_per_hour",
        1,
    );
    ok(&open(&bob, &sb, "cold-2", &kit(&commits[1])));

    // Open workspaces: two. Alice's third is refused, Bob opens his second; a replay of a
    // key Alice holds is no new workspace; once she closes one, she may open again.
    let second = ok(&open(&alice, &sa, "warm-1", &warm))["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    exhausted(&open(&alice, &sa, "warm-2", &warm), "workspaces", 2);
    ok(&open(&alice, &sa, "warm-1", &warm));
    ok(&open(&bob, &sb, "warm-1", &warm));
    let usage = w.call("GET", "/api/v1/whoami", Some(&alice), None).1;
    assert_eq!(
        usage["usage"]["workspaces"],
        json!({"used": 2, "limit": 2}),
        "{usage}"
    );
    let metrics = w.call("GET", "/metrics", Some(&w.operator), None).1;
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains(
            r#"cloud_harness_principal_usage{principal="token:alice",limit="workspaces"} 2"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"cloud_harness_quota_refusals_total{limit="workspaces"} 1"#),
        "{metrics}"
    );
    ok(&tool(
        addr,
        &alice,
        &sa,
        "workspace_close",
        json!({"workspace": second}),
    ));
    ok(&open(&alice, &sa, "warm-2", &warm));

    // Sessions: three (Alice has one); her fourth initialize is 429 with Retry-After and a
    // JSON-RPC error naming the limit, while Bob starts one.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let as_alice = format!("Bearer {alice}");
    mcp_session(addr, &alice);
    mcp_session(addr, &alice);
    let refused = raw(addr, init, &[("Authorization", &as_alice)]);
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert_eq!(header(&refused, "retry-after"), Some("5"), "{refused}");
    assert!(refused.contains(r#""limit":"sessions""#), "{refused}");
    // Nor does an initialize the guard could misread: another spelling of the content type,
    // an escaped method name, a method named twice (whatever the SDK makes of that, no
    // session beyond the cap is left).
    let escaped = init.replace(r#""initialize""#, r#""initializ\u0065""#);
    let twice = init.replacen(r#""method""#, r#""method":"ping","method""#, 1);
    for (content_type, body) in [
        ("Application/JSON ; charset=utf-8", init),
        ("application/json", escaped.as_str()),
        ("application/json", twice.as_str()),
    ] {
        let answer = raw_as(
            addr,
            content_type,
            "2025-11-25",
            body,
            &[("Authorization", &as_alice)],
        );
        assert!(
            header(&answer, "mcp-session-id").is_none(),
            "{content_type} {body}: {answer}"
        );
    }
    let answer = raw_as(
        addr,
        "text/plain",
        "2025-11-25",
        init,
        &[("Authorization", &as_alice)],
    );
    assert!(answer.starts_with("HTTP/1.1 415"), "{answer}");
    mcp_session(addr, &bob);

    // Requests: twenty a second, bursts of forty. Alice's flood is refused in part, with
    // Retry-After; Bob's next request is served.
    let mut refusals = 0;
    for _ in 0..200 {
        let r = w
            .http
            .get(w.url("/api/v1/whoami"))
            .bearer_auth(&alice)
            .send()
            .unwrap();
        if r.status().as_u16() == 429 {
            assert!(r.headers().contains_key("retry-after"));
            let body: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
            assert_eq!(body["code"], "RESOURCE_EXHAUSTED", "{body}");
            assert_eq!(body["details"]["limit"], "requests_per_second", "{body}");
            refusals += 1;
        }
    }
    assert!(refusals > 0, "200 requests at once were all served");
    let (status, _) = w.call("GET", "/api/v1/whoami", Some(&bob), None);
    assert_eq!(status, 200);

    // Imports: one an hour for the operator who submits them.
    let import = json!({"toolkit": warm}).to_string();
    let (status, v) = w.call("POST", "/api/v1/imports", Some(&w.operator), Some(&import));
    assert!((200..300).contains(&status), "{status} {v}");
    let r = w
        .http
        .post(w.url("/api/v1/imports"))
        .bearer_auth(&w.operator)
        .header("Content-Type", "application/json")
        .body(import)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry > 60,
        "an hourly budget's next slot is minutes away: {retry}"
    );
    let body: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert_eq!(body["details"]["limit"], "imports_per_hour", "{body}");

    // The operator sees everyone's usage.
    let all = w.op("GET", "/api/v1/usage", None);
    let alice_usage = all["principals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["principal"] == "token:alice")
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(alice_usage["usage"]["sessions"]["used"], 3, "{all}");
    assert_eq!(
        alice_usage["usage"]["acquisitions_per_hour"]["used"], 1,
        "{all}"
    );
}

/// A toolkit whose skill has scripts that sleep, spin, shout and hog memory.
fn busy_toolkit(tmp: &tempfile::TempDir) -> Value {
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/busy");
    let exec = |body: &str| Node::Exec(body.as_bytes().to_vec());
    crate::support::materialize(
        &src,
        &dir(vec![(
            "busy",
            dir(vec![
                (
                    "SKILL.md",
                    file("---\nname: busy\ndescription: Busy scripts.\n---\nRun them.\n"),
                ),
                (
                    "scripts",
                    dir(vec![
                        ("slow.sh", exec("#!/bin/sh\nsleep 4\necho slept\n")),
                        ("spin.sh", exec("#!/bin/sh\nwhile :; do :; done\n")),
                        (
                            "loud.sh",
                            exec("#!/bin/sh\nhead -c 100000 /dev/zero | tr '\\0' x\n"),
                        ),
                        (
                            "hog.py",
                            exec("#!/usr/bin/env python3\nx = bytearray(1 << 30)\nprint(len(x))\n"),
                        ),
                    ]),
                ),
            ]),
        )]),
    );
    serde_json::to_value(warm_toolkit(&store, &src, "busy")).unwrap()
}

#[test]
fn a_run_is_bounded_in_cpu_memory_output_and_runs_at_once() {
    if !crate::support::executor_backend("bwrap") {
        assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let kit = busy_toolkit(&tmp);
    let w = world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", crate::support::WARM_HOST),
            ("CLOUD_HARNESS_LIMIT_RUNS", "1"),
            ("CLOUD_HARNESS_LIMIT_QUEUED_RUNS", "0"),
            ("CLOUD_HARNESS_LIMIT_RUN_CPU_SECONDS", "1"),
            ("CLOUD_HARNESS_LIMIT_RUN_MEMORY", "268435456"),
            ("CLOUD_HARNESS_LIMIT_RUN_OUTPUT", "1000"),
        ],
    );
    let (alice, bob) = (w.client("alice"), w.client("bob"));
    let (sa, sb) = (
        mcp_session(w.server.addr, &alice),
        mcp_session(w.server.addr, &bob),
    );
    let addr = w.server.addr;
    let open = |token: &str, session: &str| {
        ok(&tool(
            addr,
            token,
            session,
            "workspace_open",
            json!({"idempotencyKey": "busy", "toolkits": [kit]}),
        ))
        .clone()
    };
    let (wa, wb) = (open(&alice, &sa), open(&bob, &sb));
    let digest = crate::support::skill_digest(&wa, "busy");
    w.op(
        "POST",
        "/api/v1/approvals",
        Some(json!({"digest": digest, "skill": "busy"})),
    );
    let run = |token: &str, session: &str, ws: &Value, script: &str| {
        tool(
            addr,
            token,
            session,
            "skills_run",
            json!({"workspace": ws["workspace"], "skill": "busy", "script": script}),
        )
    };

    // Output past the limit is counted, not kept.
    let loud = run(&alice, &sa, &wa, "scripts/loud.sh");
    let loud = ok(&loud);
    assert_eq!(loud["stdout"].as_str().unwrap().len(), 1000, "{loud}");
    assert_eq!(loud["stdoutBytes"], 100000);
    assert_eq!(loud["stdoutTruncated"], true);
    // A script that spins is stopped at its CPU time (SIGXCPU, then SIGKILL), long before
    // its timeout.
    let started = Instant::now();
    let spin = run(&alice, &sa, &wa, "scripts/spin.sh");
    let spin = ok(&spin);
    // Killed by SIGXCPU or SIGKILL: a signal, or bubblewrap's 128 + the signal.
    let killed = matches!(spin["signal"].as_i64(), Some(24 | 9))
        || matches!(spin["exitCode"].as_i64(), Some(152 | 137));
    assert!(killed, "{spin}");
    assert_eq!(spin["timedOut"], false, "{spin}");
    assert!(started.elapsed() < Duration::from_secs(30), "{spin}");
    // An allocation past the memory limit fails inside the run.
    let hog = run(&alice, &sa, &wa, "scripts/hog.py");
    let hog = ok(&hog);
    assert_ne!(hog["exitCode"], 0, "{hog}");
    assert!(
        hog["stderr"].as_str().unwrap().contains("MemoryError"),
        "{hog}"
    );

    // One run at once, none waiting: Alice's second is refused while her first runs, and
    // Bob's runs.
    // (In a session of its own: the raw client numbers every request alike.)
    let slow = {
        let (alice, wa) = (alice.clone(), wa.clone());
        let session = mcp_session(addr, &alice);
        std::thread::spawn(move || run_owned(addr, &alice, &session, &wa, "scripts/slow.sh"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let usage = w.call("GET", "/api/v1/whoami", Some(&alice), None).1;
        if usage["usage"]["runs"]["used"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow run never started: {usage}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    exhausted(&run(&alice, &sa, &wa, "scripts/loud.sh"), "queued_runs", 0);
    ok(&run(&bob, &sb, &wb, "scripts/loud.sh"));
    let slept = slow.join().unwrap();
    assert!(
        ok(&slept)["stdout"].as_str().unwrap().contains("slept"),
        "{slept}"
    );
    ok(&run(&alice, &sa, &wa, "scripts/loud.sh"));
}

fn run_owned(
    addr: std::net::SocketAddr,
    token: &str,
    session: &str,
    ws: &Value,
    script: &str,
) -> Value {
    tool(
        addr,
        token,
        session,
        "skills_run",
        json!({"workspace": ws["workspace"], "skill": "busy", "script": script}),
    )
}

/// MCP calls outlive their HTTP requests (the SDK runs each on a task of its own): each one
/// holds a slot of its principal's `requests_in_flight` until it ends.
#[test]
fn calls_in_flight_are_bounded_per_principal() {
    if !crate::support::executor_backend("bwrap") {
        assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let kit = busy_toolkit(&tmp);
    let w = world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", crate::support::WARM_HOST),
            ("CLOUD_HARNESS_LIMIT_REQUESTS_IN_FLIGHT", "2"),
        ],
    );
    let (alice, bob) = (w.client("alice"), w.client("bob"));
    let addr = w.server.addr;
    let (sa, sb) = (mcp_session(addr, &alice), mcp_session(addr, &bob));
    let open = |token: &str, session: &str| {
        ok(&tool(
            addr,
            token,
            session,
            "workspace_open",
            json!({"idempotencyKey": "calls", "toolkits": [kit]}),
        ))
        .clone()
    };
    let (wa, wb) = (open(&alice, &sa), open(&bob, &sb));
    let digest = crate::support::skill_digest(&wa, "busy");
    w.op(
        "POST",
        "/api/v1/approvals",
        Some(json!({"digest": digest, "skill": "busy"})),
    );
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let (alice, wa) = (alice.clone(), wa.clone());
            let session = mcp_session(addr, &alice);
            std::thread::spawn(move || run_owned(addr, &alice, &session, &wa, "scripts/slow.sh"))
        })
        .collect();
    // Watched by the operator: a request of Alice's own would take one of her two slots, and
    // a run arriving meanwhile would be refused. Until both POSTs have had their answers'
    // heads, each holds an HTTP slot as well as its call's (4 in flight, not 2): a request
    // then is refused before it is a call.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let usage = w.op("GET", "/api/v1/usage", None);
        let used = |limit: &str| {
            usage["principals"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["principal"] == "token:alice")
                .map(|p| p["usage"][limit]["used"].clone())
        };
        if used("runs") == Some(json!(2)) && used("requests_in_flight") == Some(json!(2)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow runs never started: {usage}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let list = |token: &str, session: &str, ws: &Value| {
        tool(
            addr,
            token,
            session,
            "skills_list",
            json!({"workspace": ws["workspace"]}),
        )
    };
    exhausted(&list(&alice, &sa, &wa), "requests_in_flight", 2);
    ok(&list(&bob, &sb, &wb));
    for run in slow {
        ok(&run.join().unwrap());
    }
    ok(&list(&alice, &sa, &wa));
}

/// Session-less calls (the 2026-07-28 protocol) are each served by a server made for the one
/// request: a client calling in a loop leaves no task (a binding to its workspace's changes)
/// or session behind.
#[test]
fn session_less_calls_leave_nothing_behind() {
    let (w, warm) = warm_world(&[]);
    let alice = w.client("alice");
    let addr = w.server.addr;
    let session = mcp_session(addr, &alice);
    let ws = ok(&tool(
        addr,
        &alice,
        &session,
        "workspace_open",
        json!({"idempotencyKey": "loop", "toolkits": [warm]}),
    ))["workspace"]
        .clone();
    let tasks = || -> u64 {
        let (status, text) = w.call("GET", "/metrics", Some(&w.operator), None);
        assert_eq!(status, 200, "{text}");
        let text = text.as_str().unwrap().to_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("cloud_harness_runtime_tasks "))
            .unwrap_or_else(|| panic!("{text}"))
            .trim()
            .parse()
            .unwrap()
    };
    let auth = format!("Bearer {alice}");
    let call = |name: &str| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": name, "arguments": {"workspace": ws},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            },
        }});
        let answer = raw_as(
            addr,
            "application/json",
            "2026-07-28",
            &body.to_string(),
            &[
                ("Authorization", &auth),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", name),
            ],
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(header(&answer, "mcp-session-id").is_none(), "{answer}");
        assert!(answer.contains(r#""isError":false"#), "{answer}");
    };
    call("skills_list");
    let before = tasks();
    for _ in 0..300 {
        call("skills_list");
    }
    // Tasks end as their requests do; a few may still be on their way out.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut after = tasks();
    while after > before + 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        after = tasks();
    }
    assert!(
        after <= before + 20,
        "300 session-less calls left tasks behind: {before} before, {after} after"
    );
    let all = w.op("GET", "/api/v1/usage", None);
    let sessions = all["principals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["principal"] == "token:alice")
        .map(|p| p["usage"]["sessions"]["used"].clone());
    assert_eq!(sessions, Some(json!(1)), "{all}");
}

/// A server without executors, and a warm toolkit of one skill.
fn warm_world(env: &[(&str, &str)]) -> (World, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/warm");
    crate::support::materialize(&src, &dir(vec![("tidy", skill("tidy", "Tidy up."))]));
    let warm = serde_json::to_value(warm_toolkit(&store, &src, "warm")).unwrap();
    drop(store);
    let mut all = vec![
        ("CLOUD_HARNESS_EXECUTOR", "none"),
        ("CLOUD_HARNESS_CONTAINERS", "off"),
        ("ALLOWED_GIT_HOSTS", crate::support::WARM_HOST),
    ];
    all.extend_from_slice(env);
    (world_with(tmp, &all), warm)
}

/// A close that cannot finish (a mount inside the workspace's tree, here) keeps counting
/// against its owner and stays visible to the owner, as failed and saying why; a second close,
/// once the obstacle is gone, frees it.
#[test]
fn a_close_that_cannot_finish_keeps_the_workspace_counted_and_closable() {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(std::env::var_os("CI").is_none(), "mounting needs root");
        return;
    }
    let (w, warm) = warm_world(&[("CLOUD_HARNESS_LIMIT_WORKSPACES", "1")]);
    let alice = w.client("alice");
    let addr = w.server.addr;
    let session = mcp_session(addr, &alice);
    let open = |key: &str| {
        tool(
            addr,
            &alice,
            &session,
            "workspace_open",
            json!({"idempotencyKey": key, "toolkits": [warm]}),
        )
    };
    let close = |ws: &Value| {
        tool(
            addr,
            &alice,
            &session,
            "workspace_close",
            json!({"workspace": ws}),
        )
    };
    let ws = ok(&open("first"))["workspace"].clone();
    let inside = w
        .home()
        .join("workspaces")
        .join(ws.as_str().unwrap())
        .join("in-the-way");
    std::fs::create_dir_all(&inside).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "in-the-way"])
        .arg(&inside)
        .status()
        .unwrap();
    assert!(mounted.success());
    let refused = close(&ws);
    let unmounted = std::process::Command::new("umount")
        .arg(&inside)
        .status()
        .unwrap();
    assert!(unmounted.success());
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(
        refused["structuredContent"]["code"], "CONFLICT",
        "{refused}"
    );

    // Still Alice's, still counted, and saying why.
    exhausted(&open("second"), "workspaces", 1);
    let (status, mine) = w.call("GET", "/api/v1/workspaces", Some(&alice), None);
    assert_eq!(status, 200, "{mine}");
    assert!(mine.to_string().contains(r#""state":"failed""#), "{mine}");
    let listed = tool(
        addr,
        &alice,
        &session,
        "skills_list",
        json!({"workspace": ws}),
    );
    let message = listed["structuredContent"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("did not finish"), "{listed}");
    assert!(
        !message.contains(&w.home().display().to_string()),
        "{listed}"
    );

    ok(&close(&ws));
    ok(&open("second"));
}

//! The registry through the API, against a real `serve --http` on loopback and a local HTTPS
//! git server standing in for github.com: pins moved (acquired first) and rolled back, checking
//! for updates by refs only, an unpinned preset opening warm with the git server stopped, and
//! operator entries.

use crate::support;

use serde_json::{json, Value};
use support::api::{github_world, mcp_session, tool, World};
use support::{dir, skill, Certs, GitServer, Repo};

struct Fixture {
    w: World,
    git: GitServer,
    /// Three commits of obra/superpowers on the git server, oldest first.
    commits: Vec<String>,
    kit: String,
    _certs: Certs,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let superpowers = Repo::create(&repos, "obra/superpowers.git", false);
    let commits: Vec<String> = (1..=3)
        .map(|n| {
            superpowers.commit(dir(vec![(
                "skills",
                dir(vec![(
                    "using-superpowers",
                    skill("using-superpowers", &format!("Version {n}.")),
                )]),
            )]))
        })
        .collect();
    let team = Repo::create(&repos, "team/kit.git", false);
    let kit = team.commit(dir(vec![(
        "skills",
        dir(vec![("lint", skill("lint", "Lint it."))]),
    )]));
    let git = GitServer::start(&repos, &certs);
    let w = github_world(tmp, &git, &certs);
    Fixture {
        w,
        git,
        commits,
        kit,
        _certs: certs,
    }
}

const PRESET: &str = "/api/v1/registry/obra/superpowers";

fn open(f: &Fixture, key: &str, toolkit: Value) -> Value {
    let session = mcp_session(f.w.server.addr, &f.w.operator);
    tool(
        f.w.server.addr,
        &f.w.operator,
        &session,
        "workspace_open",
        json!({"idempotencyKey": key, "toolkits": [toolkit]}),
    )
}

#[test]
fn a_pin_moves_rolls_back_and_an_unpinned_preset_then_opens_warm_without_the_git_server() {
    let mut f = fixture();
    let w = &f.w;
    // Shipped presets come pinned at the commit they were tested at.
    let shipped = w.op("GET", PRESET, None);
    assert_eq!(shipped["entry"]["origin"], "shipped");
    assert_eq!(shipped["pins"][0]["actor"], "system:shipped");
    let (c1, c2, c3) = (&f.commits[0], &f.commits[1], &f.commits[2]);
    for c in [c1, c2] {
        let moved = w.op(
            "POST",
            &format!("{PRESET}/pin"),
            Some(json!({"commit": c, "reason": "reviewed"})),
        );
        assert_eq!(moved["commit"], c.as_str());
    }
    let back = w.op("POST", &format!("{PRESET}/rollback"), None);
    assert_eq!(back["commit"], c1.as_str());
    let history = w.op("GET", PRESET, None);
    let pins: Vec<&str> = history["pins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["commit"].as_str().unwrap())
        .collect();
    assert_eq!(
        pins[..3],
        [c1.as_str(), c2.as_str(), c1.as_str()],
        "{history}"
    );
    assert_eq!(history["entry"]["pin"]["commit"], c1.as_str());
    // The remote's head is newer than the pin.
    let check = w.op("POST", &format!("{PRESET}/updates"), None);
    assert_eq!(
        (
            check["head"].as_str(),
            check["pinned"].as_str(),
            check["upToDate"].as_bool()
        ),
        (Some(c3.as_str()), Some(c1.as_str()), Some(false)),
        "{check}"
    );

    // No git server: the pinned preset opens from the store alone.
    let before = f.git.requests();
    f.git.stop();
    let opened = open(
        &f,
        "warm",
        json!({"kind": "preset", "id": "obra/superpowers"}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let t = &opened["structuredContent"]["toolkits"][0];
    assert_eq!(
        (t["commit"].as_str(), t["warm"].as_bool()),
        (Some(c1.as_str()), Some(true)),
        "{t}"
    );
    assert_eq!(f.git.requests(), before, "a warm open asked the git server");
    // A pin cannot move to a commit that cannot be acquired: it stays where it was.
    let (status, v) = f.w.call(
        "POST",
        &format!("{PRESET}/pin"),
        Some(&f.w.operator),
        Some(&json!({"commit": c3}).to_string()),
    );
    assert!(status >= 500, "{status} {v}");
    assert_eq!(
        f.w.op("GET", PRESET, None)["entry"]["pin"]["commit"],
        c1.as_str()
    );
    let actions = f.w.audit_actions();
    assert_eq!(actions.iter().filter(|a| *a == "pin.move").count(), 3);
    assert!(actions.contains(&"registry.check".to_owned()));
}

#[test]
fn an_operator_entry_is_added_pinned_and_opens_and_bad_entries_store_nothing() {
    let f = fixture();
    let w = &f.w;
    let url = f.git.url("team/kit.git");
    let entry = json!({"id": "team/kit", "name": "Team kit", "description": "The team's skills.", "url": url, "commit": f.kit});
    let bad = [
        (
            json!({"id": "no-slash", "name": "n", "description": "d", "url": url, "commit": f.kit}),
            "id",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "a/b", "name": "n", "description": "d", "url": "https://localhost:1/x.git", "commit": f.kit}),
            "url",
            "FORBIDDEN",
        ),
        (
            json!({"id": "a/b", "name": "n", "description": "d", "url": url, "commit": "main"}),
            "commit",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "a/b", "name": "", "description": "d", "url": url, "commit": f.kit}),
            "name",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "a/b", "name": "n", "description": "d", "url": url, "commit": f.kit, "extra": 1}),
            "extra",
            "INVALID_ARGUMENT",
        ),
        (
            json!({"id": "obra/superpowers", "name": "n", "description": "d", "url": url, "commit": f.kit}),
            "id",
            "CONFLICT",
        ),
    ];
    for (body, field, code) in bad {
        let (status, v) = w.call(
            "POST",
            "/api/v1/registry",
            Some(&w.operator),
            Some(&body.to_string()),
        );
        assert_eq!(v["code"], code, "{body}: {status} {v}");
        if field != "extra" {
            assert_eq!(v["details"]["field"], field, "{body}: {v}");
        }
    }
    let listed = w.op("GET", "/api/v1/registry", None);
    assert_eq!(listed["entries"].as_array().unwrap().len(), 2, "{listed}");
    let added = w.op("POST", "/api/v1/registry", Some(entry.clone()));
    assert_eq!(
        (added["origin"].as_str(), added["pin"]["commit"].as_str()),
        (Some("operator"), Some(f.kit.as_str()))
    );
    let (status, _) = w.call(
        "POST",
        "/api/v1/registry",
        Some(&w.operator),
        Some(&entry.to_string()),
    );
    assert_eq!(status, 409);
    let opened = open(&f, "team", json!({"kind": "preset", "id": "team/kit"}));
    assert_eq!(opened["isError"], false, "{opened}");
    let t = &opened["structuredContent"]["toolkits"][0];
    assert_eq!(
        (t["instanceId"].as_str(), t["commit"].as_str()),
        (Some("team-kit"), Some(f.kit.as_str())),
        "{t}"
    );
    // A client may read the registry, not change it.
    let made = w.op(
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "reader", "role": "client"})),
    );
    let client = made["token"].as_str().unwrap();
    assert_eq!(w.call("GET", "/api/v1/registry", Some(client), None).0, 200);
    assert_eq!(
        w.call("POST", &format!("{PRESET}/rollback"), Some(client), None)
            .0,
        403
    );
}

//! A bundle's inventory and the search by file or skill, from the outside: a workspace opened
//! through MCP on `serve --http` from the local HTTPS git server; its bundle's inventory from
//! the CLI and the API (the same document), checked against the files its owner tier's mount
//! serves, walked on the host; a file's digest and a skill's name found in the bundle and in
//! the workspace that served it, before and after it closed.

use crate::support;

use cloud_harness_store::cas::Digest;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use support::api::{world_of, World};
use support::{dir, file, skill, Certs, GitServer, Node, Repo};

struct Fixture {
    w: World,
    url: String,
    commit: String,
    _git: GitServer,
    _certs: Certs,
}

const LINT_SKILL: &str =
    "---\nname: lint\ndescription: Lint the code.\n---\nRun `scripts/run.sh`.\n";

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let repo = Repo::create(&repos, "team/kit.git", false);
    let commit = repo.commit(dir(vec![(
        "skills",
        dir(vec![
            (
                "lint",
                dir(vec![
                    ("SKILL.md", file(LINT_SKILL)),
                    (
                        "scripts",
                        dir(vec![(
                            "run.sh",
                            Node::Exec(b"#!/bin/sh\necho lint\n".to_vec()),
                        )]),
                    ),
                ]),
            ),
            ("fmt", skill("fmt", "Format it, see references/guide.md.")),
        ]),
    )]));
    let git = GitServer::start(&repos, &certs);
    let ca = certs.ca.display().to_string();
    // Mounted, with a bubblewrap executor (as root, as CI runs).
    let w = world_of(support::http::server_mounting(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", &git.host()),
            ("CLOUD_HARNESS_EXTRA_CA", &ca),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
        ],
    ));
    let url = git.url("team/kit.git");
    Fixture {
        w,
        url,
        commit,
        _git: git,
        _certs: certs,
    }
}

/// Every file under `root`, walked on the host: path -> (SHA-256, size, mode).
fn walk(root: &std::path::Path) -> BTreeMap<String, (String, u64, String)> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                pending.push(e.path());
                continue;
            }
            let bytes = std::fs::read(e.path()).unwrap();
            let mode = match meta.permissions().mode() & 0o111 {
                0 => "0644",
                _ => "0755",
            };
            let path = e.path().strip_prefix(root).unwrap().display().to_string();
            out.insert(
                path,
                (Digest::of(&bytes).to_string(), meta.len(), mode.to_owned()),
            );
        }
    }
    out
}

/// The files an inventory lists: skill/path -> (SHA-256, size, mode).
fn listed(bom: &Value) -> BTreeMap<String, (String, u64, String)> {
    let prop = |c: &Value, name: &str| -> String {
        c["properties"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == format!("cloud-harness:{name}"))
            .map(|p| p["value"].as_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let mut out = BTreeMap::new();
    for skill in bom["components"].as_array().unwrap() {
        for f in skill["components"].as_array().unwrap() {
            let path = format!(
                "{}/{}",
                skill["name"].as_str().unwrap(),
                f["name"].as_str().unwrap()
            );
            let hash = format!("sha256:{}", f["hashes"][0]["content"].as_str().unwrap());
            out.insert(
                path,
                (hash, prop(f, "size").parse().unwrap(), prop(f, "mode")),
            );
        }
    }
    out
}

#[test]
fn a_bundles_inventory_matches_its_mount_and_a_file_or_skill_is_found_where_it_was_served() {
    let f = fixture();
    let w = &f.w;
    let session = w.session();
    let kit = json!({"kind": "git", "url": f.url, "instanceId": "kit", "ref": f.commit});
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "inv", "toolkits": [kit]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let out = &opened["structuredContent"];
    let ws = out["workspace"].as_str().unwrap().to_owned();
    let bundle = out["toolkits"][0]["bundle"].as_str().unwrap().to_owned();

    // The CLI and the API give the same document.
    let (code, text) = w.cli(&["cas", "inventory", &bundle]);
    assert_eq!(code, 0, "{text}");
    let bom: Value = serde_json::from_str(&text).unwrap();
    let api = w.op("GET", &format!("/api/v1/inventory/{bundle}"), None);
    assert_eq!(api, bom);
    assert_eq!(
        (bom["bomFormat"].as_str(), bom["specVersion"].as_str()),
        (Some("CycloneDX"), Some("1.5"))
    );
    let component = &bom["metadata"]["component"];
    assert_eq!(component["version"], f.commit.as_str());
    assert_eq!(component["externalReferences"][0]["url"], f.url.as_str());
    let props: BTreeMap<String, String> = component["properties"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(props["cloud-harness:bundle"], bundle);
    assert_eq!(props["cloud-harness:reach.reachable"], "true");
    assert_eq!(props["cloud-harness:reach.via"], "refs/heads/main");

    // What the owner tier's mount serves, walked on the host, is what the inventory lists.
    let mount = w
        .home()
        .join("workspaces")
        .join(&ws)
        .join("mounts")
        .join("owner-skills");
    let served = walk(&mount);
    assert!(served.contains_key("lint/scripts/run.sh"), "{served:?}");
    assert_eq!(listed(&bom), served);
    assert_eq!(served["lint/scripts/run.sh"].2, "0755");

    // A file found by its digest: in the bundle, and in the workspace that served it, for
    // the owner tier; the same from the CLI.
    let lint = Digest::of(LINT_SKILL.as_bytes()).to_string();
    let found = w.op("GET", &format!("/api/v1/inventory?file={lint}"), None);
    assert_eq!(
        found["held"],
        json!([{"bundle": bundle, "url": f.url, "commit": f.commit, "instanceId": "kit", "skill": "lint", "path": "SKILL.md"}])
    );
    let served_by = |found: &Value| -> Vec<(String, String)> {
        found["served"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["subject"].as_str().unwrap_or("").to_owned(),
                    a["tier"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(served_by(&found), [(ws.clone(), "owner".to_owned())]);
    let (code, text) = w.cli(&["cas", "inventory", "--file", &lint]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["held"],
        found["held"]
    );

    // After the workspace closed, the history still names it; a skill is found by name.
    let closed = w.tool(&session, "workspace_close", json!({"workspace": ws}));
    assert_eq!(closed["isError"], false, "{closed}");
    let after = w.op("GET", &format!("/api/v1/inventory?file={lint}"), None);
    assert_eq!(served_by(&after), [(ws.clone(), "owner".to_owned())]);
    let fmt = w.op("GET", "/api/v1/inventory?skill=fmt", None);
    assert_eq!(fmt["held"][0]["bundle"], bundle.as_str(), "{fmt}");
    assert_eq!(fmt["held"].as_array().unwrap().len(), 1);
    let none = w.op("GET", "/api/v1/inventory?skill=absent", None);
    assert_eq!(none, json!({"held": [], "served": [], "truncated": false}));

    // Bad questions are refused by name; a client may not ask (it names every principal's).
    for q in ["file=nothex", "file=x&skill=y", "", "other=1"] {
        let (status, v) = w.call(
            "GET",
            &format!("/api/v1/inventory?{q}"),
            Some(&w.operator),
            None,
        );
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{q}: {v}"
        );
    }
    let (status, v) = w.call(
        "GET",
        "/api/v1/inventory/sha256:00",
        Some(&w.operator),
        None,
    );
    assert_eq!(status, 400, "{v}");
    let unknown = Digest::of(b"no such bundle").to_string();
    let (status, _) = w.call(
        "GET",
        &format!("/api/v1/inventory/{unknown}"),
        Some(&w.operator),
        None,
    );
    assert_eq!(status, 404);
    let client = w.client("agent");
    for path in [
        format!("/api/v1/inventory?file={lint}"),
        format!("/api/v1/inventory/{bundle}"),
    ] {
        let (status, _) = w.call("GET", &path, Some(&client), None);
        assert_eq!(status, 403, "{path}");
    }
}

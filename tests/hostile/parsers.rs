//! SKILL.md front matters that expand when parsed (aliases of aliases, which once made the
//! server allocate gigabytes and abort) or nest deep (brackets by the hundred thousand, once
//! minutes of CPU), in a toolkit and in a project's repository tier, next to good skills: the workspace opens, the good skills are served, each bad one is listed as skipped
//! naming its file and the bound it broke (in `workspace_open`, `skills_list` and the library
//! page), the server's memory stays bounded, and it comes up again on the same home.

use crate::support::http::{answer_of, legacy_session, raw, server_in, Server};
use crate::support::{self, dir, file, skill, Certs, GitServer, Repo};
use serde_json::{json, Value};
use std::net::SocketAddr;

/// A string of `len` bytes, 200 aliases of it, 200 aliases of those: 40,000 copies (640 MB
/// for 16 KB, what once took the server down), in few enough alias jumps that the YAML
/// library's own repetition limit lets them through.
fn wide_laughs(name: &str, len: usize) -> String {
    format!(
        "---\nname: {name}\ndescription: Expands when parsed.\na0: &a0 {}\na1: &a1 [{}]\na2: [{}]\n---\n# laughs\n",
        "x".repeat(len),
        vec!["*a0"; 200].join(", "),
        vec!["*a1"; 200].join(", ")
    )
}

/// Aliases of aliases: nine lines that stand for 9^9 strings.
fn laughs(name: &str) -> String {
    let mut md = format!("---\nname: {name}\ndescription: Expands when parsed.\na0: &a0 \"lol\"\n");
    for level in 1..=9 {
        let refs = vec![format!("*a{}", level - 1); 9].join(", ");
        md += &format!("a{level}: &a{level} [{refs}]\n");
    }
    md + "---\n# laughs\n"
}

/// `[` by the thousand: quadratic in a YAML scanner that meets them.
fn brackets(name: &str, kib: usize) -> String {
    format!(
        "---\nname: {name}\ndescription: {}\n---\n# deep\n",
        "[".repeat(kib << 10)
    )
}

/// The highest memory the process `pid` has used (VmHWM), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib << 10
}

/// A tool call of a fresh MCP session; its structured result (or error).
fn tool(addr: SocketAddr, name: &str, args: Value) -> Value {
    let session = legacy_session(addr);
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": args}});
    let answer = answer_of(&raw(
        addr,
        &body.to_string(),
        &[("Mcp-Session-Id", &session)],
    ));
    let result = &answer["result"];
    assert_ne!(result["isError"], true, "{name}: {answer}");
    result["structuredContent"].clone()
}

fn healthy(addr: SocketAddr) -> bool {
    let r = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{addr}/healthz"))
        .send();
    r.is_ok_and(|r| r.status().is_success())
}

/// The skipped entries of `listed` by path, each checked to name its file and bound.
fn skipped_bounds(listed: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = listed["skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no skipped list: {listed}"))
        .iter()
        .map(|s| {
            assert_eq!(s["code"], "TOO_LARGE", "{s}");
            let file = s["details"]["file"]
                .as_str()
                .unwrap_or_else(|| panic!("{s}"));
            assert_eq!(
                file,
                format!("{}/SKILL.md", s["path"].as_str().unwrap()),
                "{s}"
            );
            assert!(s["details"]["limit"].as_u64().unwrap() > 0, "{s}");
            let bound = s["details"]["bound"].as_str().unwrap().to_owned();
            assert!(s["reason"].as_str().unwrap().contains(&bound), "{s}");
            (s["path"].as_str().unwrap().to_owned(), bound)
        })
        .collect();
    out.sort();
    out
}

struct Fixture {
    server: Server,
    env: Vec<(&'static str, String)>,
    project: String,
    kits: Vec<Value>,
    _git: GitServer,
    _certs: Certs,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    // A toolkit already in the store, as a warm start finds it.
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/kit");
    support::materialize(
        &src,
        &dir(vec![
            ("kit-good", skill("kit-good", "Served.")),
            (
                "kit-laughs",
                dir(vec![("SKILL.md", file(&wide_laughs("kit-laughs", 16_000)))]),
            ),
        ]),
    );
    let kit = serde_json::to_value(support::warm_toolkit(&store, &src, "kit")).unwrap();
    // A project whose repository tier holds both kinds next to a good skill.
    let certs = Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let repo = Repo::create(&repos, "team/project.git", false);
    repo.commit(dir(vec![
        ("README.md", file("# project\n")),
        (
            ".claude",
            dir(vec![(
                "skills",
                dir(vec![
                    ("proj-good", skill("proj-good", "Served too.")),
                    (
                        "proj-laughs",
                        dir(vec![("SKILL.md", file(&laughs("proj-laughs")))]),
                    ),
                    (
                        "proj-wide",
                        dir(vec![("SKILL.md", file(&wide_laughs("proj-wide", 100_000)))]),
                    ),
                    (
                        "proj-deep",
                        dir(vec![("SKILL.md", file(&brackets("proj-deep", 60)))]),
                    ),
                    (
                        "proj-deeper",
                        dir(vec![("SKILL.md", file(&brackets("proj-deeper", 600)))]),
                    ),
                ]),
            )]),
        ),
    ]));
    // A toolkit fetched from git: its normalizer leaves the bad skill out of the bundle.
    let kit_repo = Repo::create(&repos, "team/kit.git", false);
    let kit_commit = kit_repo.commit(dir(vec![(
        "skills",
        dir(vec![
            ("git-good", skill("git-good", "Served as well.")),
            (
                "git-laughs",
                dir(vec![("SKILL.md", file(&wide_laughs("git-laughs", 16_000)))]),
            ),
        ]),
    )]));
    let git = GitServer::start(&repos, &certs);
    let git_kit = json!({ "kind": "git", "instanceId": "gitkit", "url": git.url("team/kit.git"), "ref": kit_commit });
    let env = vec![
        ("CLOUD_HARNESS_CONTAINERS", "off".to_owned()),
        (
            "ALLOWED_GIT_HOSTS",
            format!("{},{}", git.host(), support::WARM_HOST),
        ),
        ("CLOUD_HARNESS_EXTRA_CA", certs.ca.display().to_string()),
        ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8".to_owned()),
    ];
    let server = start(tmp, &env);
    Fixture {
        server,
        env,
        project: git.url("team/project.git"),
        kits: vec![kit, git_kit],
        _git: git,
        _certs: certs,
    }
}

fn start(tmp: tempfile::TempDir, env: &[(&'static str, String)]) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    server_in(tmp, &["--auth", "none"], &env)
}

const EXPECTED: [(&str, &str); 6] = [
    ("kit-laughs", "text_bytes"),
    ("skills/git-laughs", "text_bytes"),
    ("proj-deep", "flow_openings"),
    ("proj-deeper", "front_matter_bytes"),
    ("proj-laughs", "nodes"),
    ("proj-wide", "front_matter_bytes"),
];

fn expected() -> Vec<(String, String)> {
    let mut e: Vec<(String, String)> = EXPECTED
        .iter()
        .map(|(p, b)| (p.to_string(), b.to_string()))
        .collect();
    e.sort();
    e
}

#[test]
fn expanding_and_deep_front_matters_skip_their_skill_and_the_server_goes_on() {
    let f = fixture();
    let addr = f.server.addr;
    let opened = tool(
        addr,
        "workspace_open",
        json!({ "idempotencyKey": "hostile-parsers", "repositoryUrl": f.project, "toolkits": f.kits }),
    );
    let workspace = opened["workspace"].as_str().unwrap().to_owned();
    let served: Vec<&str> = opened["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    for good in ["kit-good", "git-good", "proj-good"] {
        assert!(served.contains(&good), "{good} is served: {opened}");
    }
    for bad in [
        "kit-laughs",
        "proj-laughs",
        "proj-wide",
        "proj-deep",
        "proj-deeper",
    ] {
        assert!(!served.contains(&bad), "{bad} is not served: {opened}");
    }
    assert_eq!(skipped_bounds(&opened), expected(), "{opened}");
    // The fetched toolkit's own list names it too.
    let fetched = &opened["toolkits"][1];
    assert_eq!(fetched["skillCount"], 1, "{opened}");
    assert_eq!(
        fetched["skipped"][0]["path"], "skills/git-laughs",
        "{opened}"
    );

    let listed = tool(addr, "skills_list", json!({ "workspace": workspace }));
    assert_eq!(skipped_bounds(&listed), expected(), "{listed}");
    let read = tool(
        addr,
        "skills_read",
        json!({ "workspace": workspace, "skill": "proj-good" }),
    );
    assert!(
        read["content"].as_str().unwrap().contains("Served too."),
        "{read}"
    );

    // The library page lists the toolkit's skipped skill with its reason.
    let page = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{addr}/library"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        page.contains("Skipped") && page.contains("kit-laughs"),
        "{page}"
    );
    assert!(page.contains("bound `text_bytes`"), "{page}");

    assert!(healthy(addr));
    let peak = peak_memory(f.server.child.id());
    eprintln!("server peak memory: {} MiB", peak >> 20);
    assert!(peak < 512 << 20, "the server used {} MiB", peak >> 20);

    // Stopped and started on the same home, it restores the workspace (parsing every
    // SKILL.md again) and serves it.
    let Fixture {
        mut server, env, ..
    } = f;
    let tmp = std::mem::replace(&mut server.tmp, tempfile::tempdir().unwrap());
    drop(server);
    let again = start(tmp, &env);
    assert!(healthy(again.addr));
    let listed = tool(again.addr, "skills_list", json!({ "workspace": workspace }));
    assert_eq!(skipped_bounds(&listed), expected(), "{listed}");
    let names: Vec<&str> = listed["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"proj-good") && names.contains(&"kit-good"),
        "{listed}"
    );
    let peak = peak_memory(again.child.id());
    assert!(
        peak < 512 << 20,
        "the restarted server used {} MiB",
        peak >> 20
    );
}

//! Skill usage from the outside: a workspace opened through MCP on `serve --http` from the
//! local HTTPS git server, its skills used from every source — `skills_read`, `skills_run`
//! (one exit 0, one exit 3), a `skill://` resource read, a file read twice through the mount
//! on the host and one read by a script in the bubblewrap executor — then the counts checked
//! in `/metrics` (per toolkit) and in the state database (per file, then per day), each use
//! naming the workspace, the principal, the toolkit, its commit, bundle and tier.

use crate::support;

use cloud_harness_control::skill_usage::{report, stored, Key, Source, Tally};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::api::world_of;
use support::http::{answer_of, raw};
use support::{dir, file, Certs, GitServer, Node, Repo};

const FMT: &str = "---\nname: fmt\ndescription: Format it.\n---\nSee references/guide.md.\n";
const LINT: &str = "---\nname: lint\ndescription: Lint the code.\n---\nRun `scripts/run.sh`.\n";

#[test]
fn uses_from_every_source_are_counted_per_toolkit_file_and_day() {
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
                    ("SKILL.md", file(LINT)),
                    (
                        "scripts",
                        dir(vec![
                            (
                                "run.sh",
                                // Reads another skill's file through the executor's mount.
                                Node::Exec(
                                    b"#!/bin/sh\ncat /opt/cloud-harness/skills/fmt/SKILL.md >/dev/null && echo linted\n"
                                        .to_vec(),
                                ),
                            ),
                            ("fail.sh", Node::Exec(b"#!/bin/sh\nexit 3\n".to_vec())),
                        ]),
                    ),
                ]),
            ),
            (
                "fmt",
                dir(vec![
                    ("SKILL.md", file(FMT)),
                    ("references", dir(vec![("guide.md", file("Two spaces.\n"))])),
                ]),
            ),
        ]),
    )]));
    let git = GitServer::start(&repos, &certs);
    let ca = certs.ca.display().to_string();
    let w = world_of(support::http::server_mounting(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", &git.host()),
            ("CLOUD_HARNESS_EXTRA_CA", &ca),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
            ("CLOUD_HARNESS_USAGE_FLUSH_SECONDS", "1"),
        ],
    ));
    let url = git.url("team/kit.git");
    let me = w.op("GET", "/api/v1/whoami", None)["actor"]
        .as_str()
        .unwrap()
        .to_owned();
    // The day the uses are counted in, taken before them (a run across midnight looks from
    // the day before).
    let today = stored::day_of(cloud_harness_control::state::now_ms());
    let session = w.session();
    let kit = json!({"kind": "git", "url": url, "instanceId": "kit", "ref": commit});
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "usage", "toolkits": [kit]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let out = &opened["structuredContent"];
    let ws = out["workspace"].as_str().unwrap().to_owned();
    let bundle = out["toolkits"][0]["bundle"].as_str().unwrap().to_owned();

    // skills_read, three times; one of a file the skill does not have (a failed read).
    // (`./SKILL.md` is counted as `SKILL.md`.)
    for path in ["SKILL.md", "./SKILL.md", "SKILL.md"] {
        let read = w.tool(
            &session,
            "skills_read",
            json!({"workspace": ws, "skill": "lint", "path": path}),
        );
        assert_eq!(read["isError"], false, "{read}");
    }
    let missing = w.tool(
        &session,
        "skills_read",
        json!({"workspace": ws, "skill": "lint", "path": "nope.md"}),
    );
    assert_eq!(missing["isError"], true, "{missing}");
    // A skill:// resource.
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "resources/read",
        "params": {"uri": format!("skill://{ws}/fmt/SKILL.md")}});
    let bearer = format!("Bearer {}", w.operator);
    let resource = answer_of(&raw(
        w.server.addr,
        &body.to_string(),
        &[("Mcp-Session-Id", &session), ("Authorization", &bearer)],
    ));
    assert!(
        resource["result"]["contents"][0]["text"].is_string(),
        "{resource}"
    );
    // Two runs once approved: exit 0 (the script reads fmt's SKILL.md through the mount),
    // then exit 3.
    let run = |script: &str| {
        w.tool(
            &session,
            "skills_run",
            json!({"workspace": ws, "skill": "lint", "script": script}),
        )
    };
    let refused = run("scripts/run.sh");
    let digest = refused["structuredContent"]["details"]["digest"].clone();
    assert!(digest.is_string(), "{refused}");
    w.op(
        "POST",
        "/api/v1/approvals",
        Some(json!({"digest": digest, "skill": "lint", "reason": "read it"})),
    );
    let ran = run("scripts/run.sh");
    assert_eq!(ran["structuredContent"]["stdout"], "linted\n", "{ran}");
    let failed = run("scripts/fail.sh");
    assert_eq!(failed["structuredContent"]["exitCode"], 3, "{failed}");
    // A file read twice on the host through the mount: loaded once, the kernel keeps it.
    let guide = w
        .home()
        .join("workspaces")
        .join(&ws)
        .join("mounts/skills/fmt/references/guide.md");
    let first = std::fs::read(&guide).unwrap();
    assert_eq!(std::fs::read(&guide).unwrap(), first);

    // Per toolkit, in /metrics at once.
    let metrics = w.metrics();
    let series = |name: &str, source: Option<&str>| -> Option<f64> {
        let labels = match source {
            Some(s) => format!("{{toolkit=\"{url}\",source=\"{s}\"}}"),
            None => format!("{{toolkit=\"{url}\"}}"),
        };
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{labels} ")))
            .map(|v| v.parse().unwrap())
    };
    // A refused run is no use: its script did not start.
    let expected = [
        ("read", 4.0),
        ("resource", 1.0),
        ("run", 2.0),
        ("mount", 2.0),
    ];
    for (source, n) in expected {
        assert_eq!(
            series("cloud_harness_skill_uses_total", Some(source)),
            Some(n),
            "{source}: {metrics}"
        );
    }
    assert_eq!(
        series("cloud_harness_skill_run_failures_total", None),
        Some(1.0),
        "{metrics}"
    );

    // Per file in the database, once flushed (every second here).
    let db = w.state();
    type Counted = BTreeMap<(String, String, String), (i64, i64)>;
    let counted = || -> Counted {
        let mut out = Counted::new();
        for (_, k, uses, failures) in report::events(&db, &ws).unwrap() {
            assert_eq!(
                (&k.workspace, k.toolkit.as_str(), k.commit.as_str()),
                (&ws, url.as_str(), commit.as_str())
            );
            assert_eq!(
                (k.bundle.as_str(), k.tier.as_str()),
                (bundle.as_str(), "owner")
            );
            assert_eq!(k.principal, me);
            let e = out
                .entry((k.source.as_str().to_owned(), k.skill, k.file))
                .or_default();
            e.0 += uses;
            e.1 += failures;
        }
        out
    };
    let want: Counted = [
        (("mount", "fmt", "SKILL.md"), (1, 0)),
        (("mount", "fmt", "references/guide.md"), (1, 0)),
        (("read", "lint", "SKILL.md"), (3, 0)),
        (("read", "lint", ""), (1, 1)),
        (("resource", "fmt", "SKILL.md"), (1, 0)),
        (("run", "lint", "scripts/fail.sh"), (1, 1)),
        (("run", "lint", "scripts/run.sh"), (1, 0)),
    ]
    .into_iter()
    .map(|((s, k, f), n)| ((s.to_owned(), k.to_owned(), f.to_owned()), n))
    .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = counted();
    while got != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        got = counted();
    }
    assert_eq!(got, want);

    // Per day: the same uses summed per skill and source, with who used them.
    let days: Vec<(String, String, i64, i64, i64, i64)> = report::days(&db, &today)
        .unwrap()
        .into_iter()
        .map(|d| {
            assert_eq!(d.toolkit, url);
            (
                d.skill,
                d.source.to_owned(),
                d.uses,
                d.failures,
                d.workspaces,
                d.principals,
            )
        })
        .collect();
    assert_eq!(
        days,
        vec![
            ("fmt".into(), "mount".into(), 2, 0, 1, 1),
            ("fmt".into(), "resource".into(), 1, 0, 1, 1),
            ("lint".into(), "read".into(), 4, 1, 1, 1),
            ("lint".into(), "run".into(), 2, 1, 1, 1),
        ]
    );

    // The same through the operator API, a skill a page.
    let first = w.op("GET", "/api/v1/usage/skills?days=2&limit=1", None);
    assert_eq!(first["skills"].as_array().unwrap().len(), 1, "{first}");
    let fmt = &first["skills"][0];
    assert_eq!(
        (&fmt["toolkit"], &fmt["skill"], &fmt["uses"]),
        (
            &json!(url),
            &json!("fmt"),
            &json!({"mount": 2, "resource": 1})
        )
    );
    assert_eq!(fmt["days"], json!([[today, 3]]));
    let next = first["next"].as_str().unwrap();
    let second = w.op(
        "GET",
        &format!("/api/v1/usage/skills?days=2&limit=1&after={next}"),
        None,
    );
    let lint = &second["skills"][0];
    assert_eq!(
        (&lint["skill"], &lint["uses"], &lint["runFailures"]),
        (&json!("lint"), &json!({"read": 4, "run": 2}), &json!(1))
    );
    assert_eq!(
        (&lint["principals"], &lint["workspaces"]),
        (&json!(1), &json!(1))
    );
    assert!(lint["lastUsed"].as_i64().unwrap() > 0);
    assert_eq!(second["next"], json!(null), "{second}");
    // Another toolkit's, none; a period past the retention, refused.
    let none = w.op(
        "GET",
        "/api/v1/usage/skills?toolkit=https://elsewhere/x",
        None,
    );
    assert_eq!(none["skills"], json!([]));
    let (status, refused) = w.call(
        "GET",
        "/api/v1/usage/skills?days=9999",
        Some(&w.operator),
        None,
    );
    assert_eq!(
        (status, &refused["details"]["field"]),
        (400, &json!("days")),
        "{refused}"
    );

    // The period's totals: every day, the empty one too.
    let totals = w.op("GET", "/api/v1/usage/totals?days=2", None);
    let days = totals["days"].as_array().unwrap();
    assert_eq!(days.len(), 2, "{totals}");
    let sum = |source: &str| -> i64 {
        days.iter()
            .map(|d| d["uses"][source].as_i64().unwrap())
            .sum()
    };
    assert_eq!(
        (sum("read"), sum("run"), sum("resource"), sum("mount")),
        (4, 2, 1, 2),
        "{totals}"
    );
    assert_eq!(
        days.iter()
            .map(|d| d["runFailures"].as_i64().unwrap())
            .sum::<i64>(),
        1
    );
    assert_eq!(days[1]["day"], json!(totals["until"]));

    // Unused: the kit's two skills were used; the built-in tier's were not (one of them
    // used 10 days ago, which a period of 2 days still lists with its last use, and one of
    // 30 does not).
    let kit_unused = w.op(
        "GET",
        &format!("/api/v1/usage/unused?days=2&toolkit={url}"),
        None,
    );
    assert_eq!(kit_unused["skills"], json!([]), "{kit_unused}");
    let long_ago = cloud_harness_control::state::now_ms() - 10 * 24 * 3600 * 1000;
    // (Written as a flush writes it: the day's row and the skill's last day.)
    let old_use = Key {
        source: Source::Read,
        workspace: "ws-old".into(),
        principal: "someone".into(),
        toolkit: "cloud-harness".into(),
        commit: String::new(),
        bundle: String::new(),
        tier: "builtin".into(),
        skill: "cloud-harness-skills".into(),
        file: "SKILL.md".into(),
    };
    let tally = Tally {
        uses: 1,
        failures: 0,
        duration_ms: 0,
        last_ms: long_ago,
    };
    stored::flush(&db, vec![(old_use, tally)])
        .map_err(|(e, _)| e)
        .unwrap();
    let unused = |days: u32| -> BTreeMap<String, serde_json::Value> {
        let page = w.op(
            "GET",
            &format!("/api/v1/usage/unused?days={days}&limit=500"),
            None,
        );
        page["skills"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                assert_eq!(s["toolkit"], json!("cloud-harness"), "{page}");
                (
                    s["skill"].as_str().unwrap().to_owned(),
                    s["lastUsed"].clone(),
                )
            })
            .collect()
    };
    let two = unused(2);
    assert_eq!(two["cloud-harness-skills"], json!(long_ago), "{two:?}");
    assert_eq!(two["cloud-harness-conflicts"], json!(null), "{two:?}");
    let thirty = unused(30);
    assert!(!thirty.contains_key("cloud-harness-skills"), "{thirty:?}");
    assert!(thirty.contains_key("cloud-harness-conflicts"), "{thirty:?}");
    // A page at a time.
    let first = w.op("GET", "/api/v1/usage/unused?days=2&limit=1", None);
    let next = first["next"].as_str().unwrap();
    let second = w.op(
        "GET",
        &format!("/api/v1/usage/unused?days=2&limit=1&after={next}"),
        None,
    );
    assert!(
        first["skills"][0]["skill"].as_str() < second["skills"][0]["skill"].as_str(),
        "{first} {second}"
    );

    // The same from the command line, on the server's database.
    let (code, out) = w.cli(&["usage", "skills", "--days", "2", "--toolkit", &url]);
    assert_eq!(code, 0, "{out}");
    let cli: serde_json::Value = serde_json::from_str(&out).unwrap();
    let skills: Vec<_> = cli["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["skill"].clone())
        .collect();
    assert_eq!(skills, vec![json!("fmt"), json!("lint")], "{cli}");
    let (code, out) = w.cli(&["usage", "unused", "--days", "30"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("cloud-harness-conflicts") && !out.contains("\"cloud-harness-skills\""),
        "{out}"
    );
    let (code, out) = w.cli(&["usage", "totals", "--days", "0"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("days"), "{out}");
}

/// A flush of more keys than a transaction takes, many of them sharing a day's row (one skill,
/// many files), written whole on the server's engine (SQLite here, PostgreSQL in the
/// PostgreSQL suite): every statement size used, no row touched twice by one statement.
#[test]
fn a_flush_of_many_keys_is_written_whole_on_either_engine() {
    use cloud_harness_control::skill_usage::{Key, Source, Tally};
    let w = support::api::world_with(tempfile::tempdir().unwrap(), &[]);
    let db = w.state();
    let n = stored::CHUNK * 2 + 85;
    let at = 1_796_126_400_000;
    let batch: Vec<(Key, Tally)> = (0..n)
        .map(|i| {
            let key = Key {
                source: Source::Mount,
                workspace: "ws-many".into(),
                principal: "token:alice".into(),
                toolkit: "https://git.example/acme/kit".into(),
                commit: "c0ffee".into(),
                bundle: "sha256:00".into(),
                tier: "owner".into(),
                skill: format!("skill-{}", i % 3),
                file: format!("references/{i}.md"),
            };
            let tally = Tally {
                uses: 2,
                failures: 0,
                duration_ms: 0,
                last_ms: at + i as i64,
            };
            (key, tally)
        })
        .collect();
    stored::flush(&db, batch.clone())
        .map_err(|(e, _)| e)
        .unwrap();
    // Again: each row added to, none made twice.
    stored::flush(&db, batch).map_err(|(e, _)| e).unwrap();
    assert_eq!(report::events(&db, "ws-many").unwrap().len(), n);
    let days = report::days(&db, "2026-12-01").unwrap();
    let sums: Vec<(String, i64)> = days.into_iter().map(|d| (d.skill, d.uses)).collect();
    let third = |k: usize| (0..n).filter(|i| i % 3 == k).count() as i64 * 4;
    assert_eq!(
        sums,
        vec![
            ("skill-0".to_owned(), third(0)),
            ("skill-1".to_owned(), third(1)),
            ("skill-2".to_owned(), third(2)),
        ]
    );
}

/// Pages of the usage view hold each skill once, in the database's order, whatever that
/// order is (PostgreSQL's collation is not byte order: case and hyphens sort otherwise), with
/// each skill's own counts; a page of the most skills asked still says there is more.
#[test]
fn pages_of_skills_hold_each_skill_once_in_the_databases_order() {
    use cloud_harness_control::skill_usage::{Key, Source, Tally};
    let w = support::api::world_with(tempfile::tempdir().unwrap(), &[]);
    let db = w.state();
    let now = cloud_harness_control::state::now_ms();
    let toolkits = [
        "https://git.example/Acme/kit",
        "https://git.example/acme/kit",
        "https://git.example/acme-kit",
        "https://git.example/acmekit",
    ];
    let names = ["pdf-tools", "pdftk", "PDF", "pdf_x", "Pdf-b"];
    let mut batch: Vec<(Key, Tally)> = Vec::new();
    let mut want = std::collections::BTreeSet::new();
    for (t, toolkit) in toolkits.iter().enumerate() {
        for i in 0..26 {
            for (n, name) in names.iter().enumerate() {
                let skill = format!("{name}-{i}");
                // Every fifth skill used by two principals in two workspaces.
                let two = (t + i + n) % 5 == 0;
                for who in 0..(1 + usize::from(two)) {
                    let key = Key {
                        source: if who == 0 { Source::Read } else { Source::Run },
                        workspace: format!("ws-{who}"),
                        principal: format!("token:p{who}"),
                        toolkit: toolkit.to_string(),
                        commit: "c0ffee".into(),
                        bundle: "sha256:00".into(),
                        tier: "owner".into(),
                        skill: skill.clone(),
                        file: "SKILL.md".into(),
                    };
                    let tally = Tally {
                        uses: 1,
                        failures: 0,
                        duration_ms: 0,
                        last_ms: now,
                    };
                    batch.push((key, tally));
                }
                want.insert((toolkit.to_string(), skill, if two { 2 } else { 1 }));
            }
        }
    }
    assert_eq!(want.len(), 520);
    if w.server.database.is_some() {
        // PostgreSQL here defaults to C.UTF-8, byte order: sort the names as ICU does (upper
        // case after lower, hyphens ignored first), as a database made with a locale would.
        db.write(|c| {
            c.execute_batch(
                "ALTER TABLE usage_daily ALTER COLUMN toolkit TYPE TEXT COLLATE \"und-x-icu\",
                 ALTER COLUMN skill TYPE TEXT COLLATE \"und-x-icu\";
                 ALTER TABLE usage_skills ALTER COLUMN toolkit TYPE TEXT COLLATE \"und-x-icu\",
                 ALTER COLUMN skill TYPE TEXT COLLATE \"und-x-icu\"",
            )?;
            Ok(())
        })
        .unwrap();
    }
    stored::flush(&db, batch).map_err(|(e, _)| e).unwrap();
    let walk = |limit: usize| {
        let mut seen = std::collections::BTreeSet::new();
        let mut order = Vec::new();
        let mut pages = 0;
        let mut after = String::new();
        loop {
            let page = w.op(
                "GET",
                &format!("/api/v1/usage/skills?days=1&limit={limit}&after={after}"),
                None,
            );
            pages += 1;
            for s in page["skills"].as_array().unwrap() {
                let key = (
                    s["toolkit"].as_str().unwrap().to_owned(),
                    s["skill"].as_str().unwrap().to_owned(),
                    s["principals"].as_i64().unwrap(),
                );
                assert_eq!(s["workspaces"], s["principals"], "{s}");
                order.push((key.0.clone(), key.1.clone()));
                assert!(seen.insert(key.clone()), "{key:?} twice");
            }
            match page["next"].as_str() {
                Some(next) => after = next.to_owned(),
                None => break,
            }
        }
        (seen, pages, order)
    };
    let (seen, pages, order) = walk(50);
    assert_eq!((seen == want, pages), (true, 11));
    let mut bytewise = order.clone();
    bytewise.sort();
    // (On PostgreSQL the pages came in another order than Rust's: the test tests that.)
    assert_eq!(order == bytewise, w.server.database.is_none());
    let (seen, pages, _) = walk(500);
    assert_eq!((seen == want, pages), (true, 2));
}

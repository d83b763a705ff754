//! The work killed: a cold `workspace_open` (fetch, staging, normalization, publication to
//! the store, mounting, the executor's start, the records), an import and a set edit, and a
//! collection of the store.

use super::aftermath::{settled, swept, whole};
use super::site::{api, open, session, tool, Kill, Random, Site};
use crate::support::http::Running;
use crate::support::{dir, file, skill, Certs, GitServer, Repo};
use cloud_harness_control::params;
use serde_json::{json, Value};
use std::time::Duration;

/// A local git server with one toolkit repository, a new commit of it per round.
struct Toolkits {
    _tmp: tempfile::TempDir,
    certs: Certs,
    server: GitServer,
    repo: Repo,
}

impl Toolkits {
    fn new() -> Toolkits {
        let tmp = tempfile::tempdir().unwrap();
        let repos = tmp.path().join("repos");
        std::fs::create_dir_all(&repos).unwrap();
        let certs = Certs::new(&tmp.path().join("certs"));
        let server = GitServer::start(&repos, &certs);
        let repo = Repo::create(&repos, "kit.git", false);
        Toolkits {
            _tmp: tmp,
            certs,
            server,
            repo,
        }
    }

    /// The server's environment: the git server allowed and trusted, executors `executor`.
    fn env(&self, executor: &str) -> Vec<(&'static str, String)> {
        vec![
            ("CLOUD_HARNESS_EXECUTOR", executor.to_owned()),
            ("CLOUD_HARNESS_CONTAINERS", "off".to_owned()),
            ("ALLOWED_GIT_HOSTS", self.server.host()),
            (
                "CLOUD_HARNESS_EXTRA_CA",
                self.certs.ca.display().to_string(),
            ),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8".to_owned()),
        ]
    }

    /// A new commit: eight skills of a few files each, new bytes every round (so each
    /// acquisition is cold); the toolkit spec that pins it.
    fn commit(&self, round: usize) -> Value {
        let names: Vec<String> = (0..8).map(|i| format!("skill-{i}")).collect();
        let skills = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let mut folder = skill(name, &format!("Round {round}, skill {i}."));
                if let crate::support::Node::Dir(entries) = &mut folder {
                    let notes = format!("notes {round} {i}\n").repeat(200);
                    entries.push(("notes.md".into(), file(&notes)));
                }
                (name.as_str(), folder)
            })
            .collect();
        let commit = self.repo.commit(dir(vec![("skills", dir(skills))]));
        json!({"kind": "git", "instanceId": "team", "url": self.server.url("kit.git"), "ref": commit})
    }
}

/// Named points first (each must be reached), then `timed` random moments within `span`.
fn plan(named: &[&str], timed: usize, span: Duration, random: &mut Random) -> Vec<Kill> {
    let mut kills: Vec<Kill> = named.iter().map(|p| Kill::At(p.to_string())).collect();
    for _ in 0..timed {
        let ms = random.below(span.as_millis() as u64);
        kills.push(Kill::After(Duration::from_millis(ms)));
    }
    kills
}

fn workspace_of(result: &Value) -> String {
    assert_ne!(result["isError"], json!(true), "{result}");
    result["structuredContent"]["workspace"]
        .as_str()
        .unwrap_or_else(|| panic!("no workspace in {result}"))
        .to_owned()
}

fn key_rows(site: &Site, key: &str) -> i64 {
    let db = cloud_harness_control::state::Db::open_sqlite(&site.home()).unwrap();
    db.with(|c| {
        c.query_row(
            "SELECT COUNT(*) FROM workspaces WHERE idempotency_key = $1",
            params![key],
            |r| r.get(0),
        )
    })
    .unwrap()
}

fn close(running: &Running, workspace: &str) {
    let session = session(running).unwrap();
    let closed = tool(
        running,
        &session,
        "workspace_close",
        json!({"workspace": workspace}),
    )
    .unwrap();
    assert_ne!(closed["isError"], json!(true), "{closed}");
}

/// A cold open killed at every step of its work, and at random moments of it; after each
/// restart nothing half-made is left, the workspace opened before the kills is served again,
/// and the interrupted open retried with its key makes one workspace.
#[test]
fn a_cold_open_killed_anywhere_leaves_nothing_half_made() {
    let executor = if crate::support::executor_backend("bwrap") {
        "bwrap"
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no bubblewrap (run .ci/setup)"
        );
        "none"
    };
    let kits = Toolkits::new();
    let mut site = Site::new(&kits.env(executor), Random::seeded("a cold open"));
    // One workspace open throughout: every restart restores it.
    let running = site.serve();
    let kept = workspace_of(
        &open(
            &running,
            &json!({"idempotencyKey": "kept", "toolkits": [kits.commit(0)]}),
        )
        .unwrap(),
    );
    // How long a cold open takes here: the span the random kills fall in.
    let started = std::time::Instant::now();
    let timing = open(
        &running,
        &json!({"idempotencyKey": "timing", "toolkits": [kits.commit(1)]}),
    )
    .unwrap();
    // (A first open of a process is its slowest: most random kills land within the next.)
    let span = started.elapsed();
    close(&running, &workspace_of(&timing));
    site.stop(running);

    let named = [
        "acquire.fetched",
        "store.staged@1",
        "store.staged@9",
        "store.staged@20",
        "store.published@1",
        "store.published@12",
        "acquire.normalized",
        "acquire.recorded",
        "open.claimed",
        "open.folder_made",
        "open.mounted",
        "open.executor_made",
        "open.saved",
        "open.recorded",
    ];
    let timed = 16;
    let kills = plan(&named, timed, span, &mut site.random);
    for (round, kill) in kills.iter().enumerate() {
        let what = format!("round {round}, killed {kill:?}");
        let key = format!("round-{round}");
        let request = json!({"idempotencyKey": key, "toolkits": [kits.commit(round + 2)]});
        site.killed_during(kill, |r| drop(open(r, &request)));
        settled(&site, &what);
        let running = site.serve();
        site.restarts += 1;
        whole(&site, &running, &what);
        // The workspace from before is served again.
        let session = session(&running).unwrap();
        let listed = tool(
            &running,
            &session,
            "skills_list",
            json!({"workspace": kept}),
        )
        .unwrap();
        assert_ne!(listed["isError"], json!(true), "{what}: {listed}");
        // The interrupted open, again: one workspace, the same for a second retry.
        let first = workspace_of(&open(&running, &request).unwrap());
        let second = workspace_of(&open(&running, &request).unwrap());
        assert_eq!(first, second, "{what}");
        assert_eq!(key_rows(&site, &key), 1, "{what}");
        close(&running, &first);
        site.stop(running);
    }
    swept(&site);
    println!(
        "crash suite, a cold open: {} kill points hit mid-work of {} planned, {} restarts",
        site.kills,
        kills.len(),
        site.restarts
    );
    assert!(site.kills >= named.len() + timed / 4, "too few random kills hit mid-work");
}

/// An import and a set edit killed midway: the import is failed by the restart (never left
/// running) and runs to done when submitted again; a set's revision is whole or absent, with
/// its audit entry, and the same edit made again makes it once.
#[test]
fn an_import_and_a_set_edit_killed_midway_are_failed_or_whole() {
    let kits = Toolkits::new();
    let mut site = Site::new(&kits.env("none"), Random::seeded("imports and sets"));
    let running = site.serve();
    let started = std::time::Instant::now();
    let (status, job) = api(
        &running,
        "POST",
        "/api/v1/imports",
        Some(json!({"toolkit": kits.commit(0)})),
    )
    .unwrap();
    assert_eq!(status, 202, "{job}");
    wait_import(&running, job["id"].as_str().unwrap(), "done");
    let span = started.elapsed() + Duration::from_millis(200);
    site.stop(running);

    let named = [
        "import.running",
        "import.acquired",
        "store.staged@3",
        "store.published@5",
    ];
    let kills = plan(&named, 6, span, &mut site.random);
    for (round, kill) in kills.iter().enumerate() {
        let what = format!("import round {round}, killed {kill:?}");
        let spec = kits.commit(round + 1);
        let body = json!({"toolkit": spec});
        site.killed_during(kill, |r| {
            if let Ok((_, job)) = api(r, "POST", "/api/v1/imports", Some(body.clone())) {
                if let Some(id) = job["id"].as_str() {
                    // Until it ends or the server dies.
                    let _ = try_wait_import(r, id);
                }
            }
        });
        settled(&site, &what);
        let running = site.serve();
        site.restarts += 1;
        whole(&site, &running, &what);
        let (status, job) = api(&running, "POST", "/api/v1/imports", Some(body)).unwrap();
        assert_eq!(status, 202, "{what}: {job}");
        wait_import(&running, job["id"].as_str().unwrap(), "done");
        site.stop(running);
    }

    // A set made, then edited, each killed inside its transaction.
    let members = json!([kits.commit(100)]);
    for (round, (method, path, body)) in [
        (
            "POST",
            "/api/v1/sets",
            json!({"id": "team", "members": members}),
        ),
        (
            "PUT",
            "/api/v1/sets/team",
            json!({"revision": 1, "members": members, "description": "edited"}),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("set round {round}: {method} {path}");
        let kill = Kill::At("sets.revision_written".into());
        site.killed_during(&kill, |r| drop(api(r, method, path, Some(body.clone()))));
        settled(&site, &what);
        let running = site.serve();
        site.restarts += 1;
        whole(&site, &running, &what);
        let revisions = |r: &Running| -> i64 {
            match api(r, "GET", "/api/v1/sets/team/revisions", None).unwrap() {
                (200, v) => v["revisions"].as_array().map_or(0, |a| a.len() as i64),
                _ => 0,
            }
        };
        assert_eq!(
            revisions(&running),
            round as i64,
            "{what}: a revision of the killed edit stayed"
        );
        let (status, answer) = api(&running, method, path, Some(body.clone())).unwrap();
        assert!((200..300).contains(&status), "{what}: {status} {answer}");
        assert_eq!(revisions(&running), round as i64 + 1, "{what}");
        let (_, audit) = api(&running, "GET", "/api/v1/audit?limit=1000", None).unwrap();
        let entries = audit["entries"].as_array().unwrap();
        let of_set = entries
            .iter()
            .filter(|e| e["action"].as_str().is_some_and(|a| a.starts_with("set.")))
            .count();
        assert_eq!(of_set, round + 1, "{what}: {audit}");
        site.stop(running);
    }
    swept(&site);
    println!(
        "crash suite, imports and sets: {} kill points hit mid-work of {} planned, {} restarts",
        site.kills,
        kills.len() + 2,
        site.restarts
    );
    assert!(
        site.kills >= named.len() + 2 + 2,
        "too few kills hit mid-work"
    );
}

fn try_wait_import(running: &Running, id: &str) -> Result<Value, String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, job) = api(running, "GET", &format!("/api/v1/imports/{id}"), None)?;
        if matches!(job["state"].as_str(), Some("done" | "failed" | "cancelled")) {
            return Ok(job);
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("never ended: {job}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_import(running: &Running, id: &str, state: &str) {
    let job = try_wait_import(running, id).unwrap();
    assert_eq!(job["state"], state, "{job}");
}

/// A collection killed while it removes objects: every object left is whole, what the open
/// workspace serves is all there, and the next collection finishes the work.
#[test]
fn a_collection_killed_midway_leaves_every_object_whole() {
    let kits = Toolkits::new();
    let mut site = Site::new(&kits.env("none"), Random::seeded("collections"));
    let running = site.serve();
    let kept = workspace_of(
        &open(
            &running,
            &json!({"idempotencyKey": "kept", "toolkits": [kits.commit(0)]}),
        )
        .unwrap(),
    );
    site.stop(running);
    let points = ["gc.removed@1", "gc.removed@4", "gc.removed@11", "", ""];
    let mut hit = 0;
    for (round, point) in points.iter().enumerate() {
        // Garbage to collect: five workspaces opened and closed, their bundles unrooted.
        let running = site.serve();
        for i in 0..5 {
            let ws = workspace_of(
                &open(&running, &json!({"idempotencyKey": format!("g{round}-{i}"), "toolkits": [kits.commit(10 * round + i + 1)]}))
                    .unwrap(),
            );
            close(&running, &ws);
        }
        site.stop(running);
        let mut gc = site.cli_command(&["cas", "gc", "--grace", "0"]);
        if point.is_empty() {
            // A random moment of a collection: killed by this test.
            let mut child = gc
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(site.random.below(150)));
            let _ = child.kill();
            hit += usize::from(child.wait().unwrap().code().is_none());
        } else {
            gc.env("CLOUD_HARNESS_KILL_AT", point);
            let status = gc.status().unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "{point} was not reached");
            hit += 1;
        }
        let (ok, out) = site.cli(&["cas", "verify"]);
        assert!(ok, "after a collection killed at {point:?}: {out}");
        let running = site.serve();
        site.restarts += 1;
        whole(&site, &running, &format!("gc round {round}"));
        let session = session(&running).unwrap();
        let read = tool(
            &running,
            &session,
            "skills_read",
            json!({"workspace": kept, "skill": "skill-3"}),
        )
        .unwrap();
        assert_ne!(read["isError"], json!(true), "{read}");
        site.stop(running);
    }
    site.kills += hit;
    swept(&site);
    println!(
        "crash suite, collections: {} kill points hit mid-work of {}, {} restarts",
        site.kills,
        points.len(),
        site.restarts
    );
    assert!(site.kills >= 3);
}

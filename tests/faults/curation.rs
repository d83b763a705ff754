//! An import and a set edit killed midway.

use super::aftermath::{settled, swept, whole};
use super::site::{api, Kill, Random, Site};
use super::toolkits::{plan, Toolkits};
use crate::support::http::Running;
use serde_json::{json, Value};
use std::time::Duration;

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
        "store.staged@1",
        "store.staged@3",
        "store.published@2",
        "store.published@5",
    ];
    let timed = 10;
    let kills = plan(&named, timed, span, &mut site.random);
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
    assert!(site.kills >= named.len() + 2, "too few kills hit mid-work");
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

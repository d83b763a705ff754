//! Opens killed: a cold `workspace_open` at every step of its work (fetch, staging,
//! normalization, publication to the store, mounting, the executor's start, the records).

use super::aftermath::{settled, swept, whole};
use super::site::{open, session, tool, Random, Site};
use super::toolkits::{close, key_rows, plan, workspace_of, Toolkits};
use serde_json::json;
use std::time::Duration;

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
        "store.staged@5",
        "store.staged@9",
        "store.staged@14",
        "store.staged@20",
        "store.staged@26",
        "store.published@1",
        "store.published@6",
        "store.published@12",
        "store.published@18",
        "store.published@24",
        "acquire.normalized",
        "acquire.recorded",
        "open.claimed",
        "open.folder_made",
        // Each workspace has two mounts; the one opened before is restored first at start.
        "mount.prewarming@1",
        "mount.prewarming@3",
        "open.mounted",
        "open.executor_made",
        "open.saved",
        "open.recorded",
    ];
    let timed = 24;
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
    assert!(
        site.kills >= named.len(),
        "a named kill point was not counted"
    );
}

/// The same on a runner of a fleet: an open killed while it publishes its bundle to object
/// storage (queued, objects half sent, the record not yet written). After the restart the
/// retried open completes the publication, and a second runner with an empty store starts
/// the toolkit from the bucket alone.
#[test]
fn a_publication_to_object_storage_killed_midway_is_completed() {
    if !crate::support::s3::available() {
        return;
    }
    let kits = Toolkits::new();
    let bucket = tempfile::tempdir().unwrap();
    let s3 = crate::support::s3::S3Server::start(bucket.path());
    let mut env = kits.env("none");
    env.extend(s3.settings());
    env.push(("TOOLKIT_STORE_URL", s3.url("crash")));
    let mut site = Site::new(&env, Random::seeded("a fleet publication"));
    let running = site.serve();
    let started = std::time::Instant::now();
    let timing = open(
        &running,
        &json!({"idempotencyKey": "timing", "toolkits": [kits.commit(0)]}),
    )
    .unwrap();
    let span = started.elapsed();
    close(&running, &workspace_of(&timing));
    site.stop(running);

    let named = [
        "fleet.queued",
        "fleet.object_put@1",
        "fleet.object_put@3",
        "fleet.object_put@7",
        "fleet.object_put@10",
        "fleet.object_put@14",
        "fleet.object_put@20",
        "fleet.object_put@26",
        "fleet.before_record",
        "acquire.recorded",
    ];
    let timed = 6;
    let kills = plan(&named, timed, span, &mut site.random);
    for (round, kill) in kills.iter().enumerate() {
        let what = format!("fleet round {round}, killed {kill:?}");
        let key = format!("round-{round}");
        let toolkit = kits.commit(round + 1);
        let request = json!({"idempotencyKey": key, "toolkits": [toolkit]});
        site.killed_during(kill, |r| drop(open(r, &request)));
        settled(&site, &what);
        let running = site.serve();
        site.restarts += 1;
        whole(&site, &running, &what);
        let ws = workspace_of(&open(&running, &request).unwrap());
        assert_eq!(key_rows(&site, &key), 1, "{what}");
        close(&running, &ws);
        site.stop(running);
        // Another runner, its store empty, the same bucket: the bundle comes whole from it.
        let mut other = Site::new(&env, Random::unprinted());
        let running = other.serve();
        let result = open(
            &running,
            &json!({"idempotencyKey": "b", "toolkits": [toolkit]}),
        )
        .unwrap();
        workspace_of(&result);
        let listed = &result["structuredContent"]["toolkits"][0];
        assert_eq!(listed["mode"], "remote", "{what}: {result}");
        let skills = result["structuredContent"]["skills"].as_array().unwrap();
        let of_toolkit = skills.iter().filter(|s| s["toolkit"] == "team").count();
        assert_eq!(of_toolkit, 8, "{what}: {result}");
        other.stop(running);
    }
    swept(&site);
    println!(
        "crash suite, a fleet publication: {} kill points hit mid-work of {} planned, {} restarts",
        site.kills,
        kills.len(),
        site.restarts
    );
    assert!(
        site.kills >= named.len(),
        "a named kill point was not counted"
    );
}

/// With Docker executors: an open killed as its container is made, or after, leaves no
/// container that is not an open workspace's, and a restart keeps serving the one that is.
#[test]
fn an_open_killed_with_a_docker_executor_leaves_no_stray_container() {
    if !crate::support::executor_backend("docker") {
        assert!(
            std::env::var_os("CI").is_none(),
            "no Docker engine (run .ci/setup)"
        );
        return;
    }
    let kits = Toolkits::new();
    let mut env = kits.env("docker");
    env.push(("CLOUD_HARNESS_EXECUTOR_SPARES", "0".into()));
    let mut site = Site::new(&env, Random::seeded("a Docker executor"));
    let running = site.serve();
    let kept = workspace_of(
        &open(
            &running,
            &json!({"idempotencyKey": "kept", "toolkits": [kits.commit(0)]}),
        )
        .unwrap(),
    );
    site.stop(running);
    let named = ["open.mounted", "open.executor_made", "open.saved"];
    let kills = plan(&named, 0, Duration::ZERO, &mut site.random);
    for (round, kill) in kills.iter().enumerate() {
        let what = format!("docker round {round}, killed {kill:?}");
        let key = format!("round-{round}");
        let request = json!({"idempotencyKey": key, "toolkits": [kits.commit(round + 1)]});
        site.killed_during(kill, |r| drop(open(r, &request)));
        // The container of the workspace opened before lives on, by design.
        settled(&site, &what);
        let running = site.serve();
        site.restarts += 1;
        whole(&site, &running, &what);
        let session = session(&running).unwrap();
        let listed = tool(
            &running,
            &session,
            "skills_list",
            json!({"workspace": kept}),
        )
        .unwrap();
        assert_ne!(listed["isError"], json!(true), "{what}: {listed}");
        let ws = workspace_of(&open(&running, &request).unwrap());
        close(&running, &ws);
        site.stop(running);
    }
    let running = site.serve();
    close(&running, &kept);
    site.stop(running);
    let left = super::aftermath::containers_under(&site.home());
    assert!(left.is_empty(), "containers left: {left:?}");
    swept(&site);
    println!(
        "crash suite, a Docker executor: {} kill points hit mid-work, {} restarts",
        site.kills, site.restarts
    );
}

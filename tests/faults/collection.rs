//! A collection of the store killed while it removes objects.

use super::aftermath::{swept, whole};
use super::site::{open, session, tool, Random, Site};
use super::toolkits::{close, workspace_of, Toolkits};
use serde_json::json;
use std::time::Duration;

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
    let points = [
        "gc.removed@1",
        "gc.removed@2",
        "gc.removed@3",
        "gc.removed@4",
        "gc.removed@5",
        "gc.removed@7",
        "gc.removed@11",
        "",
        "",
    ];
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
    assert!(site.kills >= 7);
}

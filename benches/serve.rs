//! `workspace_open` on a warm store (three toolkits, 100 skills; no network), median and max,
//! and `skills_list` over 10,000 skills.
//!
//! `cargo bench --bench serve` (mounts for real when run as root with /dev/fuse; otherwise
//! without mounts, and says so).

#[path = "../tests/support/mod.rs"]
mod support;

use cloud_harness_control::toolkit::ToolkitSpec;
use cloud_harness_executor::{Kind, Settings};
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::{OpenRequest, Workspaces};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPENS: usize = 40;

/// A toolkit of `n` skills already in the store and the bundle index, as a warm start finds it.
fn warm_toolkit(store: &Store, root: &Path, name: &str, n: usize) -> ToolkitSpec {
    let dir = root.join(name);
    for i in 0..n {
        let skill = dir.join(format!("{name}-skill-{i:05}"));
        std::fs::create_dir_all(skill.join("references")).unwrap();
        std::fs::write(
            skill.join("SKILL.md"),
            format!(
                "---\nname: {name}-skill-{i:05}\ndescription: Skill {i} of {name}.\n---\nBody.\n"
            ),
        )
        .unwrap();
        std::fs::write(skill.join("references/notes.md"), format!("notes {i}")).unwrap();
    }
    support::warm_toolkit(store, &dir, name)
}

fn percentile(mut xs: Vec<Duration>, p: f64) -> Duration {
    xs.sort();
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let kits: Vec<ToolkitSpec> = [("alpha", 33), ("beta", 33), ("gamma", 34)]
        .iter()
        .map(|(n, k)| warm_toolkit(&store, &tmp.path().join("src"), n, *k))
        .collect();
    let big = warm_toolkit(&store, &tmp.path().join("src"), "big", 10_000);

    let mounting = nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists();
    // The workspace layer alone: the host "executor" makes nothing (the executor bench
    // measures what a sandbox adds).
    let workspaces = Arc::new(
        Workspaces::with_executors(
            tmp.path().join("home"),
            support::warm_provisioner(&store),
            mounting,
            Settings::with_kind(Kind::Host),
        )
        .unwrap(),
    );

    let mut opens = Vec::new();
    for i in 0..OPENS {
        let request = OpenRequest {
            repository_url: None,
            idempotency_key: format!("bench-{i}"),
            toolkits: kits.clone(),
            allow_toolkit_workspace_changes: false,
            idle_pause: true,
        };
        let t = Instant::now();
        let result = workspaces.open(request).unwrap();
        opens.push(t.elapsed());
        assert_eq!(result["skills"].as_array().unwrap().len(), 103); // 100 + the 3 built-in
        if mounting {
            assert!(result["skillsMount"].is_string(), "{result}");
        }
        workspaces
            .close(result["workspace"].as_str().unwrap())
            .unwrap();
    }

    let result = workspaces
        .open(OpenRequest {
            repository_url: None,
            idempotency_key: "bench-big".into(),
            toolkits: vec![big],
            allow_toolkit_workspace_changes: false,
            idle_pause: true,
        })
        .unwrap();
    let ws = workspaces
        .get(result["workspace"].as_str().unwrap())
        .unwrap();
    let mut lists = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let listing = ws.list(None, false);
        // What the MCP layer does with it: one JSON text.
        let text = serde_json::to_string(&listing).unwrap();
        lists.push(t.elapsed());
        assert!(text.len() > 1_000_000 && listing["count"] == 10_003);
    }
    workspaces.close(&ws.id).unwrap();

    println!(
        "workspace_open on a warm store: 3 toolkits, 100 skills, no network, {} ({OPENS} opens)",
        if mounting {
            "two FUSE mounts each"
        } else {
            "no mounts (not root or no /dev/fuse)"
        }
    );
    println!("| what | median | max | goal |");
    println!("|---|---|---|---|");
    println!(
        "| workspace_open, warm | {:.1} ms | {:.1} ms | median < 100 ms |",
        percentile(opens.clone(), 0.5).as_secs_f64() * 1e3,
        percentile(opens, 1.0).as_secs_f64() * 1e3
    );
    println!(
        "| skills_list over 10,000 skills (listed and serialized) | {:.1} ms | {:.1} ms | < 20 ms |",
        percentile(lists.clone(), 0.5).as_secs_f64() * 1e3,
        percentile(lists, 1.0).as_secs_f64() * 1e3
    );
}

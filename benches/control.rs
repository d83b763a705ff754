//! The control plane's two figures: the library query over 10,000 skills (100 bundles of 100)
//! against `grep -ril` over the same SKILL.md files, and `workspace_open` of a warm 3-toolkit
//! set against the same three toolkits listed directly. Runs interleaved, medians reported.
//!
//! `cargo bench --bench control` (`CONTROL_ROUNDS` to change the default of 15).

#[path = "../tests/support/mod.rs"]
mod support;

use cloud_harness_workspace::library::{Library, Search};
use cloud_harness_workspace::{OpenRequest, Workspaces};
use std::process::Command;
use std::time::{Duration, Instant};

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let rounds: usize = std::env::var("CONTROL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src");
    let mut specs = Vec::new();
    for b in 0..100 {
        let dir = src.join(format!("kit-{b:03}"));
        for s in 0..100 {
            let skill = dir.join(format!("skill-{b:03}-{s:03}"));
            std::fs::create_dir_all(&skill).unwrap();
            std::fs::write(
                skill.join("SKILL.md"),
                format!("---\nname: skill-{b:03}-{s:03}\ndescription: Skill {s} of kit {b}, for topic-{}.\n---\nBody.\n", (b * 100 + s) % 997),
            )
            .unwrap();
        }
        specs.push(support::warm_toolkit(&store, &dir, &format!("kit-{b:03}")));
    }

    let library = Library::default();
    let cold = Instant::now();
    let (_, total) = library
        .search(
            &store,
            &Search {
                limit: 50,
                ..Search::default()
            },
        )
        .unwrap();
    let cold = cold.elapsed();
    assert_eq!(total, 10_003, "10,000 skills and the built-in three");
    let queries = [
        "",
        "topic-512",
        "kit 42",
        "skill-099-099",
        "nothing-matches-this",
    ];
    let mut lib: Vec<Vec<Duration>> = vec![Vec::new(); queries.len()];
    let mut grep: Vec<Duration> = Vec::new();
    for _ in 0..rounds {
        for (i, q) in queries.iter().enumerate() {
            let t = Instant::now();
            let search = Search {
                text: Some(q.to_string()),
                limit: 50,
                ..Search::default()
            };
            std::hint::black_box(library.search(&store, &search).unwrap());
            lib[i].push(t.elapsed());
        }
        let t = Instant::now();
        let out = Command::new("grep")
            .args(["-ril", "--include=SKILL.md", "topic-512"])
            .arg(&src)
            .output()
            .unwrap();
        grep.push(t.elapsed());
        assert!(!out.stdout.is_empty());
    }
    let grep = median(grep);
    println!("library over 10,003 skills ({rounds} rounds, medians; a page of 50):");
    println!(
        "  first query (every bundle read from the store): {:.1} ms",
        ms(cold)
    );
    for (q, xs) in queries.iter().zip(lib) {
        let m = median(xs);
        println!(
            "  q={q:<22} {:>6.2} ms  ({:.2}x `grep -ril` of the same SKILL.md files, {:.2} ms)",
            ms(m),
            m.as_secs_f64() / grep.as_secs_f64(),
            ms(grep)
        );
    }

    // A warm 3-toolkit set against the same toolkits listed directly.
    let home = tmp.path().join("home");
    let workspaces = Workspaces::with_executors(
        home,
        support::warm_provisioner(&store),
        false,
        cloud_harness_executor::Settings::with_kind(cloud_harness_executor::Kind::Host),
    )
    .unwrap();
    let trio: Vec<serde_json::Value> = specs[..3]
        .iter()
        .map(|s| serde_json::to_value(s).unwrap())
        .collect();
    cloud_harness_curation::sets::create(
        workspaces.db(),
        workspaces.hosts(),
        "trio",
        "",
        &trio,
        Default::default(),
        "bench",
    )
    .unwrap();
    let set = cloud_harness_control::toolkit::spec_from_value(
        serde_json::json!({"kind": "set", "id": "trio"}),
    )
    .unwrap();
    let (mut by_set, mut direct) = (Vec::new(), Vec::new());
    for r in 0..rounds + 1 {
        for (kind, toolkits) in [("set", vec![set.clone()]), ("direct", specs[..3].to_vec())] {
            let t = Instant::now();
            let opened = workspaces
                .open(OpenRequest {
                    repository_url: None,
                    idempotency_key: format!("{kind}-{r}"),
                    toolkits,
                    allow_toolkit_workspace_changes: false,
                    idle_pause: true,
                })
                .unwrap();
            let took = t.elapsed();
            workspaces
                .close(opened["workspace"].as_str().unwrap())
                .unwrap();
            // The first round warms the process (its caches, the database's pages).
            if r > 0 {
                if kind == "set" {
                    by_set.push(took)
                } else {
                    direct.push(took)
                }
            }
        }
    }
    let (s, d) = (median(by_set), median(direct));
    println!("workspace_open of a warm 3-toolkit set ({rounds} rounds, interleaved, medians; no mount, host executor):");
    println!(
        "  as a set {:.1} ms, listed directly {:.1} ms: {:.2}x",
        ms(s),
        ms(d),
        s.as_secs_f64() / d.as_secs_f64()
    );
}

//! Building the resolved index for 10,000 skills across the four tiers, and a lookup in it.
//!
//! `cargo bench -p cloud-harness-skills --bench resolver`

use cloud_harness_skills::discovery::{Discovery, Found, SkillInfo};
use cloud_harness_skills::resolver::{resolve, Override, Provenance, Source, Tier};
use cloud_harness_skills::skill::{SkillMeta, SkillName};
use cloud_harness_store::cas::Digest;
use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const RUNS: usize = 15;

fn source(id: &str, tier: Tier, names: impl Iterator<Item = String>) -> Source {
    let skills = names
        .map(|name| {
            let mut links = BTreeSet::new();
            links.insert("skill-1".to_owned());
            Found {
                path: format!("skills/{name}"),
                info: Arc::new(SkillInfo {
                    digest: Digest::of(format!("{id}/{name}").as_bytes()),
                    meta: SkillMeta {
                        description: format!("The {name} skill of {id}."),
                        ..SkillMeta::default()
                    },
                    warnings: Vec::new(),
                    problems: Vec::new(),
                    links,
                }),
                name: SkillName::new(&name).unwrap(),
            }
        })
        .collect();
    Source {
        id: id.to_owned(),
        tier,
        provenance: Provenance {
            toolkit: Some(id.to_owned()),
            ..Provenance::default()
        },
        tree: Digest::of(id.as_bytes()),
        discovery: Discovery {
            skills,
            ..Discovery::default()
        },
    }
}

/// 10,000 skills: 5 owner toolkits of 1,000, 3 workspace toolkits of 1,000, 2 repository
/// folders of 1,000, overlapping so that a third of the names are shadowed and a few dozen
/// collide within a tier.
fn stack() -> Vec<Source> {
    let names = |from: usize, n: usize| (from..from + n).map(|i| format!("skill-{i}"));
    let mut s = Vec::new();
    for k in 0..5 {
        s.push(source(
            &format!("owner-{k}"),
            Tier::Owner,
            names(k * 990, 1000),
        ));
    }
    for k in 0..3 {
        s.push(source(
            &format!("workspace-{k}"),
            Tier::Workspace,
            names(3000 + k * 1000, 1000),
        ));
    }
    for k in 0..2 {
        s.push(source(
            &format!("repo-{k}"),
            Tier::Repository,
            names(5000 + k * 1000, 1000),
        ));
    }
    s
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let sources = stack();
    let total: usize = sources.iter().map(|s| s.discovery.skills.len()).sum();
    let overrides = vec![Override {
        skill: "skill-995".into(),
        source: "owner-1".into(),
    }];
    let mut builds = Vec::new();
    let mut index = resolve(&sources, &overrides);
    for _ in 0..RUNS {
        let t = Instant::now();
        index = black_box(resolve(black_box(&sources), &overrides));
        builds.push(t.elapsed());
    }
    let names: Vec<String> = (0..10_000)
        .map(|i| format!("skill-{}", (i * 7919) % 12_000))
        .collect();
    let mut lookups = Vec::new();
    let rounds = 100;
    for _ in 0..RUNS {
        let t = Instant::now();
        for _ in 0..rounds {
            for n in &names {
                black_box(index.lookup(black_box(n)));
            }
        }
        lookups.push(t.elapsed() / (rounds * names.len()) as u32);
    }
    let winners = index.winners().count();
    let conflicts = index.conflicts().count();
    let shadowed: usize = index.resolutions().iter().map(|r| r.shadowed.len()).sum();
    println!(
        "resolved index: {total} skills in {} sources -> {winners} served, {shadowed} shadowed, {conflicts} conflicts, {} warnings (median of {RUNS} runs)",
        sources.len(),
        index.warnings.len()
    );
    println!("| what | median | goal |");
    println!("|---|---|---|");
    println!(
        "| build the index | {:.2} ms | < 50 ms |",
        median(builds).as_secs_f64() * 1e3
    );
    println!(
        "| one lookup (hits and misses) | {:.0} ns | < 1 us |",
        median(lookups).as_nanos()
    );
}

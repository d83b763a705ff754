//! The resolver against a plain model of the precedence rules, on random tier contents and
//! overrides.

use cloud_harness_skills::discovery::{Discovery, Found, SkillInfo};
use cloud_harness_skills::resolver::{resolve, Override, Provenance, Source, Tier};
use cloud_harness_skills::skill::{SkillMeta, SkillName};
use cloud_harness_store::cas::Digest;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::sync::Arc;

const NAMES: [&str; 4] = ["alpha", "beta", "gamma", "delta"];

#[derive(Debug, Clone)]
struct SkillSpec {
    name: usize,
    nested: bool,
    variant: u8,
}

#[derive(Debug, Clone)]
struct SourceSpec {
    tier: usize,
    skills: Vec<SkillSpec>,
}

fn skill_spec() -> impl Strategy<Value = SkillSpec> {
    (0..NAMES.len(), any::<bool>(), 0u8..3).prop_map(|(name, nested, variant)| SkillSpec {
        name,
        nested,
        variant,
    })
}

fn source_spec() -> impl Strategy<Value = SourceSpec> {
    (0usize..4, prop::collection::vec(skill_spec(), 0..5)).prop_map(|(tier, skills)| {
        // A source cannot hold the same path twice.
        let mut seen = BTreeSet::new();
        let skills = skills
            .into_iter()
            .filter(|s| seen.insert((s.name, s.nested)))
            .collect();
        SourceSpec { tier, skills }
    })
}

fn path(s: &SkillSpec) -> String {
    if s.nested {
        format!("bucket/{}", NAMES[s.name])
    } else {
        NAMES[s.name].to_owned()
    }
}

fn digest(s: &SkillSpec) -> Digest {
    Digest::of(format!("{}-{}", NAMES[s.name], s.variant).as_bytes())
}

fn build(specs: &[SourceSpec]) -> Vec<Source> {
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| Source {
            id: format!("s{i}"),
            tier: Tier::ALL[spec.tier],
            provenance: Provenance {
                toolkit: Some(format!("kit{i}")),
                ..Provenance::default()
            },
            tree: Digest::of(format!("tree{i}").as_bytes()),
            discovery: Discovery {
                // Deliberately not sorted: the resolver must not rely on discovery order.
                skills: spec
                    .skills
                    .iter()
                    .rev()
                    .map(|s| Found {
                        name: SkillName::new(NAMES[s.name]).unwrap(),
                        path: path(s),
                        info: Arc::new(SkillInfo {
                            digest: digest(s),
                            meta: SkillMeta {
                                description: "d".into(),
                                ..SkillMeta::default()
                            },
                            warnings: Vec::new(),
                            problems: Vec::new(),
                            links: BTreeSet::new(),
                        }),
                    })
                    .collect(),
                ..Discovery::default()
            },
        })
        .collect()
}

/// (source index, path, digest): a candidate as the model sees it.
type Cand = (usize, String, Digest);

#[derive(Debug, PartialEq)]
struct Expected {
    winner: Option<Cand>,
    conflict: Vec<Cand>,
    shadowed: Vec<Cand>,
    settled: bool,
}

/// The rules, written as plainly as they are stated.
fn model(
    specs: &[SourceSpec],
    overrides: &[(usize, usize, bool)],
    name: usize,
) -> Option<Expected> {
    let mut cands: Vec<(usize, Cand)> = Vec::new();
    for tier in 0..4 {
        for (i, spec) in specs.iter().enumerate() {
            if spec.tier != tier {
                continue;
            }
            let mut mine: Vec<Cand> = spec
                .skills
                .iter()
                .filter(|s| s.name == name)
                .map(|s| (i, path(s), digest(s)))
                .collect();
            mine.sort();
            cands.extend(mine.into_iter().map(|c| (tier, c)));
        }
    }
    if cands.is_empty() {
        return None;
    }
    let top_tier = cands[0].0;
    let top: Vec<Cand> = cands
        .iter()
        .filter(|c| c.0 == top_tier)
        .map(|c| c.1.clone())
        .collect();
    let rest: Vec<Cand> = cands
        .iter()
        .filter(|c| c.0 != top_tier)
        .map(|c| c.1.clone())
        .collect();
    let one_content = top.iter().all(|c| c.2 == top[0].2);
    if one_content {
        let mut shadowed = top[1..].to_vec();
        shadowed.extend(rest);
        return Some(Expected {
            winner: Some(top[0].clone()),
            conflict: vec![],
            shadowed,
            settled: false,
        });
    }
    // The last override for this name decides, if it names a source with one content.
    if let Some(&(_, src, _)) = overrides.iter().rev().find(|o| o.0 == name) {
        let chosen: Vec<&Cand> = top.iter().filter(|c| c.0 == src).collect();
        if !chosen.is_empty() && chosen.iter().all(|c| c.2 == chosen[0].2) {
            let winner = chosen[0].clone();
            let mut shadowed: Vec<Cand> = top.iter().filter(|c| **c != winner).cloned().collect();
            shadowed.extend(rest);
            return Some(Expected {
                winner: Some(winner),
                conflict: vec![],
                shadowed,
                settled: true,
            });
        }
    }
    Some(Expected {
        winner: None,
        conflict: top,
        shadowed: rest,
        settled: false,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn resolver_matches_the_model(
        specs in prop::collection::vec(source_spec(), 0..7),
        raw_overrides in prop::collection::vec((0..NAMES.len(), 0usize..7, any::<bool>()), 0..4),
    ) {
        let overrides: Vec<(usize, usize, bool)> = raw_overrides;
        let sources = build(&specs);
        let ov: Vec<Override> = overrides
            .iter()
            .map(|&(name, src, by_toolkit)| Override {
                skill: NAMES[name].to_owned(),
                // Operators may name a source by id or by its toolkit.
                source: if by_toolkit { format!("kit{src}") } else { format!("s{src}") },
            })
            .collect();
        let index = resolve(&sources, &ov);
        let id_of = |c: &cloud_harness_skills::resolver::Candidate| {
            let id = &index.source(c).id;
            (id[1..].parse::<usize>().unwrap(), c.path.clone(), c.digest())
        };
        for (name, text) in NAMES.iter().enumerate() {
            let expected = model(&specs, &overrides, name);
            let got = index.lookup(text).map(|r| Expected {
                winner: r.winner.as_ref().map(id_of),
                conflict: r.conflict.iter().map(id_of).collect(),
                shadowed: r.shadowed.iter().map(id_of).collect(),
                settled: r.settled_by_override,
            });
            prop_assert_eq!(got, expected, "skill {}", text);
        }
        prop_assert!(index.lookup("missing").is_none());
        // Same inputs, same generation; any change of inputs, another.
        prop_assert_eq!(resolve(&sources, &ov).generation, index.generation);
        let mut more = ov.clone();
        more.push(Override { skill: "zeta".into(), source: "s0".into() });
        prop_assert_ne!(resolve(&sources, &more).generation, index.generation);
    }
}

#[test]
fn shadowing_a_sibling_is_a_warning_naming_the_link() {
    let skill = |name: &str, links: &[&str], variant: &str| Found {
        name: SkillName::new(name).unwrap(),
        path: name.into(),
        info: Arc::new(SkillInfo {
            digest: Digest::of(format!("{name}{variant}").as_bytes()),
            meta: SkillMeta {
                description: "d".into(),
                ..SkillMeta::default()
            },
            warnings: vec![],
            problems: Vec::new(),
            links: links.iter().map(|s| s.to_string()).collect(),
        }),
    };
    let source = |id: &str, tier, skills| Source {
        id: id.into(),
        tier,
        provenance: Provenance::default(),
        tree: Digest::of(id.as_bytes()),
        discovery: Discovery {
            skills,
            ..Discovery::default()
        },
    };
    let sources = vec![
        source(
            "builtin",
            Tier::Builtin,
            vec![skill("code-review", &[], "b")],
        ),
        source(
            "owner:superpowers",
            Tier::Owner,
            vec![
                skill("tdd", &["code-review"], "o"),
                skill("code-review", &[], "o"),
            ],
        ),
    ];
    let index = resolve(&sources, &[]);
    assert_eq!(
        index.source(index.winner("tdd").unwrap()).id,
        "owner:superpowers"
    );
    let warning = index
        .warnings
        .iter()
        .find(|w| w.skill.as_deref() == Some("tdd"))
        .expect("a warning for tdd");
    assert!(
        warning.message.contains("../code-review/"),
        "{}",
        warning.message
    );
    assert!(warning.message.contains("builtin"), "{}", warning.message);

    // Without the shadowing copy, no warning.
    let index = resolve(&sources[1..], &[]);
    assert!(index.warnings.is_empty(), "{:?}", index.warnings);
}

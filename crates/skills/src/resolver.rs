//! The tier resolver: four tiers of sources in, one immutable resolved index out.
//!
//! Precedence is fixed: built-in > owner > workspace > repository. For each skill name the
//! highest tier holding it wins and every other candidate is reported as shadowed. Two
//! candidates of that tier with different content are a CONFLICT (409), unless an operator
//! override names the winning source; a conflicted name has no winner, so nothing is served
//! under it until someone decides. Candidates with identical content are not a conflict: the
//! first source in order wins and the other is shadowed.
//!
//! The index is built once per generation (a digest over every input) and answers lookups with
//! one hash probe; it never probes tiers one by one.

use crate::discovery::{Discovery, SkillInfo, Skipped};
use cloud_harness_error::{Code, Error};
use cloud_harness_store::cas::{Digest, Hasher};
use serde::{Deserialize, Serialize, Serializer};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// The version of the resolution rules, part of every generation digest.
const RESOLVER_VERSION: &str = "cloud-harness resolver 1";

/// The tiers, in order of precedence (highest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Builtin,
    Owner,
    Workspace,
    Repository,
}

impl Tier {
    pub const ALL: [Tier; 4] = [
        Tier::Builtin,
        Tier::Owner,
        Tier::Workspace,
        Tier::Repository,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Builtin => "builtin",
            Tier::Owner => "owner",
            Tier::Workspace => "workspace",
            Tier::Repository => "repository",
        }
    }
}

impl std::str::FromStr for Tier {
    type Err = Error;
    fn from_str(s: &str) -> Result<Tier, Error> {
        match s {
            "builtin" | "built-in" => Ok(Tier::Builtin),
            "owner" => Ok(Tier::Owner),
            "workspace" => Ok(Tier::Workspace),
            "repository" => Ok(Tier::Repository),
            other => Err(Error::invalid(format!(
                "unknown tier {other:?} (builtin, owner, workspace or repository)"
            ))),
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a source's skills come from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Provenance {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toolkit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// A local directory the source was read from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// One input of a tier: a tree in the store and the skills discovered in it.
#[derive(Debug, Clone)]
pub struct Source {
    /// Unique within a stack, e.g. `owner:team-skills` or `workspace:/srv/project/skills`.
    pub id: String,
    pub tier: Tier,
    pub provenance: Provenance,
    pub tree: Digest,
    pub discovery: Discovery,
}

/// An operator's decision for a same-tier conflict: `skill` comes from `source` (a source id
/// or the name of its toolkit).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Override {
    pub skill: String,
    pub source: String,
}

/// One skill folder of one source that could be served under its name.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub name: String,
    pub tier: Tier,
    /// Index into [`Index::sources`].
    pub source: usize,
    pub path: String,
    pub info: Arc<SkillInfo>,
}

impl Candidate {
    pub fn digest(&self) -> Digest {
        self.info.digest
    }
}

/// What the index says about one skill name.
#[derive(Debug, Clone)]
pub struct Resolution {
    pub name: String,
    /// The served candidate; `None` while a same-tier conflict is unsettled.
    pub winner: Option<Candidate>,
    /// The same-tier candidates in conflict (empty when there is none).
    pub conflict: Vec<Candidate>,
    /// The source an override chose, when one settled a conflict.
    pub settled_by_override: bool,
    /// Every other candidate, highest tier first.
    pub shadowed: Vec<Candidate>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct SourceSummary {
    pub id: String,
    pub tier: Tier,
    pub provenance: Provenance,
    pub tree: Digest,
    pub skills: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SkippedAt {
    pub source: String,
    pub tier: Tier,
    #[serde(flatten)]
    pub skipped: Skipped,
}

/// The resolved view of one generation. Immutable: a change of any input builds a new one.
#[derive(Debug, Clone)]
pub struct Index {
    pub generation: Digest,
    pub sources: Vec<SourceSummary>,
    /// Sorted by name.
    resolutions: Vec<Resolution>,
    by_name: HashMap<String, usize>,
    pub skipped: Vec<SkippedAt>,
    pub warnings: Vec<Warning>,
}

impl Index {
    /// Every name, in name order.
    pub fn resolutions(&self) -> &[Resolution] {
        &self.resolutions
    }

    pub fn lookup(&self, name: &str) -> Option<&Resolution> {
        self.by_name.get(name).map(|&i| &self.resolutions[i])
    }

    /// The served candidate for `name`, if any.
    pub fn winner(&self, name: &str) -> Option<&Candidate> {
        self.lookup(name).and_then(|r| r.winner.as_ref())
    }

    pub fn winners(&self) -> impl Iterator<Item = &Candidate> {
        self.resolutions.iter().filter_map(|r| r.winner.as_ref())
    }

    pub fn conflicts(&self) -> impl Iterator<Item = &Resolution> {
        self.resolutions.iter().filter(|r| r.winner.is_none())
    }

    pub fn source(&self, candidate: &Candidate) -> &SourceSummary {
        &self.sources[candidate.source]
    }

    /// The CONFLICT error for the first unsettled conflict, if there is one.
    pub fn conflict_error(&self) -> Option<Error> {
        let conflicts: Vec<&Resolution> = self.conflicts().collect();
        let first = conflicts.first()?;
        let describe =
            |c: &Candidate| format!("{} ({}, {})", self.sources[c.source].id, c.path, c.digest());
        let names: Vec<String> = first.conflict.iter().map(describe).collect();
        let message = format!(
            "skill `{}` is defined differently by {} sources of the {} tier: {}{}",
            first.name,
            first.conflict.len(),
            first.conflict[0].tier,
            names.join(" and "),
            if conflicts.len() > 1 {
                format!(" (and {} more conflicts)", conflicts.len() - 1)
            } else {
                String::new()
            }
        );
        Some(
            Error::new(Code::Conflict, message).with_details(serde_json::json!({
                "conflicts": conflicts.iter().map(|r| self.conflict_json(r)).collect::<Vec<_>>(),
            })),
        )
    }

    pub fn candidate_json(&self, c: &Candidate) -> serde_json::Value {
        let src = &self.sources[c.source];
        let mut v = serde_json::json!({
            "name": c.name,
            "tier": c.tier,
            "source": src.id,
            "path": c.path,
            "digest": c.digest(),
            "description": c.info.meta.description,
        });
        let p = &src.provenance;
        for (key, value) in [
            ("toolkit", &p.toolkit),
            ("url", &p.url),
            ("commit", &p.commit),
        ] {
            if let Some(value) = value {
                v[key] = value.clone().into();
            }
        }
        v
    }

    pub fn conflict_json(&self, r: &Resolution) -> serde_json::Value {
        serde_json::json!({
            "skill": r.name,
            "tier": r.conflict.first().map(|c| c.tier),
            "code": Code::Conflict.as_str(),
            "status": Code::Conflict.status(),
            "candidates": r.conflict.iter().map(|c| self.candidate_json(c)).collect::<Vec<_>>(),
            "shadowed": r.shadowed.iter().map(|c| self.candidate_json(c)).collect::<Vec<_>>(),
        })
    }

    /// The whole resolution as one JSON document (what `skills resolve --json` prints).
    pub fn to_json(&self) -> serde_json::Value {
        let skills: Vec<_> = self
            .resolutions
            .iter()
            .filter_map(|r| {
                let w = r.winner.as_ref()?;
                let mut v = self.candidate_json(w);
                v["userOnly"] = w.info.meta.user_only.into();
                v["settledByOverride"] = r.settled_by_override.into();
                v["shadowed"] = r.shadowed.iter().map(|c| self.candidate_json(c)).collect();
                Some(v)
            })
            .collect();
        serde_json::json!({
            "generation": self.generation,
            "sources": self.sources,
            "skills": skills,
            "conflicts": self.conflicts().map(|r| self.conflict_json(r)).collect::<Vec<_>>(),
            "skipped": self.skipped,
            "warnings": self.warnings,
        })
    }
}

impl Serialize for Index {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

/// Builds the resolved index of `sources` (in any order; within a tier, earlier sources come
/// first) with the operator's `overrides`.
pub fn resolve(sources: &[Source], overrides: &[Override]) -> Index {
    // Stable order: by tier, then as given.
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| sources[i].tier);
    let sources: Vec<&Source> = order.iter().map(|&i| &sources[i]).collect();

    let mut warnings = Vec::new();
    let mut skipped = Vec::new();
    let mut by_name: HashMap<&str, Vec<Candidate>> = HashMap::new();
    for (si, src) in sources.iter().enumerate() {
        for w in &src.discovery.warnings {
            warnings.push(Warning {
                source: Some(src.id.clone()),
                skill: None,
                message: w.clone(),
            });
        }
        for s in &src.discovery.skipped {
            skipped.push(SkippedAt {
                source: src.id.clone(),
                tier: src.tier,
                skipped: s.clone(),
            });
        }
        for found in &src.discovery.skills {
            for w in &found.info.warnings {
                warnings.push(Warning {
                    source: Some(src.id.clone()),
                    skill: Some(found.name.to_string()),
                    message: w.clone(),
                });
            }
            by_name
                .entry(found.name.as_str())
                .or_default()
                .push(Candidate {
                    name: found.name.to_string(),
                    tier: src.tier,
                    source: si,
                    path: found.path.clone(),
                    info: found.info.clone(),
                });
        }
    }

    let mut names: Vec<&str> = by_name.keys().copied().collect();
    names.sort_unstable();
    let mut resolutions = Vec::with_capacity(names.len());
    for name in names {
        let mut candidates = by_name.remove(name).unwrap_or_default();
        // Precedence order: tier, then source order (sources are sorted by tier), then path.
        candidates.sort_by(|a, b| (a.source, &a.path).cmp(&(b.source, &b.path)));
        let top_tier = candidates[0].tier;
        let top_len = candidates.iter().take_while(|c| c.tier == top_tier).count();
        let mut shadowed = candidates.split_off(top_len);
        let mut top = candidates;
        let first_digest = top[0].digest();
        let resolution = if top.iter().all(|c| c.digest() == first_digest) {
            let winner = top.remove(0);
            top.append(&mut shadowed);
            Resolution {
                name: name.to_owned(),
                winner: Some(winner),
                conflict: Vec::new(),
                settled_by_override: false,
                shadowed: top,
            }
        } else {
            let chosen = settle(name, &top, &sources, overrides, &mut warnings);
            match chosen {
                Some(i) => {
                    let winner = top.remove(i);
                    top.append(&mut shadowed);
                    Resolution {
                        name: name.to_owned(),
                        winner: Some(winner),
                        conflict: Vec::new(),
                        settled_by_override: true,
                        shadowed: top,
                    }
                }
                None => Resolution {
                    name: name.to_owned(),
                    winner: None,
                    conflict: top,
                    settled_by_override: false,
                    shadowed,
                },
            }
        };
        resolutions.push(resolution);
    }

    let by_name: HashMap<String, usize> = resolutions
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.clone(), i))
        .collect();
    for o in overrides {
        let needed = by_name.get(&o.skill).is_some_and(|&i| {
            resolutions[i].settled_by_override || resolutions[i].winner.is_none()
        });
        if !needed {
            warnings.push(Warning {
                source: None,
                skill: Some(o.skill.clone()),
                message: format!(
                    "override `{}={}` is not needed: there is no conflict to settle",
                    o.skill, o.source
                ),
            });
        }
    }
    link_warnings(&resolutions, &by_name, &sources, &mut warnings);

    let generation = generation(&sources, overrides);
    let sources = sources
        .iter()
        .map(|s| SourceSummary {
            id: s.id.clone(),
            tier: s.tier,
            provenance: s.provenance.clone(),
            tree: s.tree,
            skills: s.discovery.skills.len(),
        })
        .collect();
    Index {
        generation,
        sources,
        resolutions,
        by_name,
        skipped,
        warnings,
    }
}

fn source_matches(src: &Source, name: &str) -> bool {
    src.id == name || src.provenance.toolkit.as_deref() == Some(name)
}

/// The index in `top` an override picks for `name`, if one applies unambiguously.
fn settle(
    name: &str,
    top: &[Candidate],
    sources: &[&Source],
    overrides: &[Override],
    warnings: &mut Vec<Warning>,
) -> Option<usize> {
    let wanted = overrides.iter().rev().find(|o| o.skill == name)?;
    let matching: Vec<usize> = (0..top.len())
        .filter(|&i| source_matches(sources[top[i].source], &wanted.source))
        .collect();
    let distinct = matching
        .iter()
        .map(|&i| top[i].digest())
        .collect::<std::collections::BTreeSet<_>>();
    match (matching.first(), distinct.len()) {
        (Some(&i), 1) => Some(i),
        (None, _) => {
            warnings.push(Warning {
                source: None,
                skill: Some(name.to_owned()),
                message: format!(
                    "override names source `{}`, which has no candidate for `{name}` in the {} tier",
                    wanted.source, top[0].tier
                ),
            });
            None
        }
        _ => {
            warnings.push(Warning {
                source: Some(wanted.source.clone()),
                skill: Some(name.to_owned()),
                message: format!(
                    "override names source `{}`, which itself holds differing copies of `{name}`",
                    wanted.source
                ),
            });
            None
        }
    }
}

/// Records a warning where a winner links to a sibling of its own source that the merged view
/// serves from somewhere else (or not at all).
fn link_warnings(
    resolutions: &[Resolution],
    by_name: &HashMap<String, usize>,
    sources: &[&Source],
    warnings: &mut Vec<Warning>,
) {
    for r in resolutions {
        let Some(w) = &r.winner else { continue };
        for link in &w.info.links {
            let target = by_name.get(link).map(|&i| &resolutions[i]);
            let served_from = match target.and_then(|t| t.winner.as_ref()) {
                Some(t) if t.source == w.source => continue,
                Some(t) => format!("comes from {} `{}`", t.tier, sources[t.source].id),
                None => "is in conflict and not served".to_owned(),
            };
            warnings.push(Warning {
                source: Some(sources[w.source].id.clone()),
                skill: Some(r.name.clone()),
                message: format!(
                    "links to its sibling `../{link}/`, but in the merged view `{link}` {served_from}; the link works in its source's own view"
                ),
            });
        }
    }
}

/// A digest over everything that decides the resolution.
fn generation(sources: &[&Source], overrides: &[Override]) -> Digest {
    let mut h = Hasher::default();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(RESOLVER_VERSION.as_bytes());
    for s in sources {
        field(s.id.as_bytes());
        field(s.tier.as_str().as_bytes());
        let p = &s.provenance;
        for part in [&p.toolkit, &p.url, &p.commit, &p.path] {
            field(part.as_deref().unwrap_or("\0none").as_bytes());
        }
        field(&s.tree.0);
        field(&(s.discovery.skills.len() as u64).to_le_bytes());
        for f in &s.discovery.skills {
            field(f.name.as_bytes());
            field(f.path.as_bytes());
            field(&f.info.digest.0);
        }
    }
    let mut sorted: Vec<&Override> = overrides.iter().collect();
    sorted.sort_by(|a, b| (&a.skill, &a.source).cmp(&(&b.skill, &b.source)));
    for o in sorted {
        field(o.skill.as_bytes());
        field(o.source.as_bytes());
    }
    h.finish()
}

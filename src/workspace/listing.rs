//! What a workspace says about its skills: `skills_list`, and the skills part of
//! `workspace_open`'s result. Paths are the executor's.

use super::Workspace;
use cloud_harness_fs::cas::Digest;
use cloud_harness_fs::namespace::TIERS_DIR;
use cloud_harness_fs::resolver::{Candidate, Index, Tier};
use serde::Serialize;
use serde_json::Value;

/// A skill as listings show it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkillView<'a> {
    name: &'a str,
    description: &'a str,
    tier: Tier,
    toolkit: Option<&'a str>,
    source: &'a str,
    digest: Digest,
    user_only: bool,
    /// The skill's folder inside the executor, when the skills are mounted there.
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<SkillPath<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    served: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shadowed: Option<Vec<SkillView<'a>>>,
}

/// Where the executor reads a skill: the merged view for the one served, its tier's own view
/// (`.tiers/<tier>/`) for a shadowed copy. Written out as it is serialized, with no string of
/// its own (listings can hold 10,000 skills).
struct SkillPath<'a> {
    root: &'a str,
    tier: Option<Tier>,
    name: &'a str,
}

impl Serialize for SkillPath<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.tier {
            None => s.collect_str(&format_args!("{}/{}", self.root, self.name)),
            Some(t) => s.collect_str(&format_args!("{}/{TIERS_DIR}/{t}/{}", self.root, self.name)),
        }
    }
}

#[derive(Serialize)]
struct Listing<'a> {
    workspace: &'a str,
    generation: Digest,
    count: usize,
    skills: Vec<SkillView<'a>>,
    conflicts: Vec<Value>,
}

impl Workspace {
    pub(super) fn toolkit_of<'a>(&'a self, index: &'a Index, c: &'a Candidate) -> Option<&'a str> {
        match c.tier {
            Tier::Workspace => self
                .record
                .workspace_skills
                .get(&c.name)
                .map(String::as_str),
            _ => index.source(c).provenance.toolkit.as_deref(),
        }
    }

    fn view<'a>(
        &'a self,
        index: &'a Index,
        c: &'a Candidate,
        served: bool,
        root: Option<&'a str>,
    ) -> SkillView<'a> {
        SkillView {
            name: &c.name,
            description: &c.info.meta.description,
            tier: c.tier,
            toolkit: self.toolkit_of(index, c),
            source: &index.source(c).id,
            digest: c.digest(),
            user_only: c.info.meta.user_only,
            path: root.map(|root| SkillPath {
                root,
                tier: (!served).then_some(c.tier),
                name: &c.name,
            }),
            served: None,
            shadowed: None,
        }
    }

    pub(super) fn skill_json(&self, index: &Index, c: &Candidate, served: bool) -> Value {
        let root = self.skills_root();
        serde_json::to_value(self.view(index, c, served, root.as_deref())).expect("views serialize")
    }

    /// `skills_list`: every visible skill, or one tier's, with its shadowed candidates.
    pub fn list(&self, tier: Option<Tier>, include_shadowed: bool) -> Value {
        let g = self.generation();
        let index = &g.index;
        let root = self.skills_root();
        let root = root.as_deref();
        let mut skills = Vec::new();
        for r in index.resolutions() {
            let Some(winner) = &r.winner else { continue };
            let shown = match tier {
                None => Some(winner),
                // A tier's own view: its best candidate, served or shadowed.
                Some(t) => std::iter::once(winner)
                    .chain(r.shadowed.iter())
                    .find(|c| c.tier == t),
            };
            let Some(c) = shown else { continue };
            let served = std::ptr::eq(c, winner);
            let mut v = self.view(index, c, served, root);
            v.served = Some(served);
            if include_shadowed {
                v.shadowed = Some(
                    r.shadowed
                        .iter()
                        .filter(|s| !std::ptr::eq(*s, c))
                        .map(|s| self.view(index, s, false, root))
                        .collect(),
                );
            }
            skills.push(v);
        }
        let conflicts: Vec<Value> = index.conflicts().map(|r| index.conflict_json(r)).collect();
        serde_json::to_value(Listing {
            workspace: &self.id,
            generation: g.digest(),
            count: skills.len(),
            skills,
            conflicts,
        })
        .expect("listings serialize")
    }
}

//! What a workspace says about its skills: `skills_list`, and the skills part of
//! `workspace_open`'s result. Paths are the executor's.

use super::pages::{ListPage, PageKey};
use super::served::Workspace;
use cloud_harness_skills::namespace::TIERS_DIR;
use cloud_harness_skills::resolver::{Candidate, Index, Tier};
use cloud_harness_skills::spec::{self, Problem};
use cloud_harness_store::cas::Digest;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

/// A skill as listings show it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SkillView<'a> {
    name: &'a str,
    description: &'a str,
    tier: Tier,
    toolkit: Option<&'a str>,
    source: &'a str,
    digest: Digest,
    user_only: bool,
    /// The rules of the Agent Skills specification it breaks (`skills_read` says more).
    #[serde(skip_serializing_if = "Rules::is_empty")]
    problems: Rules<'a>,
    /// The skill's folder inside the executor, when the skills are mounted there.
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<SkillPath<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    served: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shadowed: Option<Vec<SkillView<'a>>>,
}

/// A skill's problems as the names of their rules, written out as serialized.
struct Rules<'a>(&'a [Problem]);

impl Rules<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Rules<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(spec::rules(self.0).into_iter().map(|r| r.as_str()))
    }
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
#[serde(rename_all = "camelCase")]
struct Listing<'a> {
    workspace: &'a str,
    generation: Digest,
    count: usize,
    skills: Vec<SkillView<'a>>,
    conflicts: Vec<Value>,
    /// On the first page: the skills left out, with why.
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// The cursor of a page that follows the skill `name`: opaque to clients.
fn cursor_after(name: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("after:{name}"))
}

/// The skill name a cursor continues after; `None` for a cursor this server never gave.
pub fn cursor_name(cursor: &str) -> Option<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()?;
    String::from_utf8(bytes)
        .ok()?
        .strip_prefix("after:")
        .map(str::to_owned)
}

/// The skills left out of a workspace, each with its reason (`code`, `reason`, `details`
/// naming the file and the bound it broke): those each toolkit's normalizer left out
/// (`toolkit`, from `toolkits` as `workspace_open` lists them), then those the resolution of
/// `index` skipped (`source`: a bad `SKILL.md` in the project's repository, say). Only those
/// of `tier` when one is given.
pub(super) fn skipped(toolkits: &Value, index: &Index, tier: Option<Tier>) -> Vec<Value> {
    let wanted = |t: &Value| tier.is_none_or(|tier| *t == serde_json::json!(tier));
    let mut out = Vec::new();
    for t in toolkits.as_array().into_iter().flatten() {
        if !wanted(&t["scope"]) {
            continue;
        }
        for s in t["skipped"].as_array().into_iter().flatten() {
            let mut s = s.clone();
            s["toolkit"] = t["instanceId"].clone();
            s["tier"] = t["scope"].clone();
            out.push(s);
        }
    }
    out.extend(
        index
            .skipped
            .iter()
            .filter(|s| tier.is_none_or(|t| s.tier == t))
            .map(|s| serde_json::to_value(s).expect("skipped skills serialize")),
    );
    out
}

/// Whether two candidates, each of its own index, are the same copy of a skill.
fn is_same(a_index: &Index, a: &Candidate, b_index: &Index, b: &Candidate) -> bool {
    a.tier == b.tier && a.path == b.path && a_index.source(a).id == b_index.source(b).id
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
            problems: Rules(&c.info.problems),
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

    /// `skills_list`: every visible skill with the copies it shadows, or one tier's skills as
    /// `.tiers/<tier>/` serves them (the tier's sources resolved alone, the same resolution the
    /// mount uses, so a name the tier's own conflict drops is a conflict here too).
    pub fn list(&self, tier: Option<Tier>, include_shadowed: bool) -> Value {
        self.list_page(tier, include_shadowed, None, usize::MAX)
    }

    /// One page of [`Workspace::list`]: at most `limit` skills, those named after `after` (in
    /// name order, so a page follows on by name even when a live change made a new
    /// generation meanwhile). `nextCursor` says where the next page starts.
    pub fn list_page(
        &self,
        tier: Option<Tier>,
        include_shadowed: bool,
        after: Option<&str>,
        limit: usize,
    ) -> Value {
        self.shared_page(tier, include_shadowed, after, limit)
            .value
            .clone()
    }

    /// [`Workspace::list_page`] as the page cache keeps it, value and JSON text, shared.
    pub fn shared_page(
        &self,
        tier: Option<Tier>,
        include_shadowed: bool,
        after: Option<&str>,
        limit: usize,
    ) -> Arc<ListPage> {
        let g = self.generation();
        let key = PageKey {
            generation: g.digest(),
            root: self.skills_root(),
            tier,
            include_shadowed,
            after: after.map(str::to_owned),
            limit,
        };
        if let Some(page) = self.pages.get(&key) {
            return page;
        }
        let value = self.build_page(&g, &key);
        let page = Arc::new(ListPage::new(value));
        self.pages.put(key, page.clone());
        page
    }

    fn build_page(&self, g: &cloud_harness_skills::generation::Generation, key: &PageKey) -> Value {
        let PageKey {
            tier,
            include_shadowed,
            limit,
            ..
        } = *key;
        let after = key.after.as_deref();
        let merged = &g.index;
        let index = match tier {
            None => Some(&**merged),
            Some(t) => g.tier_index(t),
        };
        let root = key.root.as_deref();
        let mut skills = Vec::new();
        let mut conflicts = Vec::new();
        let mut more = false;
        let skipped = after.is_none().then(|| match index {
            Some(index) => skipped(&self.record.result["toolkits"], index, tier),
            None => Vec::new(),
        });
        if let Some(index) = index {
            let resolutions = index.resolutions();
            let start = after.map_or(0, |a| resolutions.partition_point(|r| r.name.as_str() <= a));
            for r in &resolutions[start..] {
                let Some(c) = &r.winner else { continue };
                if skills.len() == limit {
                    more = true;
                    break;
                }
                let served = tier.is_none()
                    || merged
                        .winner(&c.name)
                        .is_some_and(|w| is_same(merged, w, index, c));
                let mut v = self.view(index, c, served, root);
                v.served = Some(served);
                if include_shadowed {
                    let shadowed = r.shadowed.iter().map(|s| self.view(index, s, false, root));
                    v.shadowed = Some(shadowed.collect());
                }
                skills.push(v);
            }
            conflicts.extend(index.conflicts().map(|r| index.conflict_json(r)));
        }
        let next_cursor = more
            .then(|| skills.last().map(|s| cursor_after(s.name)))
            .flatten();
        serde_json::to_value(Listing {
            workspace: &self.id,
            generation: g.digest(),
            count: skills.len(),
            skills,
            conflicts,
            skipped,
            next_cursor,
        })
        .expect("listings serialize")
    }
}

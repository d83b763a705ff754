//! The library: every skill in the store (each bundle the index records) and in the built-in
//! tier, searchable by name, description and toolkit, with where each is used — open
//! workspaces, registry pins, set members — and the skill folders each toolkit left out, with
//! why. A bundle's skills are read from the store once and kept (a bundle never changes), so a
//! query is a filter over what is in memory.

use crate::Workspaces;
use cloud_harness_control::toolkit::ToolkitSpec;
use cloud_harness_curation::registry::Registry;
use cloud_harness_curation::sets;
use cloud_harness_error::Result;
use cloud_harness_provision::index::{BundleIndex, BundleRecord};
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::resolver::Tier;
use cloud_harness_store::cas::{Digest, Store};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One skill of one bundle.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// `builtin`, or `store` for a toolkit's.
    pub tier: &'static str,
    pub toolkit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<Digest>,
    /// The skill folder's digest.
    pub digest: Digest,
    /// Where the folder sits in its bundle.
    pub path: String,
    pub user_only: bool,
    pub warnings: Vec<String>,
    /// What it breaks of the Agent Skills specification.
    pub problems: Vec<cloud_harness_skills::spec::Problem>,
    /// Lowercased name, description and toolkit, for the search.
    #[serde(skip)]
    haystack: String,
}

/// A skill folder a toolkit left out (a bad `SKILL.md`, an exclude pattern), with why.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedSkill {
    pub toolkit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Where the folder sits in the toolkit's repository (or in its bundle).
    pub path: String,
    pub code: String,
    pub reason: String,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub details: Value,
}

/// What the library knows of one bundle.
struct Bundle {
    skills: Arc<Vec<Skill>>,
    skipped: Arc<Vec<SkippedSkill>>,
}

/// What a search asks for.
#[derive(Debug, Default, Clone)]
pub struct Search {
    /// Words that must all appear in the name, description or toolkit (any case).
    pub text: Option<String>,
    pub tier: Option<String>,
    pub toolkit: Option<String>,
    /// Only skills with warnings.
    pub warnings: bool,
    /// Only skills that break the Agent Skills specification.
    pub problems: bool,
    /// Skip this many matches (a cursor).
    pub offset: usize,
    pub limit: usize,
}

#[derive(Default)]
pub struct Library {
    cache: SkillCache,
    /// The built-in tier's tree (put into the store once).
    builtin: std::sync::OnceLock<Digest>,
    /// Each bundle's skills, by bundle digest.
    bundles: Mutex<HashMap<Digest, Arc<Bundle>>>,
}

impl Library {
    fn skills_of(
        &self,
        store: &Store,
        tier: Tier,
        record: Option<&BundleRecord>,
        tree: Digest,
    ) -> Result<Arc<Bundle>> {
        if let Some(done) = self.bundles.lock().expect("library lock").get(&tree) {
            return Ok(done.clone());
        }
        let (toolkit, url, commit) = match record {
            Some(r) => (
                r.instance_id.clone(),
                Some(r.key.url.clone()),
                Some(r.key.commit.clone()),
            ),
            None => ("cloud-harness".to_owned(), None, None),
        };
        let source = cloud_harness_provision::bundle_source(
            store,
            &self.cache,
            tier,
            &toolkit,
            url.as_deref().unwrap_or(""),
            commit.as_deref().unwrap_or(""),
            tree,
            // The library shows every skill of the store, problems and all.
            Default::default(),
        )?;
        let skills: Vec<Skill> = source
            .discovery
            .skills
            .iter()
            .map(|f| {
                let description = f.info.meta.description.clone();
                let name = f.name.as_str().to_owned();
                Skill {
                    haystack: format!("{}\n{}\n{}", name, description, toolkit).to_lowercase(),
                    name,
                    description,
                    tier: if tier == Tier::Builtin {
                        "builtin"
                    } else {
                        "store"
                    },
                    toolkit: toolkit.clone(),
                    preset: record.and_then(|r| r.preset.clone()),
                    url: url.clone(),
                    commit: commit.clone(),
                    bundle: record.map(|r| r.bundle),
                    digest: f.info.digest,
                    path: f.path.clone(),
                    user_only: f.info.meta.user_only,
                    warnings: f.info.warnings.clone(),
                    problems: f.info.problems.clone(),
                }
            })
            .collect();
        // Left out when the bundle was made, and left out of it now (a rule added since).
        let skipped = record
            .map(|r| r.skipped.as_slice())
            .unwrap_or_default()
            .iter()
            .chain(&source.discovery.skipped)
            .map(|s| SkippedSkill {
                toolkit: toolkit.clone(),
                url: url.clone(),
                commit: commit.clone(),
                path: s.path.clone(),
                code: s.code.clone(),
                reason: s.reason.clone(),
                details: s.details.clone(),
            })
            .collect();
        let bundle = Arc::new(Bundle {
            skills: Arc::new(skills),
            skipped: Arc::new(skipped),
        });
        self.bundles
            .lock()
            .expect("library lock")
            .insert(tree, bundle.clone());
        Ok(bundle)
    }

    /// Every skill: the built-in tier's, then each bundle's (newest bundle first).
    pub fn all(&self, store: &Store) -> Result<Vec<Arc<Vec<Skill>>>> {
        Ok(self
            .bundles(store)?
            .iter()
            .map(|b| b.skills.clone())
            .collect())
    }

    /// Every skill folder the toolkits of the store left out, with why (newest bundle first).
    pub fn skipped(&self, store: &Store) -> Result<Vec<SkippedSkill>> {
        Ok(self
            .bundles(store)?
            .iter()
            .flat_map(|b| b.skipped.iter().cloned())
            .collect())
    }

    fn bundles(&self, store: &Store) -> Result<Vec<Arc<Bundle>>> {
        let builtin = match self.builtin.get() {
            Some(d) => *d,
            None => {
                let d = crate::builtin::store_builtin(store)?;
                *self.builtin.get_or_init(|| d)
            }
        };
        let mut out = vec![self.skills_of(store, Tier::Builtin, None, builtin)?];
        for record in BundleIndex::open(store).list()? {
            // A bundle the store lost (collected, damaged) is left out, not the whole library.
            match self.skills_of(store, Tier::Owner, Some(&record), record.bundle) {
                Ok(skills) => out.push(skills),
                Err(e) => {
                    tracing::warn!(bundle = %record.bundle, error = %e, "a bundle of the index cannot be read")
                }
            }
        }
        Ok(out)
    }

    /// One page of the skills matching `search`, and how many match in all.
    pub fn search(&self, store: &Store, search: &Search) -> Result<(Vec<Skill>, usize)> {
        let words: Vec<String> = search
            .text
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_lowercase)
            .collect();
        let mut total = 0;
        let mut page = Vec::new();
        for bundle in self.all(store)? {
            for s in bundle.iter() {
                let hit = words.iter().all(|w| s.haystack.contains(w.as_str()))
                    && search.tier.as_deref().is_none_or(|t| t == s.tier)
                    && search.toolkit.as_deref().is_none_or(|t| t == s.toolkit)
                    && (!search.warnings || !s.warnings.is_empty())
                    && (!search.problems || !s.problems.is_empty());
                if hit {
                    if total >= search.offset && page.len() < search.limit {
                        page.push(s.clone());
                    }
                    total += 1;
                }
            }
        }
        Ok((page, total))
    }
}

/// Where each of `skills` is used: the open workspaces `who` reaches that serve its folder,
/// the registry entries pinned at its bundle's commit, the sets with a member at it.
pub fn used_by(
    workspaces: &Workspaces,
    who: &cloud_harness_control::principal::Principal,
    registry: &Registry,
    sets: &[sets::Revision],
    skills: &[Skill],
) -> Vec<Value> {
    let mut serving: HashMap<Digest, Vec<String>> = HashMap::new();
    for ws in workspaces.open_workspaces_of(who) {
        for c in ws.generation().index.winners() {
            serving.entry(c.digest()).or_default().push(ws.id.clone());
        }
    }
    let same = |url: &str, commit: &str, s: &Skill| {
        s.url.as_deref() == Some(url) && s.commit.as_deref() == Some(commit)
    };
    skills
        .iter()
        .map(|s| {
            let entries: Vec<&str> = registry
                .entries()
                .filter(|e| {
                    e.pin
                        .as_ref()
                        .is_some_and(|p| same(&e.preset.url, &p.commit, s))
                })
                .map(|e| e.preset.id.as_str())
                .collect();
            let in_sets: Vec<Value> = sets
                .iter()
                .filter(|set| {
                    set.members.iter().any(|m| match m {
                        ToolkitSpec::Git(g) => {
                            g.git_ref.as_deref().is_some_and(|r| same(&g.url, r, s))
                        }
                        ToolkitSpec::Preset(p) => registry.find(&p.id).is_some_and(|e| {
                            let commit = p
                                .version
                                .clone()
                                .or_else(|| e.pin.as_ref().map(|p| p.commit.clone()));
                            commit.is_some_and(|c| same(&e.preset.url, &c, s))
                        }),
                        ToolkitSpec::Set(_) => false,
                    })
                })
                .map(|set| json!({ "id": set.id, "revision": set.revision }))
                .collect();
            json!({
                "workspaces": serving.get(&s.digest).cloned().unwrap_or_default(),
                "registry": entries,
                "sets": in_sets,
            })
        })
        .collect()
}

/// Every file of the skill folder `digest`: path, size and digest, in path order. The
/// folders listed count against a walk's entry budget.
pub fn files(store: &Store, digest: &Digest) -> Result<Vec<Value>> {
    use cloud_harness_store::cas::Kind;
    let mut out = Vec::new();
    let mut budget = cloud_harness_store::cas::WalkBudget::default();
    let mut pending = vec![(String::new(), *digest)];
    while let Some((dir, tree)) = pending.pop() {
        for e in budget.tree(store, &tree)?.entries() {
            let path = cloud_harness_skills::relpath::join(&dir, &e.name);
            match e.kind {
                Kind::Tree => pending.push((path, e.digest)),
                kind => out.push(json!({ "path": path, "size": e.size, "digest": e.digest, "kind": format!("{kind:?}").to_lowercase() })),
            }
        }
    }
    out.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    Ok(out)
}

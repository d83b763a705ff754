//! Finding the skills of a tree in the store, by the layout options of a toolkit spec.
//!
//! A skill is a folder holding a `SKILL.md`; its identity is its folder name. Skill roots are
//! searched for skill folders, one level down or (with `recursive`) through category folders
//! such as `skills/<bucket>/<name>/`. A skill's own subfolders are never searched: they are
//! its scripts and references. `include` and `exclude` take skill names or glob patterns.

use crate::folder::SkillRead;
pub use crate::folder::{read_skill, SkillInfo};
use crate::relpath;
use crate::skill;
use crate::spec::Validation;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Kind, Store, Tree, WalkBudget};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

/// How far category folders may nest below a skill root.
const MAX_CATEGORY_DEPTH: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Layout {
    pub skill_roots: Vec<String>,
    pub recursive: bool,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// What happens to skills that break the Agent Skills specification: served with their
    /// problems (`warn`), or skipped as SPEC_VIOLATION (`refuse`).
    #[serde(skip_serializing_if = "Validation::is_warn")]
    pub validation: Validation,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            skill_roots: vec!["skills".into()],
            recursive: true,
            include: Vec::new(),
            exclude: Vec::new(),
            validation: Validation::Warn,
        }
    }
}

impl Layout {
    /// The layout of a plain folder of skills: found anywhere below its top.
    pub fn folder() -> Self {
        Layout {
            skill_roots: vec![".".into()],
            ..Layout::default()
        }
    }

    /// Checks the options; each problem is an INVALID_ARGUMENT naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.skill_roots.is_empty() {
            return Err(Error::field(
                Code::InvalidArgument,
                "layout.skillRoots",
                "must name at least one folder",
            ));
        }
        for root in &self.skill_roots {
            root_segments(root)?;
        }
        for (field, patterns) in [
            ("skills.include", &self.include),
            ("skills.exclude", &self.exclude),
        ] {
            for p in patterns {
                glob::Pattern::new(p).map_err(|e| {
                    Error::field(
                        Code::InvalidArgument,
                        field,
                        format!("{p:?} is not a valid pattern: {e}"),
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// The path segments of a skill root: relative, inside the tree, no `..`.
fn root_segments(root: &str) -> Result<Vec<&str>> {
    relpath::segments(root, "layout.skillRoots", "the toolkit")
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Found {
    /// The skill's name: its folder name (or, at a toolkit's top, its front matter's).
    pub name: crate::skill::SkillName,
    /// Where the folder sits in the tree, `/`-separated.
    pub path: String,
    pub info: Arc<SkillInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub path: String,
    /// A stable code: an error code (INVALID_ARGUMENT, TOO_LARGE, …), EXCLUDED or NOT_INCLUDED.
    pub code: String,
    pub reason: String,
    /// What the refusal names, for programs: the file (`<path>/SKILL.md`) and, for a bound of
    /// its front matter, the bound and its limit (`bound`, `limit`).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub details: serde_json::Value,
}

impl Skipped {
    /// The skill folder at `path`, skipped for `error`.
    fn refused(path: &str, error: &Error) -> Skipped {
        let mut details = match &error.details {
            serde_json::Value::Object(map) => map.clone(),
            _ => serde_json::Map::new(),
        };
        if details.contains_key("file") {
            details.insert("file".into(), relpath::join(path, skill::SKILL_MD).into());
        }
        Skipped {
            path: path.to_owned(),
            code: error.code.as_str().into(),
            reason: error.message.clone(),
            details: if details.is_empty() {
                serde_json::Value::Null
            } else {
                details.into()
            },
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Discovery {
    pub skills: Vec<Found>,
    pub skipped: Vec<Skipped>,
    pub warnings: Vec<String>,
}

/// Parsed skill folders by digest and folder name (a skill's problems depend on its name),
/// shared between discoveries (a live tier that changes one skill re-reads only that skill).
/// Bounded: the least recently used go first.
#[derive(Debug)]
pub struct SkillCache {
    parsed: Mutex<lru::LruCache<(Digest, Option<String>), SkillRead>>,
}

/// Enough for the largest stacks measured (10,000 skills) several times over.
const CACHED_SKILLS: usize = 65_536;

impl Default for SkillCache {
    fn default() -> Self {
        SkillCache::with_capacity(CACHED_SKILLS)
    }
}

impl SkillCache {
    pub fn with_capacity(skills: usize) -> SkillCache {
        SkillCache {
            parsed: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(skills.max(1)).expect("at least one"),
            )),
        }
    }

    /// How many parsed skills it holds.
    pub fn len(&self) -> usize {
        self.parsed.lock().expect("skill cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Finds the skills of the tree `root` by `layout`.
pub fn discover(
    store: &Store,
    root: &Digest,
    layout: &Layout,
    cache: &SkillCache,
) -> Result<Discovery> {
    layout.validate()?;
    let include: Vec<glob::Pattern> = layout
        .include
        .iter()
        .filter_map(|p| glob::Pattern::new(p).ok())
        .collect();
    let exclude: Vec<glob::Pattern> = layout
        .exclude
        .iter()
        .filter_map(|p| glob::Pattern::new(p).ok())
        .collect();
    let mut walk = Walk {
        store,
        cache,
        recursive: layout.recursive,
        budget: WalkBudget::default(),
        seen: HashSet::new(),
        out: Discovery::default(),
    };
    let top = walk.budget.tree(store, root)?;
    // A root named twice (`skills` and `./skills/`) is searched once.
    let mut searched = BTreeSet::new();
    for skill_root in &layout.skill_roots {
        let segments = root_segments(skill_root)?;
        if !searched.insert(segments.clone()) {
            continue;
        }
        let mut digest = *root;
        let mut tree = top.clone();
        let mut found = true;
        for seg in &segments {
            match tree.get(seg) {
                Some(e) if e.kind == Kind::Tree => {
                    digest = e.digest;
                    tree = walk.budget.tree(store, &digest)?;
                }
                _ => {
                    found = false;
                    break;
                }
            }
        }
        if !found {
            walk.out.warnings.push(format!(
                "skill root `{skill_root}` is not a folder of the toolkit"
            ));
            continue;
        }
        let path = segments.join("/");
        if tree.get("SKILL.md").is_some() {
            // The root is itself one skill (a single-skill repository).
            let name = segments.last().map(|s| s.to_string());
            walk.skill(&path, name, digest)?;
        } else {
            walk.folder(&path, &tree, 0)?;
        }
    }
    let mut out = walk.out;

    // Sibling links: only names of skills found here count.
    let names: BTreeSet<String> = out.skills.iter().map(|s| s.name.to_string()).collect();
    for found in &mut out.skills {
        if found.info.links.iter().any(|l| !names.contains(l)) {
            let mut info = (*found.info).clone();
            info.links
                .retain(|l| names.contains(l) && l.as_str() != found.name.as_str());
            found.info = Arc::new(info);
        }
    }

    // include / exclude
    if !include.is_empty() {
        for p in &include {
            if !out.skills.iter().any(|s| p.matches(&s.name)) {
                out.warnings
                    .push(format!("include pattern `{p}` matches no skill"));
            }
        }
    }
    let (kept, dropped): (Vec<Found>, Vec<Found>) = out.skills.into_iter().partition(|s| {
        (include.is_empty() || include.iter().any(|p| p.matches(&s.name)))
            && !exclude.iter().any(|p| p.matches(&s.name))
    });
    for s in dropped {
        let (code, reason) = match exclude.iter().find(|p| p.matches(&s.name)) {
            Some(p) => ("EXCLUDED", format!("excluded by `{p}`")),
            None => ("NOT_INCLUDED", "matches no include pattern".to_owned()),
        };
        out.skipped.push(Skipped {
            path: s.path,
            code: code.into(),
            reason,
            details: serde_json::Value::Null,
        });
    }
    out.skills = kept;
    if layout.validation == Validation::Refuse {
        let (kept, refused): (Vec<Found>, Vec<Found>) = out
            .skills
            .into_iter()
            .partition(|s| s.info.problems.is_empty());
        out.skills = kept;
        out.skipped
            .extend(refused.into_iter().map(|s| spec_violation(&s)));
    }
    out.skills
        .sort_by(|a, b| (&a.name, &a.path).cmp(&(&b.name, &b.path)));
    Ok(out)
}

/// A skill refused for its problems (a toolkit with `validation: refuse`).
fn spec_violation(found: &Found) -> Skipped {
    crate::stats::Stats::add(&crate::stats::STATS.skills_refused, 1);
    Skipped {
        path: found.path.clone(),
        code: "SPEC_VIOLATION".into(),
        reason: format!(
            "breaks the Agent Skills specification ({}) and its toolkit refuses such skills",
            crate::spec::rule_names(&found.info.problems)
        ),
        details: serde_json::json!({ "problems": found.info.problems }),
    }
}

struct Walk<'a> {
    store: &'a Store,
    cache: &'a SkillCache,
    recursive: bool,
    /// Entries listed by the search for skill folders, in all.
    budget: WalkBudget,
    /// The skill folders met (found or skipped), by path: each is taken once, whatever
    /// roots lead to it.
    seen: HashSet<String>,
    out: Discovery,
}

impl Walk<'_> {
    /// A folder below a skill root that is not a skill: look for skill folders in it.
    fn folder(&mut self, path: &str, tree: &Tree, depth: usize) -> Result<()> {
        for entry in tree.entries() {
            if entry.kind != Kind::Tree || entry.name.starts_with('.') {
                continue;
            }
            let child_path = relpath::join(path, &entry.name);
            let child = self
                .budget
                .tree(self.store, &entry.digest)
                .map_err(|e| at_path(e, &child_path))?;
            if child.get("SKILL.md").is_some() {
                self.skill(&child_path, Some(entry.name.clone()), entry.digest)?;
            } else if self.recursive {
                if depth + 1 >= MAX_CATEGORY_DEPTH {
                    self.out.warnings.push(format!(
                        "`{child_path}` is nested deeper than {MAX_CATEGORY_DEPTH} category folders; not searched"
                    ));
                } else {
                    self.folder(&child_path, &child, depth + 1)?;
                }
            }
        }
        Ok(())
    }

    fn skill(&mut self, path: &str, folder_name: Option<String>, digest: Digest) -> Result<()> {
        if !self.seen.insert(path.to_owned()) {
            return Ok(());
        }
        let key = (digest, folder_name.clone());
        let parsed = {
            let cached = self
                .cache
                .parsed
                .lock()
                .expect("skill cache lock")
                .get(&key)
                .cloned();
            let stats = &crate::stats::STATS;
            match cached {
                Some(p) => {
                    crate::stats::Stats::add(&stats.skill_cache_hits, 1);
                    p
                }
                None => {
                    crate::stats::Stats::add(&stats.skill_cache_misses, 1);
                    let p = read_skill(self.store, folder_name.as_deref(), &digest);
                    if let Ok(info) = &p {
                        crate::stats::count_problems(&info.problems);
                    }
                    self.cache
                        .parsed
                        .lock()
                        .expect("skill cache lock")
                        .put(key, p.clone());
                    p
                }
            }
        };
        match parsed {
            Ok(info) => {
                let name = folder_name.or_else(|| info.meta.declared_name.clone());
                match name.as_deref().map(crate::skill::SkillName::new) {
                    Some(Ok(name)) => self.out.skills.push(Found {
                        name,
                        path: path.to_owned(),
                        info,
                    }),
                    Some(Err(reason)) => self
                        .out
                        .skipped
                        .push(Skipped::refused(path, &Error::invalid(reason))),
                    None => self.out.skipped.push(Skipped::refused(
                        path,
                        &Error::invalid(
                            "a skill at the toolkit's top needs a `name` in its front matter",
                        ),
                    )),
                }
            }
            Err(e) => self.out.skipped.push(Skipped::refused(path, &e)),
        }
        Ok(())
    }
}

/// `e` with the folder of the tree it was met at named (`details.path`); a path on the host
/// the error named (a full disk's file system) is kept as `details.host_path`.
fn at_path(mut e: Error, path: &str) -> Error {
    let mut details = match std::mem::take(&mut e.details) {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    if let Some(host) = details.insert("path".into(), path.into()) {
        details.insert("host_path".into(), host);
    }
    e.context(format_args!("`{path}`"))
        .with_details(details.into())
}

//! Finding the skills of a tree in the store, by the layout options of a toolkit spec.
//!
//! A skill is a folder holding a `SKILL.md`; its identity is its folder name. Skill roots are
//! searched for skill folders, one level down or (with `recursive`) through category folders
//! such as `skills/<bucket>/<name>/`. A skill's own subfolders are never searched: they are
//! its scripts and references. `include` and `exclude` take skill names or glob patterns.

use crate::relpath;
use crate::skill::{self, SkillMeta};
use crate::spec::{self, Problem, Validation};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Kind, Store, Tree, WalkBudget};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// How far category folders may nest below a skill root.
const MAX_CATEGORY_DEPTH: usize = 16;
/// Files larger than this are not scanned for links to sibling skills.
const MAX_SCANNED_FILE: u64 = 256 << 10;

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

/// What a skill folder holds, as far as resolution cares. A function of the folder's digest,
/// so it is computed once per distinct folder and shared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkillInfo {
    pub digest: Digest,
    pub meta: SkillMeta,
    pub warnings: Vec<String>,
    /// What the skill breaks of the Agent Skills specification ([`crate::spec`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
    /// Names `X` this skill's files point at as `../X/…`: links to sibling skills.
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub links: BTreeSet<String>,
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

/// A parsed skill folder, or why it was skipped.
type SkillRead = std::result::Result<Arc<SkillInfo>, Error>;

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
    let rules: BTreeSet<&str> = found
        .info
        .problems
        .iter()
        .map(|p| p.rule.as_str())
        .collect();
    crate::stats::Stats::add(&crate::stats::STATS.skills_refused, 1);
    Skipped {
        path: found.path.clone(),
        code: "SPEC_VIOLATION".into(),
        reason: format!(
            "breaks the Agent Skills specification ({}) and its toolkit refuses such skills",
            rules.into_iter().collect::<Vec<_>>().join(", ")
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

/// Reads and parses one skill folder. An error here skips the skill with its reason; only
/// store failures (a missing or corrupt object) are hard errors, and those are reported as a
/// skip too so one bad folder never hides the rest.
pub fn read_skill(store: &Store, folder_name: Option<&str>, digest: &Digest) -> SkillRead {
    // Every walk of the skill's folders below (its links, gathered and checked) counts
    // against one budget.
    let mut budget = WalkBudget::default();
    let tree = budget.tree(store, digest)?;
    let entry = tree
        .get(skill::SKILL_MD)
        .ok_or_else(|| Error::invalid("no SKILL.md"))?;
    if entry.kind == Kind::Tree || entry.kind == Kind::Symlink {
        return Err(Error::invalid("SKILL.md is not a regular file"));
    }
    let bytes = store
        .blob_up_to(&entry.digest, skill::MAX_SKILL_MD as u64)
        .map_err(|e| match e.code {
            Code::TooLarge => skill::too_large(entry.size),
            _ => e,
        })?;
    let folder = folder_name.unwrap_or_default();
    let parsed = skill::parse(folder, &bytes)?;
    let mut links = BTreeSet::new();
    collect_links(store, &tree, &mut links, &mut HashSet::new(), &mut budget)?;
    // Served at the top of a view whatever its place in the source: links that would lead
    // out of that view are dropped (the served tree is the one without them).
    let served_as = folder_name
        .map(str::to_owned)
        .or_else(|| parsed.meta.declared_name.clone())
        .unwrap_or_default();
    let (digest, dropped) = crate::links::contain(store, digest, &served_as, &mut budget)?;
    let mut warnings: Vec<String> = dropped
        .iter()
        .map(|path| {
            format!("the link {path} leads outside the skills it is served with; it is not served")
        })
        .collect();
    let mut all_checked = parsed.references_complete;
    let mut problems = parsed.problems;
    // Checked against the folder as it is served (links out of it dropped), with a budget of
    // their own: running out leaves the rest unchecked, never skips the skill.
    let mut folders = Folders::new(store, digest);
    for reference in &parsed.references {
        match folders.has(reference) {
            Ok(true) => {}
            Ok(false) => problems.push(Problem {
                rule: spec::Rule::ReferenceMissing,
                message: format!(
                    "SKILL.md links to `{}`, which is not in the skill",
                    reference.chars().take(200).collect::<String>()
                ),
            }),
            Err(e) if e.code == Code::TooLarge => {
                all_checked = false;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    if !all_checked {
        warnings.push(format!(
            "SKILL.md links to more files than are checked (at most {} links, {} files, within a walk's budget); those past the bound were not checked",
            spec::MAX_LINKS_LOOKED_AT,
            spec::MAX_REFERENCES
        ));
    }
    cap(&mut problems);
    Ok(Arc::new(SkillInfo {
        digest,
        meta: parsed.meta,
        warnings,
        problems,
        links,
    }))
}

/// Problems kept of one skill at most; past them, one problem says how many more.
const MAX_PROBLEMS: usize = 32;

/// Keeps at most [`MAX_PROBLEMS`] of a skill's problems, the first of every rule among them
/// (so every rule it breaks is still named), and says how many more there were.
fn cap(problems: &mut Vec<Problem>) {
    if problems.len() <= MAX_PROBLEMS {
        return;
    }
    let total = problems.len();
    let mut seen = BTreeSet::new();
    let (firsts, rest): (Vec<Problem>, Vec<Problem>) =
        problems.drain(..).partition(|p| seen.insert(p.rule));
    let room = (MAX_PROBLEMS - 1).saturating_sub(firsts.len());
    problems.extend(firsts);
    problems.extend(rest.into_iter().take(room));
    let last_rule = problems.last().map_or(spec::Rule::FieldUnknown, |p| p.rule);
    problems.push(Problem {
        rule: last_rule,
        message: format!("and {} more problems", total - problems.len()),
    });
}

/// A skill's folders, read once each (by digest) for the references of its SKILL.md.
struct Folders<'a> {
    store: &'a Store,
    root: Digest,
    read: HashMap<Digest, Tree>,
    budget: WalkBudget,
}

impl<'a> Folders<'a> {
    fn new(store: &'a Store, root: Digest) -> Self {
        Folders {
            store,
            root,
            read: HashMap::new(),
            budget: WalkBudget::default(),
        }
    }

    fn tree(&mut self, digest: Digest) -> Result<&Tree> {
        if !self.read.contains_key(&digest) {
            let tree = self.budget.tree(self.store, &digest)?;
            self.read.insert(digest, tree);
        }
        Ok(&self.read[&digest])
    }

    /// Whether the folder holds `path` (`/`-separated; `..` steps that stay inside it are
    /// followed, a step out of it is a sibling skill's, for the link rules; a link is taken
    /// as present).
    fn has(&mut self, path: &str) -> Result<bool> {
        let segments: Vec<&str> = path
            .split('/')
            .filter(|s| !s.is_empty() && *s != ".")
            .collect();
        let mut stack = vec![self.root];
        for (i, seg) in segments.iter().enumerate() {
            if *seg == ".." {
                if stack.len() == 1 {
                    return Ok(true);
                }
                stack.pop();
                continue;
            }
            let here = *stack.last().expect("the skill's folder stays");
            let Some(entry) = self.tree(here)?.get(seg).cloned() else {
                return Ok(false);
            };
            let last = i + 1 == segments.len();
            match entry.kind {
                Kind::Tree if !last => stack.push(entry.digest),
                Kind::Tree | Kind::Symlink => return Ok(true),
                _ => return Ok(last),
            }
        }
        Ok(true)
    }
}

/// Gathers the `X` of every `../X/` in the skill's text files and symlink targets. What a
/// folder or file holds depends on its digest alone, so each is read once (`seen`), however
/// many times the trees name it.
fn collect_links(
    store: &Store,
    tree: &Tree,
    links: &mut BTreeSet<String>,
    seen: &mut HashSet<Digest>,
    budget: &mut WalkBudget,
) -> Result<()> {
    for entry in tree.entries() {
        if !seen.insert(entry.digest) {
            continue;
        }
        match entry.kind {
            Kind::Tree => {
                let sub = budget.tree(store, &entry.digest)?;
                collect_links(store, &sub, links, seen, budget)?
            }
            _ if entry.size <= MAX_SCANNED_FILE => {
                let bytes = store.blob(&entry.digest)?;
                scan_links(&bytes, links);
            }
            _ => {}
        }
    }
    Ok(())
}

/// `e` with the folder of the tree it was met at named.
fn at_path(e: Error, path: &str) -> Error {
    let mut details = match e.details {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    details.insert("path".into(), path.into());
    Error::new(e.code, format!("`{path}`: {}", e.message)).with_details(details.into())
}

/// Finds `../NAME/` (NAME of letters, digits, `.`, `_`, `-`) in text; `../../` is not a sibling.
pub fn scan_links(bytes: &[u8], links: &mut BTreeSet<String>) {
    let mut i = 0;
    while let Some(pos) = find(&bytes[i..], b"../") {
        let start = i + pos + 3;
        let len = bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
            .count();
        let name = &bytes[start..start + len];
        // `../` inside a longer path (`../../x/`, `a/../x/`) is not a link to a sibling.
        let inside_path = (i + pos).checked_sub(1).is_some_and(|p| {
            bytes[p] == b'/' || bytes[p] == b'.' || bytes[p].is_ascii_alphanumeric()
        });
        if len > 0
            && !inside_path
            && name != b"."
            && name != b".."
            && bytes.get(start + len) == Some(&b'/')
        {
            links.insert(String::from_utf8_lossy(name).into_owned());
        }
        i = start;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sibling_link_names() {
        let mut links = BTreeSet::new();
        scan_links(
            b"See [x](../code-review/reviewer.md) and ../../up/no and ../plain and ../a_b.c/x",
            &mut links,
        );
        assert_eq!(
            links.into_iter().collect::<Vec<_>>(),
            ["a_b.c", "code-review"]
        );
    }

    #[test]
    fn a_capped_list_of_problems_still_names_every_rule() {
        let problem = |rule| Problem {
            rule,
            message: String::new(),
        };
        let mut problems: Vec<Problem> = (0..100)
            .map(|_| problem(spec::Rule::FieldUnknown))
            .chain([
                problem(spec::Rule::NameForm),
                problem(spec::Rule::ReferenceMissing),
            ])
            .collect();
        cap(&mut problems);
        assert_eq!(problems.len(), MAX_PROBLEMS);
        let rules: BTreeSet<_> = problems.iter().map(|p| p.rule).collect();
        assert!(
            rules.contains(&spec::Rule::NameForm) && rules.contains(&spec::Rule::ReferenceMissing)
        );
        assert_eq!(problems.last().unwrap().message, "and 71 more problems");
    }
}

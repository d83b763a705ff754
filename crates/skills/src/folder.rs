//! One skill folder read: its `SKILL.md` parsed (and held to the Agent Skills
//! specification), the files its `SKILL.md` links to checked against the folder as served,
//! and the sibling skills its files point at (`../X/`) gathered. A function of the folder's
//! digest and name, so discovery computes it once per distinct folder and shares it.

use crate::skill::{self, SkillMeta};
use crate::spec::{self, Problem};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Kind, Store, Tree, WalkBudget};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Files larger than this are not scanned for links to sibling skills.
const MAX_SCANNED_FILE: u64 = 256 << 10;

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

/// A parsed skill folder, or why it was skipped.
pub(crate) type SkillRead = std::result::Result<Arc<SkillInfo>, Error>;

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
            crate::references::MAX_LINKS_LOOKED_AT,
            crate::references::MAX_REFERENCES
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

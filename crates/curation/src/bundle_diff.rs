//! What moving from one bundle of a toolkit to another changes, skill by skill: the skills
//! added, removed, renamed (the same folder, or the same description, under another name) and
//! changed, each changed skill's files (added, removed, modified, made executable or not, with
//! their sizes), a unified diff of its `SKILL.md`, and what each breaks of the Agent Skills
//! specification before and after. Both bundles are read from the store; every part of the
//! answer is bounded (the walk's entries, the files listed, the diff's bytes and time).

use cloud_harness_error::Result;
use cloud_harness_skills::discovery::{Found, SkillCache};
use cloud_harness_skills::resolver::Tier;
use cloud_harness_skills::spec::Problem;
use cloud_harness_store::cas::{Digest, Kind, Store, WalkBudget};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The most file changes listed in one diff (the rest counted, not listed).
pub const MAX_FILES: usize = 2_000;
/// The longest `SKILL.md` diff kept, in bytes (cut at a line).
pub const MAX_TEXT_DIFF: usize = 64 * 1024;
/// The time one `SKILL.md` diff may take before it settles for a coarser answer.
const TEXT_DIFF_TIME: Duration = Duration::from_millis(200);

/// One side of a diff: a toolkit's commit and the bundle the store holds of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Side {
    pub commit: String,
    pub bundle: Digest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Added,
    Removed,
    Renamed,
    Changed,
}

/// One file of a changed skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileChange {
    pub path: String,
    /// `added`, `removed`, `modified` (other bytes), `mode` (the same bytes, made executable
    /// or not, or a link made a file).
    pub change: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_before: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_after: Option<u64>,
    pub executable_before: bool,
    pub executable_after: bool,
    /// A script: under `scripts/`, or executable on either side.
    pub script: bool,
}

/// A `SKILL.md` changed: its unified diff (three lines of context).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TextDiff {
    pub unified: String,
    /// Cut at [`MAX_TEXT_DIFF`].
    pub truncated: bool,
}

/// One skill the move changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkillChange {
    /// Its name after the move (before it, for a removed skill).
    pub name: String,
    pub change: Change,
    /// A renamed skill's name before the move.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest_before: Option<Digest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest_after: Option<Digest>,
    /// Every file that differs (of an added or removed skill: none; its folder is one).
    pub files: Vec<FileChange>,
    /// How many of `files` are scripts.
    pub scripts_changed: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skill_md: Option<TextDiff>,
    pub problems_before: Vec<Problem>,
    pub problems_after: Vec<Problem>,
}

/// What a move from `from` to `to` changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleDiff {
    pub from: Side,
    pub to: Side,
    /// In name order: added, removed, renamed and changed skills alike.
    pub skills: Vec<SkillChange>,
    pub unchanged: usize,
    /// Skills that break the specification, before and after.
    pub problems_before: usize,
    pub problems_after: usize,
    /// File changes left out past [`MAX_FILES`].
    pub files_left_out: usize,
}

/// The skills of a bundle, by name.
fn skills_of(
    store: &Store,
    cache: &SkillCache,
    instance_id: &str,
    url: &str,
    side: &Side,
) -> Result<BTreeMap<String, Found>> {
    let source = cloud_harness_provision::bundle_source(
        store,
        cache,
        Tier::Owner,
        instance_id,
        url,
        &side.commit,
        side.bundle,
        // Every skill, problems and all: the diff says what each breaks.
        Default::default(),
    )?;
    Ok(source
        .discovery
        .skills
        .into_iter()
        .map(|f| (f.name.as_str().to_owned(), f))
        .collect())
}

/// The diff of two bundles of the toolkit `instance_id` (its repository `url`).
pub fn diff(
    store: &Store,
    instance_id: &str,
    url: &str,
    from: Side,
    to: Side,
) -> Result<BundleDiff> {
    let cache = SkillCache::default();
    let before = skills_of(store, &cache, instance_id, url, &from)?;
    let after = skills_of(store, &cache, instance_id, url, &to)?;
    let mut walk = Walk {
        store,
        budget: WalkBudget::default(),
        listed: 0,
        left_out: 0,
    };
    let mut removed: Vec<&Found> = before
        .iter()
        .filter(|(n, _)| !after.contains_key(*n))
        .map(|(_, f)| f)
        .collect();
    let mut skills = Vec::new();
    let mut unchanged = 0;
    for (name, a) in &after {
        match before.get(name) {
            Some(b) if b.info.digest == a.info.digest => unchanged += 1,
            Some(b) => skills.push(walk.changed(Change::Changed, b, a)?),
            None => match renamed_from(&mut removed, a) {
                Some(b) => skills.push(walk.changed(Change::Renamed, b, a)?),
                None => skills.push(whole(Change::Added, a, false)),
            },
        }
    }
    skills.extend(removed.into_iter().map(|b| whole(Change::Removed, b, true)));
    skills.sort_by(|x, y| x.name.cmp(&y.name));
    let broken =
        |m: &BTreeMap<String, Found>| m.values().filter(|f| !f.info.problems.is_empty()).count();
    Ok(BundleDiff {
        problems_before: broken(&before),
        problems_after: broken(&after),
        from,
        to,
        skills,
        unchanged,
        files_left_out: walk.left_out,
    })
}

/// The removed skill `added` is a rename of: the same folder, else the same description.
fn renamed_from<'a>(removed: &mut Vec<&'a Found>, added: &Found) -> Option<&'a Found> {
    let at = removed
        .iter()
        .position(|b| b.info.digest == added.info.digest)
        .or_else(|| {
            let d = &added.info.meta.description;
            removed
                .iter()
                .position(|b| !d.is_empty() && b.info.meta.description == *d)
        })?;
    Some(removed.remove(at))
}

/// A skill added or removed whole.
fn whole(change: Change, f: &Found, before: bool) -> SkillChange {
    let (digest_before, digest_after, problems_before, problems_after) = if before {
        (
            Some(f.info.digest),
            None,
            f.info.problems.clone(),
            Vec::new(),
        )
    } else {
        (
            None,
            Some(f.info.digest),
            Vec::new(),
            f.info.problems.clone(),
        )
    };
    SkillChange {
        name: f.name.as_str().to_owned(),
        change,
        renamed_from: None,
        digest_before,
        digest_after,
        files: Vec::new(),
        scripts_changed: 0,
        skill_md: None,
        problems_before,
        problems_after,
    }
}

/// A file of a folder: its kind, size and digest.
type Listing = BTreeMap<String, (Kind, u64, Digest)>;

struct Walk<'a> {
    store: &'a Store,
    budget: WalkBudget,
    /// File changes listed so far, and left out past [`MAX_FILES`].
    listed: usize,
    left_out: usize,
}

impl Walk<'_> {
    /// Every file of the folder `digest`, by path.
    fn files(&mut self, digest: &Digest) -> Result<Listing> {
        let mut out = Listing::new();
        let mut pending = vec![(String::new(), *digest)];
        while let Some((dir, tree)) = pending.pop() {
            for e in self.budget.tree(self.store, &tree)?.entries() {
                let path = cloud_harness_skills::relpath::join(&dir, &e.name);
                match e.kind {
                    Kind::Tree => pending.push((path, e.digest)),
                    kind => {
                        out.insert(path, (kind, e.size, e.digest));
                    }
                }
            }
        }
        Ok(out)
    }

    fn changed(&mut self, change: Change, b: &Found, a: &Found) -> Result<SkillChange> {
        let (old, new) = (self.files(&b.info.digest)?, self.files(&a.info.digest)?);
        let mut files = Vec::new();
        let mut paths: Vec<&String> = old.keys().chain(new.keys()).collect();
        paths.sort();
        paths.dedup();
        for path in paths {
            let (o, n) = (old.get(path), new.get(path));
            let what = match (o, n) {
                (None, Some(_)) => "added",
                (Some(_), None) => "removed",
                (Some(o), Some(n)) if o.2 != n.2 => "modified",
                (Some(o), Some(n)) if o.0 != n.0 => "mode",
                _ => continue,
            };
            if self.listed >= MAX_FILES {
                self.left_out += 1;
                continue;
            }
            self.listed += 1;
            let exec = |f: Option<&(Kind, u64, Digest)>| f.is_some_and(|f| f.0 == Kind::Executable);
            files.push(FileChange {
                path: path.clone(),
                change: what,
                size_before: o.map(|f| f.1),
                size_after: n.map(|f| f.1),
                executable_before: exec(o),
                executable_after: exec(n),
                script: path.starts_with("scripts/") || exec(o) || exec(n),
            });
        }
        let skill_md = match (old.get("SKILL.md"), new.get("SKILL.md")) {
            (Some(o), Some(n)) if o.2 != n.2 => Some(self.text_diff(&o.2, &n.2)?),
            _ => None,
        };
        Ok(SkillChange {
            name: a.name.as_str().to_owned(),
            change,
            renamed_from: (change == Change::Renamed).then(|| b.name.as_str().to_owned()),
            digest_before: Some(b.info.digest),
            digest_after: Some(a.info.digest),
            scripts_changed: files.iter().filter(|f| f.script).count(),
            files,
            skill_md,
            problems_before: b.info.problems.clone(),
            problems_after: a.info.problems.clone(),
        })
    }

    fn text_diff(&self, old: &Digest, new: &Digest) -> Result<TextDiff> {
        let limit = cloud_harness_skills::skill::MAX_SKILL_MD as u64;
        let text = |d: &Digest| -> Result<String> {
            Ok(String::from_utf8_lossy(&self.store.blob_up_to(d, limit)?).into_owned())
        };
        let (old, new) = (text(old)?, text(new)?);
        Ok(unified(&old, &new))
    }
}

/// The unified diff of two texts (`a/SKILL.md` to `b/SKILL.md`), cut at [`MAX_TEXT_DIFF`].
pub fn unified(old: &str, new: &str) -> TextDiff {
    let diff = similar::TextDiff::configure()
        .deadline(Instant::now() + TEXT_DIFF_TIME)
        .diff_lines(old, new);
    let mut unified = String::from("--- a/SKILL.md\n+++ b/SKILL.md\n");
    let mut truncated = false;
    'hunks: for hunk in diff.unified_diff().context_radius(3).iter_hunks() {
        for line in hunk.to_string().split_inclusive('\n') {
            if unified.len() + line.len() > MAX_TEXT_DIFF {
                truncated = true;
                break 'hunks;
            }
            unified.push_str(line);
        }
    }
    TextDiff { unified, truncated }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unified_diff_has_its_context_and_is_cut_at_a_line() {
        let d = unified("a\nb\nc\n", "a\nB\nc\n");
        assert_eq!(
            d.unified,
            "--- a/SKILL.md\n+++ b/SKILL.md\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
        );
        assert!(!d.truncated);
        let old: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        let new: String = (0..20_000).map(|i| format!("LINE {i}\n")).collect();
        let d = unified(&old, &new);
        assert!(d.truncated && d.unified.len() <= MAX_TEXT_DIFF && d.unified.ends_with('\n'));
    }
}

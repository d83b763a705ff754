//! What moving from one bundle of a toolkit to another changes, skill by skill: the skills
//! added, removed, renamed (the same folder, or the same description, under another name) and
//! changed, each changed skill's files (added, removed, modified, made executable or not, with
//! their sizes), a unified diff of its `SKILL.md`, and what each breaks of the Agent Skills
//! specification before and after. An added or removed skill lists its files too (its
//! scripts above all). Both bundles are read from the store; every part of the answer is
//! bounded: the walk's entries, the files listed, and the text diffs' bytes and time, each
//! `SKILL.md`'s and the whole answer's.

use cloud_harness_error::Result;
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::folder::SkillInfo;
use cloud_harness_skills::resolver::Tier;
use cloud_harness_skills::spec::Problem;
use cloud_harness_store::cas::{Digest, Kind, Store, WalkBudget};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most file changes listed in one diff (the rest counted per skill, not listed; a
/// skill's scripts are listed before its other files).
pub const MAX_FILES: usize = 2_000;
/// The most scripts listed in one diff, apart from the other files: no number of other
/// files changed can push a script out of the list.
pub const MAX_SCRIPTS: usize = 2_000;
/// The longest `SKILL.md` diff kept, in bytes (cut at a line).
pub const MAX_TEXT_DIFF: usize = 64 * 1024;
/// The time one `SKILL.md` diff may take before it settles for a coarser answer.
const TEXT_DIFF_TIME: Duration = Duration::from_millis(200);
/// What all of a diff's `SKILL.md` diffs may take together, in bytes and time: past either,
/// the rest are left out (counted).
pub const MAX_TEXT_DIFFS: usize = 1024 * 1024;
const TEXT_DIFFS_TIME: Duration = Duration::from_secs(2);

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
    /// `added`, `removed`, `modified` (other bytes), `mode` (the same bytes, another kind:
    /// made executable or not).
    pub change: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_before: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_after: Option<u64>,
    /// `file`, `executable` or `symlink` (its bytes are the link's target); none where the
    /// file is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind_before: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind_after: Option<&'static str>,
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
    /// Every file that differs (of an added or removed skill: all of its files), scripts
    /// first.
    pub files: Vec<FileChange>,
    /// How many of the files that differ are scripts (listed or not).
    pub scripts_changed: usize,
    /// Files that differ past [`MAX_FILES`] (or scripts past [`MAX_SCRIPTS`]), not listed.
    pub files_left_out: usize,
    /// Its `SKILL.md` changed, but its diff was left out past [`MAX_TEXT_DIFFS`].
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skill_md_left_out: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skill_md: Option<TextDiff>,
    pub problems_before: Vec<Problem>,
    pub problems_after: Vec<Problem>,
}

/// What a move from `from` to `to` changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BundleDiff {
    pub from: Side,
    pub to: Side,
    #[serde(flatten)]
    pub changes: Changes,
}

/// Skills served by name: a bundle's, or a set's.
pub type Skills = BTreeMap<String, Arc<SkillInfo>>;

/// What serving `after` in place of `before` changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Changes {
    /// In name order: added, removed, renamed and changed skills alike.
    pub skills: Vec<SkillChange>,
    pub unchanged: usize,
    /// Skills that break the specification, before and after.
    pub problems_before: usize,
    pub problems_after: usize,
    /// File changes left out past [`MAX_FILES`].
    pub files_left_out: usize,
    /// `SKILL.md` diffs left out past [`MAX_TEXT_DIFFS`] (their files still listed).
    pub text_diffs_left_out: usize,
}

/// The skills of a bundle, by name.
fn skills_of(
    store: &Store,
    cache: &SkillCache,
    instance_id: &str,
    url: &str,
    side: &Side,
) -> Result<Skills> {
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
        .map(|f| (f.name.as_str().to_owned(), f.info))
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
    Ok(BundleDiff {
        from,
        to,
        changes: compare(store, &before, &after)?,
    })
}

/// What serving `after` in place of `before` changes, skill by skill (their folders read from
/// `store`).
pub fn compare(store: &Store, before: &Skills, after: &Skills) -> Result<Changes> {
    let mut walk = Walk {
        store,
        budget: WalkBudget::default(),
        listed: 0,
        scripts_listed: 0,
        left_out: 0,
        text_bytes: 0,
        text_until: Instant::now() + TEXT_DIFFS_TIME,
        texts_left_out: 0,
    };
    let only = |a: &'_ Skills, b: &'_ Skills| -> Vec<(String, Arc<SkillInfo>)> {
        a.iter()
            .filter(|(n, _)| !b.contains_key(*n))
            .map(|(n, i)| (n.clone(), i.clone()))
            .collect()
    };
    let (added, removed) = (only(after, before), only(before, after));
    let renames = renames(&removed, &added);
    let mut skills = Vec::new();
    let mut unchanged = 0;
    // Changed and renamed skills first: they have the budget of text diffs before the added
    // and removed ones, whose SKILL.md is diffed against nothing.
    let mut whole = Vec::new();
    for (name, a) in after {
        match before.get(name) {
            Some(b) if b.digest == a.digest => unchanged += 1,
            Some(b) => skills.push(walk.changed(Change::Changed, (name, b), (name, a))?),
            None => match renames.get(name) {
                Some((from, b)) => {
                    skills.push(walk.changed(Change::Renamed, (from, b), (name, a))?)
                }
                None => whole.push((Change::Added, name, a)),
            },
        }
    }
    let renamed: std::collections::HashSet<&String> = renames.values().map(|(n, _)| n).collect();
    for (name, b) in removed.iter().filter(|(n, _)| !renamed.contains(n)) {
        whole.push((Change::Removed, name, b));
    }
    for (change, name, info) in whole {
        skills.push(walk.whole(change, name, info)?);
    }
    skills.sort_by(|x, y| x.name.cmp(&y.name));
    let broken = |m: &Skills| m.values().filter(|i| !i.problems.is_empty()).count();
    Ok(Changes {
        problems_before: broken(before),
        problems_after: broken(after),
        skills,
        unchanged,
        files_left_out: walk.left_out,
        text_diffs_left_out: walk.texts_left_out,
    })
}

/// Which removed skill each added one is a rename of: the same folder first (each removed
/// folder taken once), then the same description where no other removed or added skill left
/// has it. Hashed: linear in the skills, whatever their order.
fn renames(
    removed: &[(String, Arc<SkillInfo>)],
    added: &[(String, Arc<SkillInfo>)],
) -> HashMap<String, (String, Arc<SkillInfo>)> {
    let mut out: HashMap<String, (String, Arc<SkillInfo>)> = HashMap::new();
    let mut by_digest: HashMap<Digest, Vec<&(String, Arc<SkillInfo>)>> = HashMap::new();
    for r in removed.iter().rev() {
        by_digest.entry(r.1.digest).or_default().push(r);
    }
    for (name, info) in added {
        if let Some(r) = by_digest.get_mut(&info.digest).and_then(Vec::pop) {
            out.insert(name.clone(), r.clone());
        }
    }
    let taken: std::collections::HashSet<&String> = out.values().map(|(n, _)| n).collect();
    // A description to the one skill of a side left that has it (None: more than one).
    let unique = |side: &[(String, Arc<SkillInfo>)], left: &dyn Fn(&String) -> bool| {
        let mut seen: HashMap<String, Option<(String, Arc<SkillInfo>)>> = HashMap::new();
        for (n, i) in side.iter().filter(|(n, _)| left(n)) {
            let d = &i.meta.description;
            if !d.is_empty() {
                seen.entry(d.clone())
                    .and_modify(|v| *v = None)
                    .or_insert_with(|| Some((n.clone(), i.clone())));
            }
        }
        seen
    };
    let old = unique(removed, &|n| !taken.contains(n));
    let new = unique(added, &|n| !out.contains_key(n));
    for (d, a) in new {
        if let (Some((name, _)), Some(Some(r))) = (a, old.get(&d)) {
            out.insert(name, r.clone());
        }
    }
    out
}

fn kind(k: Kind) -> &'static str {
    match k {
        Kind::Executable => "executable",
        Kind::Symlink => "symlink",
        Kind::File | Kind::Tree => "file",
    }
}

/// A file of a folder: its kind, size and digest.
type Listing = BTreeMap<String, (Kind, u64, Digest)>;

struct Walk<'a> {
    store: &'a Store,
    budget: WalkBudget,
    /// Other files' changes and scripts' listed so far, and changes left out past
    /// [`MAX_FILES`] and [`MAX_SCRIPTS`].
    listed: usize,
    scripts_listed: usize,
    left_out: usize,
    /// The text diffs' bytes so far, when they must end, and how many were left out.
    text_bytes: usize,
    text_until: Instant,
    texts_left_out: usize,
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

    /// A skill renamed or changed: every file that differs, its `SKILL.md` diffed.
    fn changed(
        &mut self,
        change: Change,
        (b_name, b): (&String, &SkillInfo),
        (a_name, a): (&String, &SkillInfo),
    ) -> Result<SkillChange> {
        let (old, new) = (self.files(&b.digest)?, self.files(&a.digest)?);
        let (files, scripts_changed, files_left_out) = self.list(&old, &new);
        let texts_left_out = self.texts_left_out;
        let skill_md = match (old.get("SKILL.md"), new.get("SKILL.md")) {
            (Some(o), Some(n)) if o.2 != n.2 => self.text_diff(Some(&o.2), Some(&n.2))?,
            _ => None,
        };
        let skill_md_left_out = self.texts_left_out > texts_left_out;
        Ok(SkillChange {
            name: a_name.clone(),
            change,
            renamed_from: (change == Change::Renamed).then(|| b_name.clone()),
            digest_before: Some(b.digest),
            digest_after: Some(a.digest),
            files,
            scripts_changed,
            files_left_out,
            skill_md,
            skill_md_left_out,
            problems_before: b.problems.clone(),
            problems_after: a.problems.clone(),
        })
    }

    /// A skill added or removed whole: its files, each added or removed, and its `SKILL.md`
    /// against nothing.
    fn whole(&mut self, change: Change, name: &str, info: &SkillInfo) -> Result<SkillChange> {
        let these = self.files(&info.digest)?;
        let none = Listing::new();
        let added = change == Change::Added;
        let (old, new) = if added {
            (&none, &these)
        } else {
            (&these, &none)
        };
        let (files, scripts_changed, files_left_out) = self.list(old, new);
        let md = these.get("SKILL.md").map(|f| &f.2);
        let texts_left_out = self.texts_left_out;
        let skill_md = if added {
            self.text_diff(None, md)?
        } else {
            self.text_diff(md, None)?
        };
        let skill_md_left_out = self.texts_left_out > texts_left_out;
        let (before, after) = if added {
            (None, Some(info))
        } else {
            (Some(info), None)
        };
        Ok(SkillChange {
            name: name.to_owned(),
            change,
            renamed_from: None,
            digest_before: before.map(|i| i.digest),
            digest_after: after.map(|i| i.digest),
            files,
            scripts_changed,
            files_left_out,
            skill_md,
            skill_md_left_out,
            problems_before: before.map(|i| i.problems.clone()).unwrap_or_default(),
            problems_after: after.map(|i| i.problems.clone()).unwrap_or_default(),
        })
    }

    /// The files that differ between two listings, scripts first, as many as the diff's
    /// [`MAX_FILES`] leaves; how many are scripts, and how many were left out.
    fn list(&mut self, old: &Listing, new: &Listing) -> (Vec<FileChange>, usize, usize) {
        let exec = |f: Option<&(Kind, u64, Digest)>| f.is_some_and(|f| f.0 == Kind::Executable);
        let mut paths: Vec<&String> = old.keys().chain(new.keys()).collect();
        paths.sort();
        paths.dedup();
        let mut all: Vec<FileChange> = paths
            .into_iter()
            .filter_map(|path| {
                let (o, n) = (old.get(path), new.get(path));
                let what = match (o, n) {
                    (None, Some(_)) => "added",
                    (Some(_), None) => "removed",
                    (Some(o), Some(n)) if o.2 != n.2 => "modified",
                    (Some(o), Some(n)) if o.0 != n.0 => "mode",
                    _ => return None,
                };
                Some(FileChange {
                    path: path.clone(),
                    change: what,
                    size_before: o.map(|f| f.1),
                    size_after: n.map(|f| f.1),
                    kind_before: o.map(|f| kind(f.0)),
                    kind_after: n.map(|f| kind(f.0)),
                    script: path.starts_with("scripts/") || exec(o) || exec(n),
                })
            })
            .collect();
        // Scripts first (stable: in path order within each kind), each kind within its own
        // room: other files cannot push a script out of the list.
        let (mut scripts, mut others): (Vec<FileChange>, Vec<FileChange>) =
            all.drain(..).partition(|f| f.script);
        let count = scripts.len();
        let left_out = scripts
            .len()
            .saturating_sub(MAX_SCRIPTS - self.scripts_listed)
            + others.len().saturating_sub(MAX_FILES - self.listed);
        scripts.truncate(MAX_SCRIPTS - self.scripts_listed);
        others.truncate(MAX_FILES - self.listed);
        self.scripts_listed += scripts.len();
        self.listed += others.len();
        self.left_out += left_out;
        scripts.append(&mut others);
        (scripts, count, left_out)
    }

    /// The diff of two `SKILL.md`s (none: empty), within the diff's budget of text diffs.
    fn text_diff(
        &mut self,
        old: Option<&Digest>,
        new: Option<&Digest>,
    ) -> Result<Option<TextDiff>> {
        if self.text_bytes >= MAX_TEXT_DIFFS || Instant::now() >= self.text_until {
            self.texts_left_out += 1;
            return Ok(None);
        }
        let limit = cloud_harness_skills::skill::MAX_SKILL_MD as u64;
        let text = |d: Option<&Digest>| -> Result<String> {
            match d {
                Some(d) => {
                    Ok(String::from_utf8_lossy(&self.store.blob_up_to(d, limit)?).into_owned())
                }
                None => Ok(String::new()),
            }
        };
        let (old, new) = (text(old)?, text(new)?);
        let d = unified(
            &old,
            &new,
            MAX_TEXT_DIFF.min(MAX_TEXT_DIFFS - self.text_bytes),
        );
        self.text_bytes += d.unified.len();
        Ok(Some(d))
    }
}

/// The unified diff of two texts (`a/SKILL.md` to `b/SKILL.md`), cut at `cap` bytes (at
/// a line, or within the first line that does not fit: a cut hunk's header counts what it
/// had before the cut).
pub fn unified(old: &str, new: &str, cap: usize) -> TextDiff {
    let diff = similar::TextDiff::configure()
        .deadline(Instant::now() + TEXT_DIFF_TIME)
        .diff_lines(old, new);
    let mut unified = String::from("--- a/SKILL.md\n+++ b/SKILL.md\n");
    let mut truncated = false;
    'hunks: for hunk in diff.unified_diff().context_radius(3).iter_hunks() {
        for line in hunk.to_string().split_inclusive('\n') {
            if unified.len() + line.len() > cap {
                // What fits of the line that does not, then the cut.
                let mut end = cap.saturating_sub(unified.len() + 1).min(line.len());
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                if end > 0 {
                    unified.push_str(&line[..end]);
                    unified.push('\n');
                }
                truncated = true;
                break 'hunks;
            }
            unified.push_str(line);
        }
    }
    TextDiff { unified, truncated }
}

#[cfg(test)]
mod tests;

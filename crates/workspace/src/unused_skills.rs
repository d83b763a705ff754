//! The library's skills no workspace used over the last days: what an operator curating
//! skills can drop. A skill is named as a use names it (its toolkit's repository, else the
//! toolkit's name), so each is one row however many bundles of its toolkit the store holds.

use crate::library::Library;
use cloud_harness_control::skill_usage::{self as skill_usage, report};
use cloud_harness_control::state::Db;
use cloud_harness_error::Result;
use cloud_harness_store::cas::Store;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};

/// A skill of the library not used since the period began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unused {
    /// As a use names it: the repository's URL, else the toolkit's name.
    pub toolkit: String,
    pub skill: String,
    /// The toolkit's name in the store (`cloud-harness` for the built-in tier).
    pub name: String,
    /// The newest commit of the store holding the skill (none for the built-in tier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Its last use, if an older one is still kept (milliseconds since the Unix epoch).
    pub last_used: Option<i64>,
}

/// The library's skills (of `toolkit` alone if named) not used since `since`
/// (`YYYY-MM-DD`), in (toolkit, skill) order after `after`, at most `limit`. One query per
/// toolkit walked (which of its skills were used), one per skill listed (its last use); the
/// walk stops once the page is full.
pub fn unused(
    library: &Library,
    store: &Store,
    db: &Db,
    since: &str,
    toolkit: Option<&str>,
    after: Option<(&str, &str)>,
    limit: usize,
) -> Result<Vec<Unused>> {
    // Newest bundle first: the first commit seen of a skill is its newest.
    let mut candidates: BTreeMap<(String, String), (String, Option<String>)> = BTreeMap::new();
    for bundle in library.all(store)? {
        for s in bundle.iter() {
            // As a use records them (a long URL is cut).
            let key = skill_usage::field(s.url.as_deref().unwrap_or(&s.toolkit)).to_owned();
            let name = skill_usage::field(&s.name).to_owned();
            if toolkit.is_some_and(|t| t != key)
                || after.is_some_and(|(t, k)| (key.as_str(), name.as_str()) <= (t, k))
            {
                continue;
            }
            candidates
                .entry((key, name))
                .or_insert_with(|| (s.toolkit.clone(), s.commit.clone()));
        }
    }
    let mut out = Vec::new();
    let mut used: Option<(String, HashSet<String>)> = None;
    for ((key, skill), (name, commit)) in candidates {
        if out.len() >= limit {
            break;
        }
        if used.as_ref().is_none_or(|(t, _)| *t != key) {
            used = Some((key.clone(), report::used_since(db, &key, since)?));
        }
        if used.as_ref().is_some_and(|(_, u)| u.contains(&skill)) {
            continue;
        }
        out.push(Unused {
            last_used: report::last_use(db, &key, &skill)?,
            toolkit: key,
            skill,
            name,
            commit,
        });
    }
    Ok(out)
}

/// A page of [`unused`] over `period` after the cursor `after`, of `limit` (1 to
/// [`report::MAX_PAGE`], 100 if not said), and the next page's cursor: what the API and the
/// CLI answer.
pub fn page(
    library: &Library,
    store: &Store,
    db: &Db,
    period: &report::Period,
    toolkit: Option<&str>,
    after: Option<&str>,
    limit: Option<usize>,
) -> Result<(Vec<Unused>, Option<String>)> {
    let limit = report::page_size(limit)?;
    let after = after.map(report::cursor_value).transpose()?;
    let after = after.as_ref().map(|(t, s)| (t.as_str(), s.as_str()));
    let found = unused(library, store, db, &period.since, toolkit, after, limit + 1)?;
    Ok(report::paged(found, limit, |s| (&s.toolkit, &s.skill)))
}

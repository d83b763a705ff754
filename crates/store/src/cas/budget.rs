//! The entry budget of a walk over trees in the store. A tree names its subtrees by digest,
//! so a few small trees can stand for a vast one: a tree of 65,536 entries all naming a second
//! such tree, and so on, is a handful of objects but 65,536^k paths. Every producer counts
//! what it lets in by path (staging, an import, a download from the store of record), and a
//! walk that follows paths (discovery, a skill's links, a skill's file listing) also counts
//! the entries it lists, so that a tree that got in some other way cannot hang it.

use super::digest::Digest;
use super::store::Store;
use super::tree::Tree;
use cloud_harness_error::{Error, Result};

/// The most entries one walk over stored trees lists: several times what any producer lets
/// a tree hold counted by path (an import's 200,000 files, a toolkit's files and folders at
/// `CLOUD_HARNESS_MAX_FILES` each), and about a second of work.
pub const MAX_WALK_ENTRIES: u64 = 1 << 20;

/// Entries listed so far by one walk, against its limit.
#[derive(Debug, Clone)]
pub struct WalkBudget {
    listed: u64,
    limit: u64,
}

impl Default for WalkBudget {
    fn default() -> Self {
        WalkBudget::with_limit(MAX_WALK_ENTRIES)
    }
}

impl WalkBudget {
    pub fn with_limit(limit: u64) -> WalkBudget {
        WalkBudget { listed: 0, limit }
    }

    /// The tree `digest` read from `store`, its entries (and itself) counted.
    pub fn tree(&mut self, store: &Store, digest: &Digest) -> Result<Tree> {
        let tree = store.tree(digest)?;
        self.count(tree.entries().len() as u64 + 1)?;
        Ok(tree)
    }

    /// `n` entries more; past the limit, a TOO_LARGE error naming it.
    pub fn count(&mut self, n: u64) -> Result<()> {
        self.listed = self.listed.saturating_add(n);
        if self.listed > self.limit {
            return Err(Error::too_large(format!(
                "a walk over its folders listed more than {} entries (the bound on a walk over stored trees: folders named over and over?); it stopped there",
                self.limit
            ))
            .with_details(serde_json::json!({ "bound": "walk_entries", "limit": self.limit })));
        }
        Ok(())
    }

    /// Entries listed so far.
    pub fn listed(&self) -> u64 {
        self.listed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cas::{Entry, Kind};

    #[test]
    fn a_walk_past_its_budget_is_refused_naming_the_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let mut w = store.writer().unwrap();
        let blob = w.put_blob(b"x").unwrap();
        let entries = (0..10)
            .map(|i| Entry {
                name: format!("f{i}"),
                kind: Kind::File,
                size: 1,
                digest: blob,
            })
            .collect();
        let tree = w.put_tree(&Tree::new(entries).unwrap()).unwrap();
        w.commit().unwrap();
        let mut budget = WalkBudget::with_limit(25);
        budget.tree(&store, &tree).unwrap();
        budget.tree(&store, &tree).unwrap();
        assert_eq!(budget.listed(), 22);
        let e = budget.tree(&store, &tree).unwrap_err();
        assert_eq!(e.code, cloud_harness_error::Code::TooLarge);
        assert_eq!(e.details["limit"], 25);
    }
}

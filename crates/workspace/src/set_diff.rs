//! What a set's new revision changes: a workspace of each revision previewed (its members
//! acquired, its tiers resolved as an open resolves them, the set's overrides and validation
//! applied), then the skills each serves compared as a pin's move is; and the open workspaces
//! of the set still serving the older revision.

use crate::Workspaces;
use cloud_harness_curation::bundle_diff::{self, Changes, Skills};
use cloud_harness_curation::sets;
use cloud_harness_error::{Code, Error, Result};
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SetDiff {
    pub id: String,
    pub from: i64,
    pub to: i64,
    #[serde(flatten)]
    pub changes: Changes,
    /// The open workspaces opened on the set at `from`, with their owners.
    pub serving_from: Vec<Value>,
    /// The skill names two sources of one tier define, unsettled: opens of that revision are
    /// refused until an override settles them (not counted as removed above).
    pub conflicts_before: Vec<String>,
    pub conflicts_after: Vec<String>,
}

impl Workspaces {
    /// What a workspace of the set `id` at revision `to` serves that one at `from` does not
    /// (the revision before `to` unless named; `to` the latest unless named).
    pub fn set_diff(
        &self,
        id: &str,
        from: Option<i64>,
        to: Option<i64>,
        actor: &str,
    ) -> Result<SetDiff> {
        for (field, r) in [("from", from), ("to", to)] {
            if r.is_some_and(|r| r < 1) {
                return Err(Error::field(
                    Code::InvalidArgument,
                    field,
                    "a revision is 1 or more",
                ));
            }
        }
        let new = sets::get(&self.db, id, to)?;
        let from = match from {
            Some(r) => r,
            None if new.revision > 1 => new.revision - 1,
            None => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "from",
                    "revision 1 has none before it to compare with: name `from`",
                ))
            }
        };
        let old = sets::get(&self.db, id, Some(from))?;
        // The skills a workspace of the revision serves, and the names in conflict.
        let served = |r: &sets::Revision| -> Result<(Skills, Vec<String>)> {
            let preview = self.preview(&r.members, Some(id), r.validation, actor)?;
            let skills = preview
                .index
                .winners()
                .map(|c| (c.name.clone(), c.info.clone()))
                .collect();
            let conflicts = preview.index.conflicts().map(|c| c.name.clone()).collect();
            Ok((skills, conflicts))
        };
        let ((before, conflicts_before), (after, conflicts_after)) = (served(&old)?, served(&new)?);
        // A name in conflict on one side is neither added nor removed by the diff.
        let keep = |m: Skills, other: &[String]| -> Skills {
            m.into_iter().filter(|(n, _)| !other.contains(n)).collect()
        };
        let (before, after) = (
            keep(before, &conflicts_after),
            keep(after, &conflicts_before),
        );
        let changes = bundle_diff::compare(self.store(), &before, &after)?;
        let serving_from = self.serving_set(id, old.revision);
        Ok(SetDiff {
            id: id.to_owned(),
            from: old.revision,
            to: new.revision,
            changes,
            serving_from,
            conflicts_before,
            conflicts_after,
        })
    }
}

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
        let new = sets::get(&self.db, id, to)?;
        let from = match from {
            Some(r) => r,
            None if new.revision > 1 => new.revision - 1,
            None => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "from",
                    "the set has one revision: there is nothing before it to compare with",
                ))
            }
        };
        let old = sets::get(&self.db, id, Some(from))?;
        let served = |r: &sets::Revision| -> Result<Skills> {
            let preview = self.preview(&r.members, Some(id), r.validation, actor)?;
            Ok(preview
                .index
                .winners()
                .map(|c| (c.name.clone(), c.info.clone()))
                .collect())
        };
        let changes = bundle_diff::compare(self.store(), &served(&old)?, &served(&new)?)?;
        let serving_from = self.serving_set(id, old.revision);
        Ok(SetDiff {
            id: id.to_owned(),
            from: old.revision,
            to: new.revision,
            changes,
            serving_from,
        })
    }
}

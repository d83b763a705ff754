//! Which open workspaces (paused ones too) serve what a change would replace: a registry
//! entry at a commit, or a revision of a set. Read from each workspace's record of its open:
//! what it was opened on, whatever tier its toolkits went to.

use crate::Workspaces;
use serde_json::{json, Value};

impl Workspaces {
    /// The open workspaces with a toolkit of the registry entry `id` at `commit`, with their
    /// owners.
    pub fn serving_preset(&self, id: &str, commit: &str) -> Vec<Value> {
        self.serving(|t| t["preset"] == id && t["commit"] == commit)
    }

    /// The open workspaces with a toolkit from revision `revision` of the set `id`, with
    /// their owners.
    pub fn serving_set(&self, id: &str, revision: i64) -> Vec<Value> {
        self.serving(|t| t["set"]["id"] == id && t["set"]["revision"] == revision)
    }

    fn serving(&self, opened_on: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.open_workspaces()
            .iter()
            .filter(|w| {
                w.record.result["toolkits"]
                    .as_array()
                    .is_some_and(|ts| ts.iter().any(&opened_on))
            })
            .map(|w| json!({ "workspace": w.id, "owner": w.owner() }))
            .collect()
    }
}

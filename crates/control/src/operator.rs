//! Decisions only the operator makes, in `<CLOUD_HARNESS_HOME>/operator.json`, read on each
//! use: overrides when a workspace opens (an open workspace keeps those it opened with),
//! approvals on each run:
//!
//! ```json
//! {
//!   "overrides": [{"skill": "code-review", "source": "owner:team-skills"}],
//!   "approvedSkills": ["sha256:…"]
//! }
//! ```
//!
//! `overrides` settle same-tier conflicts (the source is a source id such as
//! `owner:<instanceId>`, or a toolkit's instance id); `approvedSkills` are the skill folder
//! digests whose scripts `skills_run` may execute.

use cloud_harness_error::{Error, Result};
use cloud_harness_skills::resolver::Override;
use cloud_harness_store::cas::Digest;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Operator {
    #[serde(default)]
    pub overrides: Vec<Override>,
    #[serde(default)]
    pub approved_skills: Vec<Digest>,
}

impl Operator {
    pub fn path(home: &Path) -> PathBuf {
        home.join("operator.json")
    }

    /// The operator's configuration; none yet is the empty one. A file that does not parse
    /// is an error naming it: silently ignoring an operator's decision would be worse.
    pub fn load(home: &Path) -> Result<Operator> {
        let path = Operator::path(home);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::internal(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Operator::default()),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    pub fn is_approved(&self, digest: &Digest) -> bool {
        self.approved_skills.contains(digest)
    }
}

//! The one place a tier stack is built, for `skills resolve`, `mount` and workspaces alike:
//! the built-in tier, owner-tier toolkit bundles, folders of owner and workspace skills, the
//! project's own skills, and the operator's overrides.

use crate::builtin;
use cloud_harness_error::Result;
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::resolver::{Override, Tier};
use cloud_harness_skills::spec::Validation;
use cloud_harness_skills::stack::StackSpec;
use cloud_harness_store::cas::{Digest, Store};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A toolkit bundle served in the owner tier as the source `owner:<instanceId>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerBundle {
    pub instance_id: String,
    pub bundle: Digest,
    pub url: String,
    pub commit: String,
    /// Its toolkit's policy for skills that break the Agent Skills specification.
    #[serde(default, skip_serializing_if = "Validation::is_warn")]
    pub validation: Validation,
}

/// Everything a stack is made of.
#[derive(Debug, Clone, Default)]
pub struct TierInputs {
    pub builtin: bool,
    pub owner_bundles: Vec<OwnerBundle>,
    pub owner_dirs: Vec<PathBuf>,
    pub workspace_dirs: Vec<PathBuf>,
    /// A project root whose `.agents/skills` and `.claude/skills` form the repository tier.
    pub repository: Option<PathBuf>,
    pub overrides: Vec<Override>,
    /// The project the folders belong to, when they are a working tree's (hostile content:
    /// they must stay beneath it).
    pub confine: Option<PathBuf>,
}

impl TierInputs {
    /// The stack (the built-in tier is put into the store).
    pub fn stack(&self, store: &Store, cache: &SkillCache) -> Result<StackSpec> {
        let mut spec = StackSpec {
            overrides: self.overrides.clone(),
            repository: self.repository.clone(),
            confine: self.confine.clone(),
            ..StackSpec::default()
        };
        if self.builtin {
            spec.trees.push(builtin::source(store, cache)?);
        }
        for b in &self.owner_bundles {
            spec.trees.push(cloud_harness_provision::bundle_source(
                store,
                cache,
                Tier::Owner,
                &b.instance_id,
                &b.url,
                &b.commit,
                b.bundle,
                b.validation,
            )?);
        }
        spec.dirs
            .extend(self.owner_dirs.iter().map(|d| (Tier::Owner, d.clone())));
        spec.dirs.extend(
            self.workspace_dirs
                .iter()
                .map(|d| (Tier::Workspace, d.clone())),
        );
        Ok(spec)
    }
}

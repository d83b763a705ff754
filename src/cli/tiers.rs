//! The inputs of a tier stack on the command line, shared by every command that resolves one
//! (`skills resolve`, `mount`).

use clap::Args;
use cloud_harness_error::{Error, Result};
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::resolver::{Index, Override};
use cloud_harness_skills::stack::StackSpec;
use cloud_harness_store::cas::{Digest, Store};
use cloud_harness_workspace::stack::{OwnerBundle, TierInputs};
use std::path::PathBuf;

/// The inputs of a tier stack, shared by every command that resolves one.
#[derive(Debug, Args, Clone)]
pub struct TierArgs {
    /// Leave out the built-in tier.
    #[arg(long)]
    pub no_builtin: bool,
    /// A toolkit bundle acquired with `toolkit add`, by digest, in the owner tier (repeatable).
    #[arg(long, value_name = "DIGEST")]
    pub bundle: Vec<Digest>,
    /// A folder of owner-tier skills, searched recursively (repeatable: one source each).
    #[arg(long, value_name = "DIR")]
    pub owner: Vec<PathBuf>,
    /// A folder of workspace-tier skills, searched recursively (repeatable).
    #[arg(long, value_name = "DIR")]
    pub workspace: Vec<PathBuf>,
    /// A project root whose .agents/skills and .claude/skills form the repository tier.
    #[arg(long, value_name = "PROJECT_ROOT")]
    pub repository: Option<PathBuf>,
    /// Settle a same-tier conflict: serve SKILL from SOURCE (a source id or toolkit name).
    #[arg(long = "override", value_name = "SKILL=SOURCE", value_parser = parse_override)]
    pub overrides: Vec<Override>,
}

fn parse_override(text: &str) -> std::result::Result<Override, String> {
    match text.split_once('=') {
        Some((skill, source)) if !skill.is_empty() && !source.is_empty() => Ok(Override {
            skill: skill.to_owned(),
            source: source.to_owned(),
        }),
        _ => Err(format!("{text:?} is not SKILL=SOURCE")),
    }
}

impl TierArgs {
    /// The tier stack these arguments describe (the built-in tier is put into the store).
    pub fn stack(&self, store: &Store, cache: &SkillCache) -> Result<StackSpec> {
        let index = cloud_harness_provision::index::BundleIndex::open(store);
        let mut owner_bundles = Vec::new();
        for digest in &self.bundle {
            let record = index.by_bundle(digest)?.ok_or_else(|| {
                Error::not_found(format!(
                    "{digest} is not a bundle of this store (see `cloud-harness toolkit list`)"
                ))
            })?;
            owner_bundles.push(OwnerBundle {
                validation: Default::default(),
                instance_id: record.instance_id,
                bundle: *digest,
                url: record.key.url,
                commit: record.key.commit,
            });
        }
        TierInputs {
            builtin: !self.no_builtin,
            owner_bundles,
            owner_dirs: self.owner.clone(),
            workspace_dirs: self.workspace.clone(),
            repository: self.repository.clone(),
            overrides: self.overrides.clone(),
            confine: None,
        }
        .stack(store, cache)
    }
}

/// Builds the tier stack the arguments describe and resolves it.
pub fn resolve_tiers(store: &Store, args: &TierArgs) -> Result<Index> {
    let cache = SkillCache::default();
    args.stack(store, &cache)?.resolve(store, &cache)
}

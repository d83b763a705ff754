//! What a set of toolkits would serve, before anything is saved or opened: the toolkits
//! acquired (warm from the store, or fetched as an open would), the stack built as an open
//! builds it, its resolution returned. Nothing is mounted and nothing stays but the bundles.

use super::{materialize, Workspaces, WORKSPACE_SKILLS};
use crate::stack::TierInputs;
use cloud_harness_control::signatures::verdict::Verdict;
use cloud_harness_control::toolkit::{self, Scope, ToolkitSpec};
use cloud_harness_error::{Error, Result};
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::resolver::Index;
use cloud_harness_skills::spec::Validation;
use std::sync::Arc;
use std::time::Instant;

/// One toolkit of a preview as it was acquired.
pub struct Acquired {
    pub instance_id: String,
    pub scope: Scope,
    pub url: String,
    pub commit: String,
    pub skills: usize,
    pub warm: bool,
    /// The trust policy's verdict, when a scope of it covers the toolkit.
    pub signature: Option<Verdict>,
}

pub struct Preview {
    pub toolkits: Vec<Acquired>,
    /// The resolution of all four tiers (the repository tier empty: there is no project).
    pub index: Arc<Index>,
}

impl Workspaces {
    /// The resolution `specs` would give a workspace of the set `set` (its overrides and the
    /// global ones applied, and its `validation`).
    pub fn preview(
        &self,
        specs: &[ToolkitSpec],
        set: Option<&str>,
        validation: Validation,
        actor: &str,
    ) -> Result<Preview> {
        let registry = cloud_harness_curation::registry::load(&self.db)?;
        let mut toolkits = toolkit::resolve_request_in(specs, self.provisioner.hosts(), &registry)?;
        for t in &mut toolkits {
            t.layout.validation = t.layout.validation.stricter(validation);
        }
        let mut acquired = Vec::with_capacity(toolkits.len());
        for t in &toolkits {
            let started = Instant::now();
            let a = self.provisioner.acquire(t);
            let millis = started.elapsed().as_millis() as u64;
            cloud_harness_provision::acquisitions::record(
                &self.db, t, &a, millis, actor, "preview", set,
            );
            acquired.push((t.clone(), a?));
        }
        // A toolkit the trust policy refuses is previewed as an open would serve it: without
        // its skills.
        let verdicts = self.judge_signatures(&acquired, actor, "preview", &mut Vec::new())?;
        let served: Vec<_> = acquired
            .iter()
            .zip(&verdicts)
            .filter(|(_, v)| v.as_ref().is_none_or(|v| v.served()))
            .map(|(a, _)| a.clone())
            .collect();
        let sets: Vec<String> = set.into_iter().map(str::to_owned).collect();
        let overrides =
            cloud_harness_curation::decisions::in_force(&self.db, &self.home)?.overrides_for(&sets);
        // Workspace-scope toolkits are written into a scratch project, as an open writes them
        // into the working tree; it goes when the preview ends.
        let scratch = tempfile::Builder::new()
            .prefix(".preview-")
            .tempdir_in(&self.home)
            .map_err(|e| Error::io(&self.home, e))?;
        materialize::workspace_scope(self.store(), scratch.path(), &served, &overrides)?;
        let ws_dir = scratch.path().join(WORKSPACE_SKILLS);
        let inputs = TierInputs {
            builtin: true,
            owner_bundles: super::open::owner_bundles(&served),
            workspace_dirs: if ws_dir.is_dir() {
                vec![ws_dir]
            } else {
                Vec::new()
            },
            overrides,
            confine: Some(scratch.path().to_path_buf()),
            ..TierInputs::default()
        };
        let cache = SkillCache::default();
        let generation = inputs
            .stack(self.store(), &cache)?
            .generation(self.store(), &cache)?;
        Ok(Preview {
            toolkits: acquired
                .iter()
                .zip(verdicts)
                .map(|((t, a), signature)| Acquired {
                    signature,
                    instance_id: t.instance_id.clone(),
                    scope: t.scope,
                    url: a.record.key.url.clone(),
                    commit: a.record.key.commit.clone(),
                    skills: a.record.skills,
                    warm: a.warm,
                })
                .collect(),
            index: generation.index.clone(),
        })
    }
}

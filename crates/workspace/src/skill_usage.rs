//! What a use of a served skill names: the workspace, the principal, and where the skill comes
//! from in the generation that served it (toolkit, commit, bundle, tier), handed to the
//! control plane's tally ([`cloud_harness_control::skill_usage`]). The MCP layer reports its
//! reads, resource reads and runs; the mount reports its loads through the hook made here.

use super::origins::Origins;
use super::served::Workspace;
use cloud_harness_control::skill_usage::{self, Origin, Source, Use};
use cloud_harness_mount::fuse::Loads;
use cloud_harness_skills::generation::View;
use cloud_harness_skills::namespace::Namespace;
use std::sync::Arc;
use std::time::Duration;

impl Workspace {
    /// Counts a use of `skill` (its file `file`) as the merged view serves it, by `principal`.
    /// A skill the workspace does not serve (a failed read of a wrong name) is not counted.
    pub fn used(
        &self,
        source: Source,
        principal: &str,
        skill: &str,
        file: &str,
        failed: bool,
        took: Duration,
    ) {
        if let Some(origin) = self.origin(skill) {
            self.used_from(&origin, source, principal, skill, file, failed, took);
        }
    }

    /// Where `skill` comes from as the merged view serves it now; `None` for a skill it does
    /// not serve, or when uses are not counted.
    pub(crate) fn origin(&self, skill: &str) -> Option<Arc<Origin>> {
        if !skill_usage::enabled() {
            return None;
        }
        self.origins
            .of(&self.merged.generation(), View::Merged, skill)
    }

    /// Counts a use of `skill` served from `origin` (taken when the use began: a run that
    /// outlives a generation is counted against the version that ran).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn used_from(
        &self,
        origin: &Origin,
        source: Source,
        principal: &str,
        skill: &str,
        file: &str,
        failed: bool,
        took: Duration,
    ) {
        tell(&Use {
            source,
            workspace: &self.id,
            principal,
            origin,
            skill,
            file,
            failed,
            duration_ms: took.as_millis().min(u128::from(u64::MAX)) as u64,
        });
    }
}

/// The mount's hook for `ns`, a view of the workspace `id` opened by `owner`: each load of a
/// skill's file counted as the owner's (the agent and the executor's scripts read as the
/// workspace's owner).
pub(crate) fn loads(id: &str, owner: &str, ns: Arc<Namespace>, origins: Arc<Origins>) -> Loads {
    let (id, owner) = (id.to_owned(), owner.to_owned());
    Loads(Arc::new(move |view: View, skill: &str, file: &str| {
        if !skill_usage::enabled() {
            return;
        }
        let generation = ns.generation();
        if let Some(origin) = origins.of(&generation, view, skill) {
            tell(&Use {
                source: Source::Mount,
                workspace: &id,
                principal: &owner,
                origin: &origin,
                skill,
                file,
                failed: false,
                duration_ms: 0,
            });
        }
    }))
}

/// A use told to the tally, and to the span exporter when one runs.
fn tell(u: &Use) {
    skill_usage::record(u);
    skill_usage::spans::offer(u);
}

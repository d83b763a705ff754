//! Where each skill a workspace serves comes from, as a use names it (toolkit, commit, bundle,
//! tier), worked out once per generation of the workspace.

use cloud_harness_control::skill_usage::Origin;
use cloud_harness_skills::generation::{Generation, View};
use cloud_harness_store::cas::Digest;
use foldhash::HashMap;
use std::sync::{Arc, Mutex};

/// The toolkit a source without a repository or a name is counted under: a project's own
/// folder (its path would make a toolkit of every workspace).
const PROJECT: &str = "project";

/// Each served skill's origin, worked out once per generation.
#[derive(Default)]
pub(crate) struct Origins {
    cached: Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    generation: Option<Digest>,
    /// By view, then skill. At most the generation's skills (its views' names).
    by_view: HashMap<View, HashMap<String, Arc<Origin>>>,
}

impl Origins {
    /// The origin of `skill` as `view` of `generation` serves it.
    pub(crate) fn of(
        &self,
        generation: &Generation,
        view: View,
        skill: &str,
    ) -> Option<Arc<Origin>> {
        // Whatever a panic elsewhere left: a cache, rebuilt below if it is not this
        // generation's (the mount's threads must not panic on it).
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let digest = generation.digest();
        if cached.generation != Some(digest) {
            cached.by_view.clear();
            cached.generation = Some(digest);
        }
        if let Some(found) = cached.by_view.get(&view).and_then(|m| m.get(skill)) {
            return Some(found.clone());
        }
        let found = Arc::new(origin(generation, view, skill)?);
        cached
            .by_view
            .entry(view)
            .or_default()
            .insert(skill.to_owned(), found.clone());
        Some(found)
    }
}

fn origin(generation: &Generation, view: View, skill: &str) -> Option<Origin> {
    let served = generation.skill(view, skill)?;
    let p = &served.provenance;
    let bundle = generation
        .index
        .sources
        .iter()
        .find(|s| s.id == served.source)
        .map(|s| s.tree.to_string())
        .unwrap_or_default();
    let toolkit = p.url.as_deref().or(p.toolkit.as_deref()).unwrap_or(PROJECT);
    Some(Origin {
        toolkit: toolkit.to_owned(),
        commit: p.commit.clone().unwrap_or_default(),
        bundle,
        tier: served.tier.as_str().to_owned(),
    })
}

//! A generation: one resolved, immutable picture of the tiers, as the filesystem serves it.
//!
//! It holds the merged view (the resolver's winners) and each tier's own view (that tier's
//! sources resolved alone, so a toolkit's skills sit side by side with their siblings), each a
//! sorted map from skill name to the skill folder's tree, plus the resolution as JSON.

use crate::resolver::{resolve, Index, Override, Provenance, Source, Tier};
use cloud_harness_store::cas::Digest;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Which view a skill folder is seen through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum View {
    Merged,
    Tier(Tier),
}

/// Where a served skill folder comes from; shown as extended attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillOrigin {
    pub tier: Tier,
    pub source: String,
    pub provenance: Provenance,
    /// The skill's folder digest.
    pub digest: Digest,
}

pub type ViewMap = BTreeMap<String, Arc<SkillOrigin>>;

#[derive(Debug)]
pub struct Generation {
    pub index: Arc<Index>,
    /// Each tier's sources resolved alone: what `.tiers/<tier>/` serves and what a listing of
    /// one tier shows, so the two never disagree.
    tier_indexes: HashMap<Tier, Index>,
    views: HashMap<View, ViewMap>,
    pub resolution_json: Arc<[u8]>,
    /// The digest of `resolution_json`, its identity in the filesystem.
    pub resolution_digest: Digest,
}

static EMPTY: ViewMap = BTreeMap::new();

impl Generation {
    pub fn build(sources: &[Source], overrides: &[Override]) -> Generation {
        let index = resolve(sources, overrides);
        let mut views = HashMap::new();
        let mut tier_indexes = HashMap::new();
        views.insert(View::Merged, view_of(&index));
        for tier in Tier::ALL {
            let mine: Vec<Source> = sources.iter().filter(|s| s.tier == tier).cloned().collect();
            if !mine.is_empty() {
                let alone = resolve(&mine, overrides);
                views.insert(View::Tier(tier), view_of(&alone));
                tier_indexes.insert(tier, alone);
            }
        }
        let mut json = serde_json::to_vec_pretty(&index.to_json()).unwrap_or_default();
        json.push(b'\n');
        Generation {
            index: Arc::new(index),
            tier_indexes,
            views,
            resolution_digest: Digest::of(&json),
            resolution_json: json.into(),
        }
    }

    pub fn digest(&self) -> Digest {
        self.index.generation
    }

    pub fn view(&self, view: View) -> &ViewMap {
        self.views.get(&view).unwrap_or(&EMPTY)
    }

    pub fn skill(&self, view: View, name: &str) -> Option<&Arc<SkillOrigin>> {
        self.view(view).get(name)
    }

    /// One tier's sources resolved alone (`None` when the tier has no source).
    pub fn tier_index(&self, tier: Tier) -> Option<&Index> {
        self.tier_indexes.get(&tier)
    }

    /// The tiers that have a view (at least one source).
    pub fn tiers(&self) -> impl Iterator<Item = Tier> + '_ {
        Tier::ALL
            .into_iter()
            .filter(|t| self.views.contains_key(&View::Tier(*t)))
    }
}

fn view_of(index: &Index) -> ViewMap {
    index
        .winners()
        // Names starting with a dot would hide among the mount's own entries.
        .filter(|c| !c.name.starts_with('.'))
        .map(|c| {
            let src = index.source(c);
            let origin = SkillOrigin {
                tier: c.tier,
                source: src.id.clone(),
                provenance: src.provenance.clone(),
                digest: c.digest(),
            };
            (c.name.clone(), Arc::new(origin))
        })
        .collect()
}

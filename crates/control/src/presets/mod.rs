//! The preset registry: named toolkits the operator has vetted, as data in
//! `presets/registry/*.json`, embedded at build time.

pub mod registry;

use crate::scope::Scope;
use cloud_harness_skills::discovery::Layout;
use include_dir::{include_dir, Dir};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

static REGISTRY: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../../presets/registry");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Preset {
    pub id: String,
    pub name: String,
    pub description: String,
    pub url: String,
    /// The commit this preset was last tested at.
    pub tested_commit: String,
    pub layout: Layout,
    pub default_scope: Scope,
    /// A skill whose instructions belong at the start of every session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_start_skill: Option<String>,
}

/// Every preset, sorted by id. A malformed registry file is a build mistake, caught by the
/// tests; it panics here rather than serving a partial registry.
pub fn all() -> &'static [Preset] {
    static PRESETS: OnceLock<Vec<Preset>> = OnceLock::new();
    PRESETS.get_or_init(|| {
        let mut out: Vec<Preset> = REGISTRY
            .files()
            .filter(|f| f.path().extension().is_some_and(|e| e == "json"))
            .map(|f| {
                serde_json::from_slice(f.contents())
                    .unwrap_or_else(|e| panic!("presets/registry/{}: {e}", f.path().display()))
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    })
}

pub fn find(id: &str) -> Option<&'static Preset> {
    all().iter().find(|p| p.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_holds_the_two_presets_with_valid_layouts() {
        let ids: Vec<&str> = all().iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["mattpocock/skills", "obra/superpowers"]);
        for p in all() {
            p.layout.validate().unwrap();
            assert!(p.url.starts_with("https://"), "{}", p.url);
            assert_eq!(p.tested_commit.len(), 40);
        }
        assert_eq!(
            find("obra/superpowers")
                .unwrap()
                .session_start_skill
                .as_deref(),
            Some("using-superpowers")
        );
    }
}

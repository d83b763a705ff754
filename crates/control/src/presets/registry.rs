//! The registry as a value: the presets toolkits resolve against, each with its current pin
//! (the shipped ones, and an operator's own, as the database has them).

use super::{self as presets, Preset};
use crate::labels::Point;
use cloud_harness_skills::spec::Validation;
use serde::Serialize;
use std::collections::BTreeMap;

/// A pin: an entry's commit from `created_at` until `superseded_at`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pin {
    pub id: String,
    pub commit: String,
    pub actor: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_at: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    #[serde(flatten)]
    pub preset: Preset,
    /// `shipped` (with the binary) or `operator`.
    pub origin: String,
    pub pin: Option<Pin>,
    /// What opens do with its skills that break the Agent Skills specification.
    pub validation: Validation,
    /// The one commit opens of it may serve though no branch or tag of its repository
    /// reaches it (an operator's override, audited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_unreachable: Option<String>,
    /// Its version labels by name, each pointing at a commit.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, Point>,
}

/// The entries presets resolve against.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    entries: BTreeMap<String, Entry>,
}

impl Registry {
    /// The shipped presets alone, unpinned (a preset without a version is then the default
    /// branch head): what resolves where there is no state database.
    pub fn shipped() -> &'static Registry {
        static SHIPPED: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
        SHIPPED.get_or_init(|| Registry {
            entries: presets::all()
                .iter()
                .map(|p| {
                    let entry = Entry {
                        preset: p.clone(),
                        origin: "shipped".into(),
                        pin: None,
                        validation: Validation::Warn,
                        allow_unreachable: None,
                        labels: BTreeMap::new(),
                    };
                    (p.id.clone(), entry)
                })
                .collect(),
        })
    }

    pub fn find(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    pub fn ids(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// Adds an entry read from the database: a shipped definition stays the binary's, and
    /// the database adds its pin; an operator's entry is taken whole.
    pub fn put(&mut self, e: Entry) {
        match self.entries.get_mut(&e.preset.id) {
            Some(shipped) if e.origin == "shipped" => {
                shipped.pin = e.pin;
                shipped.validation = e.validation;
                shipped.allow_unreachable = e.allow_unreachable;
                shipped.labels = e.labels;
            }
            _ => {
                self.entries.insert(e.preset.id.clone(), e);
            }
        }
    }
}

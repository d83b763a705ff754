//! The control-plane suites again, with every server's control plane on PostgreSQL (see
//! `support::postgres`, which selects it by this binary's name): the same behaviour on both
//! engines.

#[path = "../support/mod.rs"]
mod support;

#[path = "../api.rs"]
mod api;
#[path = "../decisions.rs"]
mod decisions;
#[path = "../imports.rs"]
mod imports;
#[path = "../inventory.rs"]
mod inventory;
#[path = "../labels.rs"]
mod labels;
#[path = "../provenance.rs"]
mod provenance;
#[path = "../registry.rs"]
mod registry;
#[path = "../sets.rs"]
mod sets;
#[path = "../signatures.rs"]
mod signatures;
#[path = "../skill_usage.rs"]
mod skill_usage;

//! What the operator curates: the registry of toolkits and their pins (updates acquire through
//! provisioning), skill sets, decisions (approvals of exact skill bytes, pending requests) and
//! the overrides of launch conflicts. Each change is one database transaction with its audit
//! row.
//!
//! It knows nothing of workspaces, executors or the protocols above them.

pub mod bundle_diff;
pub mod conflicts;
pub mod decisions;
pub mod labels;
pub mod pin_diff;
pub mod registry;
pub mod sets;

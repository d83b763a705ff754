//! Cloud Harness: installs third-party agent skill toolkits into workspaces and serves them.
//! The store, skill model and resolver live in the `cloud-harness-fs` crate.

pub mod builtin;
pub mod cli;
pub mod mount;
pub mod presets;
pub mod provision;
pub mod toolkit;

pub use cloud_harness_fs as fs;

//! The control plane's base: what every layer above it reads and records. Configuration (the
//! file and its variables), principals and their quotas, the state database (SQLite or
//! PostgreSQL behind one interface), toolkit specs and the host allowlist, the shipped presets,
//! the home folder, the audit log and metrics.
//!
//! It knows nothing of how a toolkit is fetched, served or run: no git transport, no Docker,
//! no FUSE session (only the mount's counters, for the metrics), no HTTP.

pub mod audit;
pub mod config;
pub mod heads;
pub mod home;
pub mod hosts;
pub(crate) mod ids;
pub mod input;
pub mod keyed_lock;
pub mod labels;
pub mod limits;
pub mod metrics;
pub mod operator;
pub mod presets;
pub mod principal;
pub(crate) mod scope;
pub mod signatures;
pub mod skill_usage;
pub mod state;
pub mod toolkit;

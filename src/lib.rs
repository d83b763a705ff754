//! Cloud Harness: installs third-party agent skill toolkits into workspaces and serves them.
//! The store, skill model and resolver live in the `cloud-harness-fs` crate.

pub mod acquisitions;
pub mod api;
pub mod audit;
pub mod auth;
pub mod builtin;
pub mod cli;
pub mod config;
pub mod conflicts;
pub mod dashboard;
pub mod decisions;
pub mod engine;
pub mod executor;
pub mod heads;
pub mod health;
pub mod home;
pub mod imports;
pub mod input;
pub mod keyed_lock;
pub mod library;
pub mod limits;
pub mod listener;
pub mod mcp;
pub mod metrics;
pub mod mount;
pub mod notify;
pub mod operator;
pub mod presets;
pub mod principal;
pub mod provision;
pub mod registry;
pub mod runner;
pub mod serve;
pub mod session_start;
pub mod sets;
pub mod stack;
pub mod state;
pub mod toolkit;
pub mod workspace;

pub use cloud_harness_fs as fs;

//! Cloud Harness: installs third-party agent skill toolkits into workspaces and serves them.
//! The layers below it are crates of their own: `cloud-harness-error`, `-store`, `-skills` and
//! `-mount` (ARCHITECTURE.md).

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
pub mod hosts;
pub mod ids;
pub mod imports;
pub mod input;
pub mod keyed_lock;
pub mod library;
pub mod limits;
pub mod listener;
pub mod mcp;
pub mod metrics;

pub mod notify;
pub mod operator;
pub mod presets;
pub mod principal;
pub mod provision;
pub mod registry;
pub mod runner;
pub mod scope;
pub mod serve;
pub mod session_start;
pub mod sets;
pub mod stack;
pub mod state;
pub mod toolkit;
pub mod usage;
pub mod workspace;

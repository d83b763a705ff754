//! Every integration test of the `cloud-harness` package, in one binary: one link instead
//! of one per file (each link is ~170 MB and half a minute on two cores). nextest still runs
//! each test in a process of its own; a file's tests are `FILE::name` (filter with
//! `-E 'test(/^FILE::/)'`).

#[path = "../support/mod.rs"]
mod support;

#[path = "../acquire.rs"]
mod acquire;
#[path = "../api.rs"]
mod api;
#[path = "../cli.rs"]
mod cli;
#[path = "../containers.rs"]
mod containers;
#[path = "../dashboard.rs"]
mod dashboard;
#[path = "../decisions.rs"]
mod decisions;
#[path = "../executor.rs"]
mod executor;
#[path = "../executor_lifecycle.rs"]
mod executor_lifecycle;
#[path = "../executor_runs.rs"]
mod executor_runs;
#[path = "../faults/mod.rs"]
mod faults;
#[path = "../fleet.rs"]
mod fleet;
#[path = "../fleet_state.rs"]
mod fleet_state;
#[path = "../hostile/main.rs"]
mod hostile;
#[path = "../http.rs"]
mod http;
#[path = "../idle_pause.rs"]
mod idle_pause;
#[path = "../imports.rs"]
mod imports;
#[path = "../inventory.rs"]
mod inventory;
#[path = "../labels.rs"]
mod labels;
#[path = "../launch_mounts.rs"]
mod launch_mounts;
#[path = "../library.rs"]
mod library;
#[path = "../mcp.rs"]
mod mcp;
#[path = "../mount.rs"]
mod mount;
#[path = "../operations.rs"]
mod operations;
#[path = "../pin_diff.rs"]
mod pin_diff;
#[path = "../project.rs"]
mod project;
#[path = "../provenance.rs"]
mod provenance;
#[path = "../proxy.rs"]
mod proxy;
#[path = "../refusals.rs"]
mod refusals;
#[path = "../registry.rs"]
mod registry;
#[path = "../sets.rs"]
mod sets;
#[path = "../signatures.rs"]
mod signatures;
#[path = "../skill_usage.rs"]
mod skill_usage;
#[path = "../skills_resources.rs"]
mod skills_resources;
#[path = "../spec.rs"]
mod spec;
#[path = "../unmount_guard.rs"]
mod unmount_guard;
#[path = "../usage_spans.rs"]
mod usage_spans;

//! The server driven from outside as a hostile client or toolkit author would drive it (issue
//! "Safe to share"): every test starts a real `serve`, attacks it through the CLI, HTTP or MCP,
//! and checks the clear error and that the server still serves, within its bounds.

#[path = "../support/mod.rs"]
mod support;

mod ownership;
mod quotas;
mod session;

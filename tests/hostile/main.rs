//! The harness driven from outside as a hostile client would: the real server over HTTP, MCP
//! and its CLI, each class of attack asserting the clear error and that the server still
//! serves.

#[path = "../support/mod.rs"]
mod support;

mod session;

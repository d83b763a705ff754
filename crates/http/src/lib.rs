//! The HTTP side for people and programs other than agents: the operator API (with its OpenAPI
//! document), the dashboard, the health probes and `/metrics`, per-principal usage, and the
//! listener the one HTTP server binds through (the MCP transport shares its router).
//!
//! It composes the layers below; nothing below depends on it. The MCP transport over HTTP is
//! `cloud-harness-mcp`'s.

pub mod api;
pub mod dashboard;
pub mod health;
pub mod listener;
mod usage;

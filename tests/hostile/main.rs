//! The server driven from outside as a hostile client, toolkit author or project would drive
//! it (issue "Safe to share"): each module is one class of attack, through the CLI, HTTP or
//! MCP, asserting the clear error and that the server still serves, within its bounds.

mod ownership;
mod parsers;
mod quotas;
mod session;
mod store_of_record;
mod walks;

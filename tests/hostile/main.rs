//! The real server driven from outside by a hostile client, toolkit author or project: each
//! module is one class of attack, asserting the clear error and that the server still serves.

#[path = "../support/mod.rs"]
mod support;

mod walks;

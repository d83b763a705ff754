//! The `cloud-harness` binary's library: the command line (`cli`), `serve`'s wiring of the
//! crates below into one server, and the service manager's readiness protocol. Everything
//! else is a crate of its own (ARCHITECTURE.md).

pub mod cli;
mod notify;
mod serve;

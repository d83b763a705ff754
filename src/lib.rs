//! The `cloud-harness` binary's library: the command line (`cli`), `serve`'s wiring of the
//! crates below into one server, the service manager's readiness protocol, and the process's
//! `allocator`. Everything else
//! is a crate of its own (ARCHITECTURE.md).

pub mod allocator;
pub mod cli;
mod notify;
mod serve;

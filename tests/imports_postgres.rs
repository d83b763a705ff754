//! `tests/imports.rs` again, with every server's control plane on PostgreSQL (see
//! `support::postgres`): the same behaviour on both engines.

#[path = "imports.rs"]
mod suite;

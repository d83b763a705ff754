//! `tests/sets.rs` again, with every server's control plane on PostgreSQL (see
//! `support::postgres`): the same behaviour on both engines.

#[path = "sets.rs"]
mod suite;

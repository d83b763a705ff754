//! `tests/decisions.rs` again, with every server's control plane on PostgreSQL (see
//! `support::postgres`): the same behaviour on both engines.

#[path = "decisions.rs"]
mod suite;

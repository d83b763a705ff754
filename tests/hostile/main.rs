//! The real server driven from outside by a hostile client, toolkit author or bucket: each
//! module is one class of attack, each test asserts the clear error, that the server goes on
//! serving, and that its memory stays bounded.

#[path = "../support/mod.rs"]
mod support;

mod parsers;
mod store_of_record;

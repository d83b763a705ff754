//! The content-addressed store of Cloud Harness: blobs and canonical trees named by their
//! SHA-256, imported and published atomically, read back verified, pinned by roots, checked
//! (`cas verify`) and collected (`gc`); and the bounded, descriptor-relative walks and
//! removals of untrusted trees that importing and cleaning up need.
//!
//! Plumbing only: nothing here knows what a skill, a tier, a mount, a network or a workspace
//! is. It depends on `cloud-harness-error` and nothing else of the project.

pub mod cas;
pub mod removal;
pub mod stats;
pub mod walk;

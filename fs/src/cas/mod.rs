//! The content-addressed store: blobs and canonical trees named by SHA-256, published
//! atomically, verified on read, collected from roots.

mod budget;
mod check;
mod digest;
mod hashed;
mod import;
mod materialize;
mod roots;
mod store;
mod tree;
pub(crate) mod verified;

pub use budget::{WalkBudget, MAX_WALK_ENTRIES};
pub use check::{GcReport, Problem, ProblemKind, VerifyReport};
pub use digest::{Digest, Hasher};
pub use import::{import_dir, import_fd, open_dir, Imported, Limits, MAX_LEFT_OUT};
pub use materialize::materialize;
pub(crate) use store::read_whole;
pub use store::{ObjectKind, Store, Writer};
pub use tree::{
    canonical_order, check_name, Entry, Kind, Tree, MAX_BYTES as MAX_TREE_BYTES,
    MAX_ENTRIES as MAX_TREE_ENTRIES,
};

/// How deep trees in the store may nest. Every producer holds its trees to it (an import, a
/// staged toolkit), so the walks over stored trees (discovery, links, listings) stay shallow
/// whatever a source held.
pub const MAX_TREE_DEPTH: usize = 256;

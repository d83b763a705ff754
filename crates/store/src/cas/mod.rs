//! The content-addressed store: blobs and canonical trees named by SHA-256, published
//! atomically, verified on read, collected from roots.

mod budget;
mod check;
mod digest;
mod hashed;
mod import;
mod materialize;
mod progress;
mod roots;
mod store;
mod tree;
pub(crate) mod verified;

pub use budget::{WalkBudget, MAX_WALK_ENTRIES};
pub use check::{GcReport, Problem, ProblemKind, VerifyReport};
pub use digest::{Digest, Hasher};
pub use import::{import_dir, import_fd, open_dir, Imported, Limits, MAX_LEFT_OUT};
pub use materialize::materialize;
pub use progress::{Progress, Unwatched};
pub use store::{ObjectKind, Store, Writer};
pub use tree::{
    canonical_order, check_name, Entry, Kind, Tree, MAX_BYTES as MAX_TREE_BYTES,
    MAX_DEPTH as MAX_TREE_DEPTH, MAX_ENTRIES as MAX_TREE_ENTRIES,
};
pub use verified::FileId;

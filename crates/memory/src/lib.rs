//! The process's memory: its `allocator` (mimalloc for small blocks, a mapping of its own for
//! each large one) and `idle`, when each of its threads gives back what the allocator holds
//! free for it.

pub mod allocator;
pub mod idle;

pub use allocator::Allocator;

//! How far a long operation on the store is (`verify`, `gc`): told to whoever watches (a
//! progress bar on a terminal), or to nobody.

/// Told each step of an operation, and how far it is in it.
pub trait Progress {
    /// The operation is at `done` of `total` items of `step` (`total` 0: not known).
    fn at(&self, step: &'static str, done: u64, total: u64);
}

/// Nobody watches.
pub struct Unwatched;

impl Progress for Unwatched {
    fn at(&self, _: &'static str, _: u64, _: u64) {}
}

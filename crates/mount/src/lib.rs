//! The skills file system of Cloud Harness: the FUSE adapter over a namespace of the skill
//! model, the unmount guard and the mount table, the prewarm walker, and live tiers (a
//! project's own skills watched with inotify, each change a new generation).
//!
//! The adapter is thin: what a path holds is decided by `cloud-harness-skills`; here the
//! kernel's requests are answered from it, never waiting on anything but the store. It
//! depends on `cloud-harness-error`, `cloud-harness-store` and `cloud-harness-skills`.

mod abi;
mod device;
pub mod fuse;
pub mod guard;
mod inherit;
pub mod live;
pub mod mount_table;
pub mod pool;
pub mod prewarm;
pub mod self_bind;
pub mod stats;
pub mod watch;

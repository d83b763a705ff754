//! The ground Cloud Harness stands on: the content-addressed store, the skill model and the
//! tier resolver. Nothing here knows about networks, MCP or workspaces.

pub mod cas;
pub mod error;

pub use error::{Code, Error, Result};
pub mod discovery;
pub mod front_matter;
pub mod fuse;
pub mod generation;
pub mod guard;
pub mod links;
pub mod live;
pub mod mount_table;
pub mod namespace;
pub mod prewarm;
pub mod relpath;
pub mod removal;
pub mod resolver;
pub mod skill;
pub mod stack;
pub mod stats;
pub mod walk;
pub mod watch;

//! The skill model of Cloud Harness: `SKILL.md` and its front matter (parsed under bounds),
//! skill discovery in a stored tree, the link rules, tiers and their sources, the resolver
//! (precedence and shadowing), the generation (one resolved view, immutable) and the
//! namespace that serves a generation as a file tree (what the mount and `skills_read` read).
//!
//! Everything here reads the store and nothing else: no network, no process, no FUSE, no
//! control plane. It depends on `cloud-harness-error` and `cloud-harness-store`.

pub mod discovery;
pub mod folder;
pub mod front_matter;
pub mod generation;
pub mod links;
pub mod namespace;
pub mod references;
pub mod relpath;
pub mod resolver;
pub mod skill;
pub mod spec;
pub mod stack;
pub mod stats;

//! Toolkits as requests name them: the specs users send (`spec`) and their resolution into a
//! [`Toolkit`] the provisioning code can act on (`resolve`).

mod resolve;
mod spec;

pub use resolve::{in_request, resolve_request, resolve_request_in, resolve_request_seeded};
pub use spec::{
    is_hex_commit, parse_spec, spec_from_value, GitSpec, LayoutSpec, PresetSpec, Revision, Scope,
    SetRef, SkillFilter, Toolkit, ToolkitSpec, MAX_NAME, MAX_PATH, MAX_PATTERN, MAX_PATTERNS,
    MAX_ROOTS, MAX_TOOLKITS, MAX_URL,
};

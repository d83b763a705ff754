//! Toolkits as requests name them: the specs users send (`spec`) and their resolution into a
//! [`Toolkit`] the provisioning code can act on (`resolve`).

mod resolve;
mod spec;

pub use resolve::{in_request, resolve_request, resolve_request_in, resolve_request_seeded};
pub use spec::*;

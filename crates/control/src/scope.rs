//! Which tier a toolkit's skills serve: the owner tier (the default) or the workspace tier.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    #[default]
    Owner,
    Workspace,
}

impl Scope {
    /// As the wire and the database write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Owner => "owner",
            Scope::Workspace => "workspace",
        }
    }
}

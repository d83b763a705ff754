//! Which tier a toolkit's skills serve: the owner tier (the default) or the workspace tier.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    #[default]
    Owner,
    Workspace,
}

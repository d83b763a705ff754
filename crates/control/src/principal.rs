//! Principals: who a caller is, as ownership and quotas see them. A bearer token is the
//! principal `token:<name>` (a token rotated under the same name is the same principal), a
//! browser session is its token's, stdio is the local user who started the process
//! (`local:<user>`), and `--auth none` makes every caller `anonymous`. A workspace belongs to
//! the principal that opened it: a `client` reaches only its own, an `operator` reaches all.

use crate::input::shown;
use cloud_harness_error::{Code, Error, Result};
use serde::Serialize;

/// What a token may do. `client`: the MCP tools and the API's reads; `operator`: everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Client,
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Operator => "operator",
        }
    }

    pub fn parse(text: &str) -> Result<Role> {
        match text {
            "client" => Ok(Role::Client),
            "operator" => Ok(Role::Operator),
            _ => Err(Error::field(
                Code::InvalidArgument,
                "role",
                format!("{:?} is not a role: `client` or `operator`", shown(text)),
            )),
        }
    }
}

/// Who made a request, as the audit log names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub token_id: String,
    pub name: String,
    pub role: Role,
    /// A browser session's CSRF token, when the request came with its cookie.
    pub csrf: Option<String>,
}

impl Identity {
    pub fn actor(&self) -> String {
        if self.token_id.is_empty() {
            // `--auth none`.
            return self.name.clone();
        }
        format!("token:{}", self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// What ownership records and the audit log name: `token:alice`, `local:root`, `anonymous`.
    pub name: String,
    pub role: Role,
}

impl Principal {
    pub fn of(identity: &Identity) -> Principal {
        Principal {
            name: identity.actor(),
            role: identity.role,
        }
    }

    /// The local user who started this process (stdio, the CLI): an operator, since the
    /// process's home and store are theirs already. Named from the user database, not the
    /// environment, so the name (and with it the idempotency keys) stays the same under a
    /// service manager that sets no `USER`.
    pub fn local() -> Principal {
        let uid = nix::unistd::getuid();
        let user = nix::unistd::User::from_uid(uid)
            .ok()
            .flatten()
            .map_or_else(|| uid.to_string(), |u| u.name);
        Principal {
            name: format!("local:{user}"),
            role: Role::Operator,
        }
    }

    /// A caller no one vouched for: a client that owns and reaches nothing.
    pub fn nobody() -> Principal {
        Principal {
            name: String::new(),
            role: Role::Client,
        }
    }

    pub fn is_operator(&self) -> bool {
        self.role == Role::Operator
    }

    /// Whether this principal may see and act on what `owner` owns. Records from before
    /// owners were kept have the owner `""`: operators only.
    pub fn reaches(&self, owner: &str) -> bool {
        self.is_operator() || (!owner.is_empty() && owner == self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, role: Role) -> Principal {
        Principal {
            name: name.into(),
            role,
        }
    }

    #[test]
    fn clients_reach_their_own_only_and_operators_all() {
        let alice = p("token:alice", Role::Client);
        assert!(alice.reaches("token:alice"));
        assert!(!alice.reaches("token:bob"));
        assert!(!alice.reaches(""));
        let op = p("token:ops", Role::Operator);
        assert!(op.reaches("token:alice") && op.reaches(""));
    }
}

//! Principals: who a caller is, as ownership and quotas see them. A bearer token is the
//! principal `token:<name>` (a token rotated under the same name is the same principal), a
//! browser session is its token's, stdio is the local user who started the process
//! (`local:<user>`), and `--auth none` makes every caller `anonymous`. A workspace belongs to
//! the principal that opened it: a `client` reaches only its own, an `operator` reaches all.

use crate::auth::{Identity, Role};

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

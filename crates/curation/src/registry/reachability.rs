//! An operator's override of the reachability check for one registry entry: the one commit
//! its opens may serve though no branch or tag of its repository reaches it (see
//! `cloud_harness_provision::reach`). Setting or clearing it is one transaction with its audit
//! row (`registry.reachability`).

use cloud_harness_control::audit;
use cloud_harness_control::input::check_text;
use cloud_harness_control::params;
use cloud_harness_control::presets::registry::Entry;
use cloud_harness_control::state::{self, Db};
use cloud_harness_control::toolkit::is_hex_commit;
use cloud_harness_error::{Code, Error, Result};
use serde_json::json;

/// A full commit id, lowercased: the override names exact bytes, never a branch.
pub(super) fn check_commit(commit: &str) -> Result<String> {
    let commit = commit.to_ascii_lowercase();
    match is_hex_commit(&commit) {
        true => Ok(commit),
        false => Err(Error::field(
            Code::InvalidArgument,
            "commit",
            "must be an exact commit id (40 or 64 hex digits)",
        )),
    }
}

/// Lets `entry` serve `commit` though no branch or tag of its repository reaches it, in
/// place of the commit allowed before; `None` takes the override away. `reason` is required
/// when allowing: it is what the audit log shows a reviewer.
pub(super) fn allow_unreachable(
    db: &Db,
    mut entry: Entry,
    commit: Option<&str>,
    reason: Option<&str>,
    actor: &str,
) -> Result<Entry> {
    let id = entry.preset.id.clone();
    let commit = commit.map(check_commit).transpose()?;
    match (commit.is_some(), reason) {
        (_, Some(r)) => check_text("reason", r, 1000)?,
        (true, None) => {
            return Err(Error::field(
                Code::InvalidArgument,
                "reason",
                "say why this commit may be served though its repository does not publish it",
            ))
        }
        (false, None) => {}
    }
    db.write(|tx| {
        tx.execute(
            "UPDATE registry_entries SET allow_unreachable = $1 WHERE id = $2",
            params![commit, id],
        )
        .map_err(state::internal)?;
        audit::record(
            tx,
            actor,
            "registry.reachability",
            &format!("registry:{id}"),
            &json!({ "from": entry.allow_unreachable, "to": commit, "reason": reason }),
        )
    })?;
    entry.allow_unreachable = commit;
    Ok(entry)
}

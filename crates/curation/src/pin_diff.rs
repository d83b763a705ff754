//! What moving a registry entry's pin would change, before it moves: both commits acquired
//! (warm when the store holds them), their bundles compared ([`crate::bundle_diff`]); nothing
//! is pinned. Audited: a comparison may fetch and publish the commits it names.

use crate::bundle_diff::{self, BundleDiff, Side};
use crate::registry;
use cloud_harness_control::audit;
use cloud_harness_control::state::Db;
use cloud_harness_control::toolkit::is_hex_commit;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::{Acquired, Provisioner};
use serde_json::json;

/// What moving the pin of `id` from `from` (the current pin if none) to `to` would change,
/// skill by skill.
pub fn diff(
    db: &Db,
    provisioner: &Provisioner,
    id: &str,
    from: Option<&str>,
    to: &str,
    actor: &str,
) -> Result<BundleDiff> {
    // Both checked before anything is fetched.
    for (field, commit) in [("to", Some(to)), ("from", from)] {
        if commit.is_some_and(|c| !is_hex_commit(c)) {
            return Err(Error::field(
                Code::InvalidArgument,
                field,
                "must be an exact commit id (40 or 64 lowercase hex digits)",
            ));
        }
    }
    let reg = registry::load(db)?;
    let entry = reg.find(id).ok_or_else(|| registry::unknown(id))?;
    let from = match from {
        Some(c) => c.to_owned(),
        None => entry
            .pin
            .as_ref()
            .map(|p| p.commit.clone())
            .ok_or_else(|| {
                Error::field(
                    Code::InvalidArgument,
                    "from",
                    "the entry has no pin: name the commit to compare with",
                )
            })?,
    };
    let old = registry::acquire(provisioner, &reg, id, &from)?;
    let new = registry::acquire(provisioner, &reg, id, to)?;
    let side = |a: &Acquired| Side {
        commit: a.record.key.commit.clone(),
        bundle: a.record.bundle,
    };
    let diff = bundle_diff::diff(
        &provisioner.store,
        &new.record.instance_id,
        &new.record.key.url,
        side(&old),
        side(&new),
    )?;
    audit::event(
        db,
        actor,
        "registry.diff",
        &format!("registry:{id}"),
        &json!({ "from": diff.from, "to": diff.to, "skillsChanged": diff.changes.skills.len() }),
    )?;
    Ok(diff)
}

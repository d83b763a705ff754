//! Signatures kept in the state database (`bundle_signatures`), so every runner of a fleet
//! sharing it sees one as soon as it is added. An operator's `add` is checked against the
//! bundle it names and audited; an `import` (the copy a store of record carries) is kept as it
//! is and judged when a tier is served, like any other.

use super::{check_tier, message, Signed};
use crate::audit;
use crate::params;
use crate::state::{self, Db};
use cloud_harness_error::{Code, Error, Result};
use serde::Serialize;
use serde_json::json;

/// Signatures one bundle may have in one tier (one per key): what `of` reads at an open.
pub const MAX_PER_TIER: usize = 16;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stored {
    pub bundle: String,
    pub tier: String,
    pub url: String,
    pub commit: String,
    /// The signing key's fingerprint (`SHA256:…`).
    pub key: String,
    pub signature: String,
    pub added_by: String,
    /// Milliseconds since the Unix epoch.
    pub added_at: i64,
}

/// What a signature names: the toolkit's repository, its commit, the bundle and the tier.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub url: &'a str,
    pub commit: &'a str,
    pub bundle: &'a str,
    pub tier: &'a str,
}

impl Subject<'_> {
    pub fn message(&self) -> String {
        message(self.url, self.commit, self.bundle, self.tier)
    }
}

/// Adds (or replaces, for the same key) a signature of `subject` that an operator or
/// publisher made; refused unless it signs exactly that bundle in that tier.
pub fn add(db: &Db, subject: Subject, text: &str, actor: &str) -> Result<Stored> {
    check_tier(subject.tier)?;
    let signed = Signed::parse(text)?;
    if !signed.verifies(&subject.message()) {
        return Err(Error::field(
            Code::InvalidArgument,
            "signature",
            format!(
                "does not sign bundle {} of {} at {} in the {} tier (sign the text `cloud-harness signature payload` prints)",
                subject.bundle, subject.url, subject.commit, subject.tier
            ),
        ));
    }
    let key = signed.fingerprint();
    let at = state::now_ms();
    db.write(|tx| {
        let others: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM bundle_signatures WHERE bundle = $1 AND tier = $2 AND key <> $3",
                params![subject.bundle, subject.tier, key],
                |r| r.get(0),
            )
            .map_err(state::internal)?;
        if others as usize >= MAX_PER_TIER {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "bundle {} has {MAX_PER_TIER} signatures in the {} tier already; remove one first",
                    subject.bundle, subject.tier
                ),
            ));
        }
        tx.execute(
            "INSERT INTO bundle_signatures (bundle, tier, key, url, commit_id, signature, added_by, added_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (bundle, tier, key) DO UPDATE SET url = $4, commit_id = $5,
                 signature = $6, added_by = $7, added_at = $8",
            params![subject.bundle, subject.tier, key, subject.url, subject.commit, text.trim(), actor, at],
        )
        .map_err(state::internal)?;
        audit::record(
            tx,
            actor,
            "signature.added",
            &format!("bundle:{}", subject.bundle),
            &json!({ "tier": subject.tier, "url": subject.url, "commit": subject.commit, "key": key }),
        )
    })?;
    Ok(Stored {
        bundle: subject.bundle.to_owned(),
        tier: subject.tier.to_owned(),
        url: subject.url.to_owned(),
        commit: subject.commit.to_owned(),
        key,
        signature: text.trim().to_owned(),
        added_by: actor.to_owned(),
        added_at: at,
    })
}

/// Keeps a signature of `subject` found beside its bundle in the store of record, unless one
/// by the same key is kept already or the tier has its [`MAX_PER_TIER`]; whether it verifies
/// is judged when the tier is served. Text that is not an Ed25519 bundle signature is
/// refused.
pub fn import(db: &Db, subject: Subject, text: &str) -> Result<bool> {
    check_tier(subject.tier)?;
    let key = Signed::parse(text)?.fingerprint();
    db.write(|tx| {
        let n: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM bundle_signatures WHERE bundle = $1 AND tier = $2",
                params![subject.bundle, subject.tier],
                |r| r.get(0),
            )
            .map_err(state::internal)?;
        if n as usize >= MAX_PER_TIER {
            return Ok(false);
        }
        let added = tx
            .execute(
                "INSERT INTO bundle_signatures (bundle, tier, key, url, commit_id, signature, added_by, added_at)
                 VALUES ($1, $2, $3, $4, $5, $6, 'store-of-record', $7) ON CONFLICT DO NOTHING",
                params![subject.bundle, subject.tier, key, subject.url, subject.commit, text.trim(), state::now_ms()],
            )
            .map_err(state::internal)?;
        Ok(added > 0)
    })
}

/// Takes the signature by `key` (a fingerprint) of `bundle` in `tier` away.
pub fn remove(db: &Db, bundle: &str, tier: &str, key: &str, actor: &str) -> Result<()> {
    check_tier(tier)?;
    db.write(|tx| {
        let n = tx
            .execute(
                "DELETE FROM bundle_signatures WHERE bundle = $1 AND tier = $2 AND key = $3",
                params![bundle, tier, key],
            )
            .map_err(state::internal)?;
        if n == 0 {
            return Err(Error::not_found(format!(
                "bundle {bundle} has no signature by {key} in the {tier} tier"
            )));
        }
        audit::record(
            tx,
            actor,
            "signature.removed",
            &format!("bundle:{bundle}"),
            &json!({ "tier": tier, "key": key }),
        )
    })
}

/// The signatures of `bundle` in `tier` (`None`: every tier), oldest first, at most
/// [`MAX_PER_TIER`] a tier.
pub fn of(db: &Db, bundle: &str, tier: Option<&str>) -> Result<Vec<Stored>> {
    db.with(|c| {
        let mut q = c.prepare_cached(
            "SELECT bundle, tier, url, commit_id, key, signature, added_by, added_at
             FROM bundle_signatures
             WHERE bundle = $1 AND (CAST($2 AS TEXT) IS NULL OR tier = $2)
             ORDER BY tier, added_at LIMIT $3",
        )?;
        let rows = q.query_map(
            params![bundle, tier, (MAX_PER_TIER * super::TIERS.len()) as i64],
            |r| {
                Ok(Stored {
                    bundle: r.get(0)?,
                    tier: r.get(1)?,
                    url: r.get(2)?,
                    commit: r.get(3)?,
                    key: r.get(4)?,
                    signature: r.get(5)?,
                    added_by: r.get(6)?,
                    added_at: r.get(7)?,
                })
            },
        )?;
        rows.collect::<state::DbResult<Vec<Stored>>>()
    })
}

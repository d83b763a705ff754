//! Signatures kept in the state database (`bundle_signatures`), so every runner of a fleet
//! sharing it sees one as soon as it is added: one row per bundle, tier, key, repository and
//! commit (a bundle can be the tree of several commits). An operator's `add` is checked
//! against what it names and audited; `remove` leaves the row as a tombstone, so a copy of the
//! signature found later (in the store of record) is not taken again; an `import` takes only
//! a signature that verifies and that the caller's policy would trust.

use super::{canonical, check_tier, PublicKey, Signed, Subject};
use crate::audit;
use crate::params;
use crate::state::{self, Db};
use cloud_harness_error::{Code, Error, Result};
use serde::Serialize;
use serde_json::json;

/// Signatures (not removed) of one subject — a bundle at one commit of one repository, in one
/// tier — at most, one per key: what an open reads.
pub const MAX_PER_SUBJECT: usize = 16;
/// Rows a listing of one bundle shows, at most.
pub const MAX_LISTED: usize = 1000;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stored {
    pub bundle: String,
    pub tier: String,
    /// The repository, as [`canonical`] spells it.
    pub url: String,
    pub commit: String,
    /// The signing key's fingerprint (`SHA256:…`).
    pub key: String,
    pub signature: String,
    pub added_by: String,
    /// Milliseconds since the Unix epoch.
    pub added_at: i64,
}

impl Stored {
    fn new(subject: Subject, signed: &Signed, text: &str, by: &str) -> Stored {
        Stored {
            bundle: subject.bundle.to_owned(),
            tier: subject.tier.to_owned(),
            url: canonical(subject.url),
            commit: subject.commit.to_owned(),
            key: signed.fingerprint(),
            signature: text.trim().to_owned(),
            added_by: by.to_owned(),
            added_at: state::now_ms(),
        }
    }
}

/// Adds (or replaces, for the same key and subject) a signature an operator or publisher
/// made; refused unless it signs exactly `subject`.
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
    let row = Stored::new(subject, &signed, text, actor);
    db.write(|tx| {
        if others(tx, &row)? >= MAX_PER_SUBJECT {
            return Err(Error::conflict(format!(
                "bundle {} at {} has {MAX_PER_SUBJECT} signatures in the {} tier already; remove one first",
                row.bundle, row.commit, row.tier
            )));
        }
        tx.execute(
            "INSERT INTO bundle_signatures (bundle, tier, key, url, commit_id, signature, added_by, added_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (bundle, tier, key, url, commit_id) DO UPDATE SET signature = $6,
                 added_by = $7, added_at = $8, removed_by = NULL, removed_at = NULL",
            params![row.bundle, row.tier, row.key, row.url, row.commit, row.signature, row.added_by, row.added_at],
        )
        .map_err(state::internal)?;
        audit::record(
            tx,
            actor,
            "signature.added",
            &format!("bundle:{}", row.bundle),
            &json!({ "tier": row.tier, "url": row.url, "commit": row.commit, "key": row.key }),
        )
    })?;
    Ok(row)
}

/// The live signatures of the row's subject by other keys.
fn others(tx: &state::Conn, row: &Stored) -> Result<usize> {
    let n: i64 = tx
        .query_row(
            "SELECT COUNT(*) FROM bundle_signatures
             WHERE bundle = $1 AND tier = $2 AND url = $3 AND commit_id = $4
               AND key <> $5 AND removed_at IS NULL",
            params![row.bundle, row.tier, row.url, row.commit, row.key],
            |r| r.get(0),
        )
        .map_err(state::internal)?;
    Ok(n as usize)
}

/// Keeps a signature of `subject` found beside its bundle in the store of record, when it
/// verifies, is by a key `trusted` accepts, and no row for that key and subject exists (a
/// removed one included) and the tier has room. Whether it was kept.
pub fn import(
    db: &Db,
    subject: Subject,
    text: &str,
    trusted: impl Fn(&PublicKey) -> bool,
) -> Result<bool> {
    check_tier(subject.tier)?;
    let signed = Signed::parse(text)?;
    if !trusted(&signed.key()) || !signed.verifies(&subject.message()) {
        return Ok(false);
    }
    let row = Stored::new(subject, &signed, text, "store-of-record");
    db.write(|tx| {
        if others(tx, &row)? >= MAX_PER_SUBJECT {
            return Ok(false);
        }
        let added = tx
            .execute(
                "INSERT INTO bundle_signatures (bundle, tier, key, url, commit_id, signature, added_by, added_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                params![row.bundle, row.tier, row.key, row.url, row.commit, row.signature, row.added_by, row.added_at],
            )
            .map_err(state::internal)?;
        Ok(added > 0)
    })
}

/// Withdraws the signatures by `key` (a fingerprint) of `bundle` in `tier` — of one commit of
/// one repository when `only` names it, else of every one; the rows stay as tombstones until
/// the key signs again. How many were withdrawn.
pub fn remove(
    db: &Db,
    bundle: &str,
    tier: &str,
    key: &str,
    only: Option<(&str, &str)>,
    actor: &str,
) -> Result<usize> {
    check_tier(tier)?;
    let url = only.map(|(u, _)| canonical(u));
    let commit = only.map(|(_, c)| c);
    db.write(|tx| {
        let n = tx
            .execute(
                "UPDATE bundle_signatures SET removed_by = $1, removed_at = $2
                 WHERE bundle = $3 AND tier = $4 AND key = $5 AND removed_at IS NULL
                   AND (CAST($6 AS TEXT) IS NULL OR url = $6)
                   AND (CAST($7 AS TEXT) IS NULL OR commit_id = $7)",
                params![actor, state::now_ms(), bundle, tier, key, url, commit],
            )
            .map_err(state::internal)?;
        if n == 0 {
            return Err(Error::not_found(format!(
                "bundle {bundle} has no signature by {key} in the {tier} tier{}",
                if only.is_some() {
                    " at that commit"
                } else {
                    ""
                }
            )));
        }
        audit::record(
            tx,
            actor,
            "signature.removed",
            &format!("bundle:{bundle}"),
            &json!({ "tier": tier, "key": key, "url": url, "commit": commit, "signatures": n }),
        )?;
        Ok(n as usize)
    })
}

/// The live signatures of `subject`, oldest first, at most [`MAX_PER_SUBJECT`].
pub fn of_subject(db: &Db, subject: Subject) -> Result<Vec<Stored>> {
    let url = canonical(subject.url);
    select(
        db,
        "SELECT bundle, tier, url, commit_id, key, signature, added_by, added_at
         FROM bundle_signatures
         WHERE bundle = $1 AND tier = $2 AND url = $3 AND commit_id = $4 AND removed_at IS NULL
         ORDER BY added_at LIMIT $5",
        params![
            subject.bundle,
            subject.tier,
            url,
            subject.commit,
            MAX_PER_SUBJECT as i64
        ],
    )
}

/// The live signatures of `bundle`, every commit and tier, at most [`MAX_LISTED`].
pub fn of_bundle(db: &Db, bundle: &str) -> Result<Vec<Stored>> {
    select(
        db,
        "SELECT bundle, tier, url, commit_id, key, signature, added_by, added_at
         FROM bundle_signatures WHERE bundle = $1 AND removed_at IS NULL
         ORDER BY tier, url, commit_id, added_at LIMIT $2",
        params![bundle, MAX_LISTED as i64],
    )
}

fn select(db: &Db, sql: &str, params: &[&dyn state::Param]) -> Result<Vec<Stored>> {
    db.with(|c| {
        let mut q = c.prepare_cached(sql)?;
        let rows = q.query_map(params, |r| {
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
        })?;
        rows.collect::<state::DbResult<Vec<Stored>>>()
    })
}

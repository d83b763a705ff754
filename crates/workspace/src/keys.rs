//! Workspaces in the state database: one row per workspace with its owner (a principal) and
//! idempotency key, unique per owner, so one key makes one workspace even across processes,
//! and two principals using the same key never meet. A row is `opening` from the moment
//! its key is claimed until its record is on disk, then `open`; closing deletes it. Each row
//! names the runner whose disk holds the workspace (a fleet shares one database; rows from
//! before runners were named have none and belong to whoever holds the home).

use cloud_harness_control::params;
use cloud_harness_control::state::Optional;
use cloud_harness_control::state::{self, Db};
use cloud_harness_error::{Error, Result};
use cloud_harness_store::cas::Digest;

/// What a key is bound to.
pub struct Bound {
    pub digest: Digest,
    pub workspace: String,
    pub opening: bool,
    /// The runner that holds it.
    pub runner: String,
}

pub fn find(db: &Db, owner: &str, key: &str) -> Result<Option<Bound>> {
    let row: Option<(String, String, String, String)> = db.with(|c| {
        c.prepare_cached(
            "SELECT request_digest, id, state, runner FROM workspaces WHERE owner = $1 AND idempotency_key = $2",
        )?
        .query_row(params![owner, key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()
    })?;
    row.map(|(digest, workspace, st, runner)| {
        Ok(Bound {
            digest: Digest::parse(&digest)?,
            workspace,
            opening: st == "opening",
            runner: if runner.is_empty() {
                db.runner().to_owned()
            } else {
                runner
            },
        })
    })
    .transpose()
}

/// What a claim of a key found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The key is bound to the new workspace.
    Claimed,
    /// Another process bound it first.
    Taken,
    /// The owner has `max` workspaces (open or opening) already.
    Full,
}

/// Binds `owner`'s `key` to the new workspace `id`, unless the key is bound already or the
/// owner has `max` workspaces (counted in the same transaction, so concurrent opens, on this
/// runner or others, cannot pass the limit together).
pub(crate) fn claim(
    db: &Db,
    owner: &str,
    key: &str,
    digest: &Digest,
    id: &str,
    max: u64,
) -> Result<Claim> {
    db.write(|tx| {
        let bound: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM workspaces WHERE owner = $1 AND idempotency_key = $2",
                params![owner, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(state::internal)?;
        if bound.is_some() {
            return Ok(Claim::Taken);
        }
        let held: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM workspaces WHERE owner = $1",
                params![owner],
                |r| r.get(0),
            )
            .map_err(state::internal)?;
        if held as u64 >= max {
            return Ok(Claim::Full);
        }
        tx.execute(
            "INSERT INTO workspaces (id, owner, idempotency_key, request_digest, state, created_at, runner)
             VALUES ($1, $2, $3, $4, 'opening', $5, $6)",
            params![id, owner, key, digest.to_string(), state::now_ms(), db.runner()],
        )
        .map_err(state::internal)?;
        Ok(Claim::Claimed)
    })
}

/// The workspace's record is on disk: it is open.
pub fn opened(db: &Db, id: &str) -> Result<()> {
    db.write(|tx| {
        tx.execute(
            "UPDATE workspaces SET state = 'open' WHERE id = $1",
            params![id],
        )
        .map_err(state::internal)?;
        Ok(())
    })
}

/// Frees the workspace's key (closed, or its open failed).
pub fn release(db: &Db, id: &str) -> Result<()> {
    db.write(|tx| {
        tx.execute("DELETE FROM workspaces WHERE id = $1", params![id])
            .map_err(state::internal)?;
        Ok(())
    })
}

/// Frees the key of the workspace `id` if its row was made before `before_ms` (a half-made
/// workspace found at start-up; an open made since then is left alone).
pub(crate) fn release_stale(db: &Db, id: &str, before_ms: i64) -> Result<()> {
    db.write(|tx| {
        tx.execute(
            "DELETE FROM workspaces WHERE id = $1 AND created_at < $2",
            params![id, before_ms],
        )
        .map_err(state::internal)?;
        Ok(())
    })
}

/// A workspace found on disk at start-up (its record written before the database held keys,
/// or the row is there already): its key bound to it. An error when the key is bound to
/// another workspace.
pub(crate) fn adopt(
    db: &Db,
    id: &str,
    owner: &str,
    key: &str,
    digest: &Digest,
    created_secs: u64,
) -> Result<()> {
    db.write(|tx| {
        tx.execute(
            "INSERT INTO workspaces (id, owner, idempotency_key, request_digest, state, created_at, runner)
             VALUES ($1, $2, $3, $4, 'open', $5, $6) ON CONFLICT DO NOTHING",
            params![id, owner, key, digest.to_string(), created_secs as i64 * 1000, db.runner()],
        )
        .map_err(state::internal)?;
        tx.execute(
            // Parameters numbered in the order they appear: SQLite numbers `$n` by appearance.
            "UPDATE workspaces SET state = 'open', runner = $1 WHERE id = $2",
            params![db.runner(), id],
        )
        .map_err(state::internal)?;
        let holder: String = tx
            .query_row(
                "SELECT id FROM workspaces WHERE owner = $1 AND idempotency_key = $2",
                params![owner, key],
                |r| r.get(0),
            )
            .map_err(state::internal)?;
        if holder != id {
            return Err(Error::internal(format!(
                "idempotency key {key:?} of workspace {id} belongs to workspace {holder} in the state database"
            )));
        }
        Ok(())
    })
}

/// Every workspace the database knows on this runner.
pub fn mine(db: &Db) -> Result<Vec<String>> {
    db.with(|c| {
        c.prepare_cached("SELECT id FROM workspaces WHERE runner = $1 OR runner = '' ORDER BY id")?
            .query_map(params![db.runner()], |r| r.get(0))?
            .collect()
    })
}

//! Workspaces in the state database: one row per workspace with its idempotency key, unique,
//! so one key makes one workspace even across processes. A row is `opening` from the moment
//! its key is claimed until its record is on disk, then `open`; closing deletes it. Each row
//! names the runner whose disk holds the workspace (a fleet shares one database; rows from
//! before runners were named have none and belong to whoever holds the home).

use crate::params;
use crate::state::Optional;
use crate::state::{self, Db};
use cloud_harness_fs::cas::Digest;
use cloud_harness_fs::{Error, Result};

/// What a key is bound to.
pub struct Bound {
    pub digest: Digest,
    pub workspace: String,
    pub opening: bool,
    /// The runner that holds it.
    pub runner: String,
}

pub fn find(db: &Db, key: &str) -> Result<Option<Bound>> {
    let row: Option<(String, String, String, String)> = db.with(|c| {
        c.prepare_cached(
            "SELECT request_digest, id, state, runner FROM workspaces WHERE idempotency_key = $1",
        )?
        .query_row(params![key], |r| {
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

/// Binds `key` to the new workspace `id`; `false` if another process bound it first.
pub fn claim(db: &Db, key: &str, digest: &Digest, id: &str) -> Result<bool> {
    db.write(|tx| {
        let n = tx
            .execute(
                "INSERT INTO workspaces (id, idempotency_key, request_digest, state, created_at, runner)
                 VALUES ($1, $2, $3, 'opening', $4, $5) ON CONFLICT DO NOTHING",
                params![id, key, digest.to_string(), state::now_ms(), db.runner()],
            )
            .map_err(state::internal)?;
        Ok(n == 1)
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

/// A workspace found on disk at start-up (its record written before the database held keys,
/// or the row is there already): its key bound to it. An error when the key is bound to
/// another workspace.
pub fn adopt(db: &Db, id: &str, key: &str, digest: &Digest, created_secs: u64) -> Result<()> {
    db.write(|tx| {
        tx.execute(
            "INSERT INTO workspaces (id, idempotency_key, request_digest, state, created_at, runner)
             VALUES ($1, $2, $3, 'open', $4, $5) ON CONFLICT DO NOTHING",
            params![id, key, digest.to_string(), created_secs as i64 * 1000, db.runner()],
        )
        .map_err(state::internal)?;
        tx.execute(
            "UPDATE workspaces SET state = 'open', runner = $2 WHERE id = $1",
            params![id, db.runner()],
        )
        .map_err(state::internal)?;
        let owner: String = tx
            .query_row(
                "SELECT id FROM workspaces WHERE idempotency_key = $1",
                params![key],
                |r| r.get(0),
            )
            .map_err(state::internal)?;
        if owner != id {
            return Err(Error::internal(format!(
                "idempotency key {key:?} of workspace {id} belongs to workspace {owner} in the state database"
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

//! Workspaces in the state database: one row per workspace with its idempotency key, unique,
//! so one key makes one workspace even across processes. A row is `opening` from the moment
//! its key is claimed until its record is on disk, then `open`; closing deletes it.

use crate::state::{self, Db};
use cloud_harness_fs::cas::Digest;
use cloud_harness_fs::{Error, Result};
use rusqlite::{params, OptionalExtension};

/// What a key is bound to.
pub struct Bound {
    pub digest: Digest,
    pub workspace: String,
    pub opening: bool,
}

pub fn find(db: &Db, key: &str) -> Result<Option<Bound>> {
    let row: Option<(String, String, String)> = db.with(|c| {
        c.prepare_cached(
            "SELECT request_digest, id, state FROM workspaces WHERE idempotency_key = $1",
        )?
        .query_row(params![key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()
    })?;
    row.map(|(digest, workspace, st)| {
        Ok(Bound {
            digest: Digest::parse(&digest)?,
            workspace,
            opening: st == "opening",
        })
    })
    .transpose()
}

/// Binds `key` to the new workspace `id`; `false` if another process bound it first.
pub fn claim(db: &Db, key: &str, digest: &Digest, id: &str) -> Result<bool> {
    db.write(|tx| {
        let n = tx
            .execute(
                "INSERT INTO workspaces (id, idempotency_key, request_digest, state, created_at)
                 VALUES ($1, $2, $3, 'opening', $4) ON CONFLICT DO NOTHING",
                params![id, key, digest.to_string(), state::now_ms()],
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
            "INSERT INTO workspaces (id, idempotency_key, request_digest, state, created_at)
             VALUES ($1, $2, $3, 'open', $4) ON CONFLICT DO NOTHING",
            params![id, key, digest.to_string(), created_secs as i64 * 1000],
        )
        .map_err(state::internal)?;
        tx.execute("UPDATE workspaces SET state = 'open' WHERE id = $1", params![id])
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

/// Every workspace the database knows.
pub fn all(db: &Db) -> Result<Vec<String>> {
    db.with(|c| {
        c.prepare_cached("SELECT id FROM workspaces ORDER BY id")?
            .query_map([], |r| r.get(0))?
            .collect()
    })
}

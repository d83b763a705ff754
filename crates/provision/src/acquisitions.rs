//! The history of every acquisition — those `workspace_open` makes and those import jobs make
//! — with the toolkit, URL, commit, mode, duration, bytes fetched, skill count and result (or
//! the error and its code).

use crate::Acquired;
use cloud_harness_control::params;
use cloud_harness_control::state::{self, Db};
use cloud_harness_control::toolkit::Toolkit;
use cloud_harness_error::Result;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Acquisition {
    pub seq: i64,
    pub at: i64,
    pub toolkit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    pub url: String,
    /// What was asked for: a commit, a tag, or the default branch head.
    pub requested: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    pub millis: i64,
    pub bytes: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skills: Option<i64>,
    /// `ok` or `error`.
    pub result: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    pub actor: String,
    /// `workspace_open` or `import`.
    pub via: String,
    /// The workspace or the import job it was for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The tier the toolkit was for (`owner` or `workspace`); none in rows from before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

/// Records one acquisition's outcome; a failure to record is logged, never the caller's.
pub fn record(
    db: &Db,
    toolkit: &Toolkit,
    outcome: &Result<Acquired>,
    millis: u64,
    actor: &str,
    via: &str,
    subject: Option<&str>,
) {
    let took = std::time::Duration::from_millis(millis);
    match outcome {
        Ok(a) => {
            cloud_harness_control::metrics::acquisition(a.mode, "ok", took, a.bytes);
            tracing::info!(toolkit = %toolkit.instance_id, mode = a.mode, millis, bytes = a.bytes, via, "acquired");
        }
        Err(e) => {
            cloud_harness_control::metrics::acquisition("failed", e.code.as_str(), took, 0);
            tracing::info!(toolkit = %toolkit.instance_id, code = e.code.as_str(), millis, via, "acquisition failed");
        }
    }
    let (commit, bundle, mode, bytes, skills, code, message) = match outcome {
        Ok(a) => (
            Some(a.record.key.commit.clone()),
            Some(a.record.bundle.to_string()),
            Some(a.mode.to_owned()),
            a.bytes as i64,
            Some(a.record.skills as i64),
            None,
            None,
        ),
        Err(e) => (
            None,
            None,
            None,
            0,
            None,
            Some(e.code.as_str()),
            Some(e.message.clone()),
        ),
    };
    let written = db.write(|tx| {
        tx.execute(
            "INSERT INTO acquisitions (at, toolkit, preset, url, requested, commit_id, bundle, mode, millis, bytes, skills,
                 result, error_code, error_message, actor, via, subject, tier)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
            params![
                state::now_ms(),
                toolkit.instance_id,
                toolkit.preset,
                toolkit.url,
                crate::index::describe(&toolkit.revision),
                commit,
                bundle,
                mode,
                millis as i64,
                bytes,
                skills,
                if outcome.is_ok() { "ok" } else { "error" },
                code,
                message,
                actor,
                via,
                subject,
                toolkit.scope.as_str(),
            ],
        )
        .map_err(state::internal)?;
        // Every so often the history is cut to its newest KEPT rows, so it cannot grow
        // without end (opening and closing workspaces in a loop adds rows).
        if RECORDED.fetch_add(1, Ordering::Relaxed).is_multiple_of(PRUNE_EVERY) {
            // In steps of at most PRUNE_STEP rows: one statement stays short however far
            // behind the history is (a statement has a time limit on PostgreSQL).
            tx.execute(
                "DELETE FROM acquisitions WHERE seq IN (SELECT seq FROM acquisitions
                     WHERE seq <= (SELECT MAX(seq) FROM acquisitions) - $1 ORDER BY seq LIMIT $2)",
                params![KEPT, PRUNE_STEP],
            )
            .map_err(state::internal)?;
        }
        Ok(())
    });
    if let Err(e) = written {
        tracing::error!(error = %e, "cannot record an acquisition");
    }
}

/// The acquisition history keeps this many rows, the newest.
pub const KEPT: i64 = 100_000;
const PRUNE_EVERY: u64 = 1024;
const PRUNE_STEP: i64 = 10_000;
static RECORDED: AtomicU64 = AtomicU64::new(0);

/// The history, newest first, before `before` (a `seq`), at most `limit`; the `seq` to go on
/// from when there is more.
pub fn list(db: &Db, before: Option<i64>, limit: usize) -> Result<(Vec<Acquisition>, Option<i64>)> {
    let mut all = db.with(|c| {
        c.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM acquisitions WHERE (CAST($1 AS BIGINT) IS NULL OR seq < $1) ORDER BY seq DESC LIMIT $2"
        ))?
        .query_map(params![before, (limit + 1) as i64], row)?
        .collect::<state::DbResult<Vec<_>>>()
    })?;
    let more = all.len() > limit;
    all.truncate(limit);
    let next = more.then(|| all.last().map(|a| a.seq)).flatten();
    Ok((all, next))
}

/// The acquisitions that served `bundle` (a digest's text), newest first, at most `limit`:
/// which workspaces and imports held it, and when, open or closed since.
pub fn of_bundle(db: &Db, bundle: &str, limit: usize) -> Result<Vec<Acquisition>> {
    db.with(|c| {
        c.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM acquisitions WHERE bundle = $1 AND result = 'ok' ORDER BY seq DESC LIMIT $2"
        ))?
        .query_map(params![bundle, limit as i64], row)?
        .collect::<state::DbResult<Vec<_>>>()
    })
}

const COLUMNS: &str =
    "seq, at, toolkit, preset, url, requested, commit_id, bundle, mode, millis, bytes, skills,
     result, error_code, error_message, actor, via, subject, tier";

fn row(r: &state::Row) -> state::DbResult<Acquisition> {
    Ok(Acquisition {
        seq: r.get(0)?,
        at: r.get(1)?,
        toolkit: r.get(2)?,
        preset: r.get(3)?,
        url: r.get(4)?,
        requested: r.get(5)?,
        commit: r.get(6)?,
        bundle: r.get(7)?,
        mode: r.get(8)?,
        millis: r.get(9)?,
        bytes: r.get(10)?,
        skills: r.get(11)?,
        result: r.get(12)?,
        error_code: r.get(13)?,
        error_message: r.get(14)?,
        actor: r.get(15)?,
        via: r.get(16)?,
        subject: r.get(17)?,
        tier: r.get(18)?,
    })
}

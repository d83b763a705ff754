//! Skill uses in the state database: each flush's counts as rows of `usage_events` (one per
//! key and flush, the file named) and added to the day's row of `usage_daily` (per source,
//! workspace, principal, toolkit, commit, bundle, tier and skill), in one transaction. The
//! retention deletes events older than `usage.retention_days` and daily rows older than
//! `usage.daily_retention_days`: the days outlive the events they sum.

use super::{Batch, Key, Source};
use crate::params;
use crate::state::{self, Db};
use cloud_harness_error::Result;
use serde::Serialize;

/// How long events and daily rows are kept, in days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub events_days: i64,
    pub daily_days: i64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            events_days: 30,
            daily_days: 400,
        }
    }
}

const DAY_MS: i64 = 24 * 3600 * 1000;

/// The UTC day of `ms` (milliseconds since the Unix epoch), `YYYY-MM-DD`.
pub fn day_of(ms: i64) -> String {
    let days = ms.div_euclid(DAY_MS);
    // Howard Hinnant's civil-from-days, for the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Writes a batch: its events and its days, together or not at all.
pub fn flush(db: &Db, batch: &Batch) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    db.write(|tx| {
        for (k, t) in batch {
            let failures = t.failures as i64;
            let duration = t.duration_ms.min(i64::MAX as u64) as i64;
            tx.execute(
                "INSERT INTO usage_events (at, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, file, uses, failures, duration_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                params![
                    t.last_ms,
                    k.source.as_str(),
                    k.workspace,
                    k.principal,
                    k.toolkit,
                    k.commit,
                    k.bundle,
                    k.tier,
                    k.skill,
                    k.file,
                    t.uses as i64,
                    failures,
                    duration
                ],
            )
            .map_err(state::internal)?;
            tx.execute(
                "INSERT INTO usage_daily (day, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, uses, failures, duration_ms, last_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                 ON CONFLICT (day, source, workspace, principal, toolkit, commit_id, bundle, tier, skill) DO UPDATE SET
                   uses = usage_daily.uses + excluded.uses,
                   failures = usage_daily.failures + excluded.failures,
                   duration_ms = usage_daily.duration_ms + excluded.duration_ms,
                   last_at = CASE WHEN excluded.last_at > usage_daily.last_at THEN excluded.last_at ELSE usage_daily.last_at END",
                params![
                    day_of(t.last_ms),
                    k.source.as_str(),
                    k.workspace,
                    k.principal,
                    k.toolkit,
                    k.commit,
                    k.bundle,
                    k.tier,
                    k.skill,
                    t.uses as i64,
                    failures,
                    duration,
                    t.last_ms
                ],
            )
            .map_err(state::internal)?;
        }
        Ok(())
    })
}

/// Takes what was counted and writes it; put back when the database refuses it (the next
/// flush tries again).
pub fn flush_counted(db: &Db) -> Result<()> {
    let batch = super::take();
    flush(db, &batch).inspect_err(|_| super::put_back(batch))
}

/// Deletes what is older than `retention` at `now_ms`; returns the events and days deleted.
pub fn retain(db: &Db, retention: Retention, now_ms: i64) -> Result<(u64, u64)> {
    let events_before = now_ms - retention.events_days.max(1) * DAY_MS;
    let days_before = day_of(now_ms - retention.daily_days.max(1) * DAY_MS);
    db.write(|tx| {
        let events = tx
            .execute(
                "DELETE FROM usage_events WHERE at < $1",
                params![events_before],
            )
            .map_err(state::internal)?;
        let days = tx
            .execute(
                "DELETE FROM usage_daily WHERE day < $1",
                params![days_before],
            )
            .map_err(state::internal)?;
        Ok((events, days))
    })
}

/// One day's uses of one skill from one source (summed over workspaces and principals).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Day {
    pub day: String,
    pub toolkit: String,
    pub skill: String,
    pub source: &'static str,
    pub uses: i64,
    pub failures: i64,
    pub workspaces: i64,
    pub principals: i64,
}

/// The days from `since` (`YYYY-MM-DD`) on, oldest first.
pub fn days(db: &Db, since: &str) -> Result<Vec<Day>> {
    db.with(|c| {
        let mut q = c.prepare_cached(
            "SELECT day, toolkit, skill, source, CAST(SUM(uses) AS BIGINT), CAST(SUM(failures) AS BIGINT),
                    COUNT(DISTINCT workspace), COUNT(DISTINCT principal)
             FROM usage_daily WHERE day >= $1
             GROUP BY day, toolkit, skill, source
             ORDER BY day, toolkit, skill, source",
        )?;
        let rows = q.query_map(params![since], |r| {
            let source: String = r.get(3)?;
            Ok(Day {
                day: r.get(0)?,
                toolkit: r.get(1)?,
                skill: r.get(2)?,
                source: Source::parse(&source).map_or("unknown", Source::as_str),
                uses: r.get(4)?,
                failures: r.get(5)?,
                workspaces: r.get(6)?,
                principals: r.get(7)?,
            })
        })?;
        rows.collect()
    })
}

/// The events of `workspace`, oldest first: each key of each flush.
pub fn events(db: &Db, workspace: &str) -> Result<Vec<(i64, Key, i64, i64)>> {
    db.with(|c| {
        let mut q = c.prepare_cached(
            "SELECT at, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, file, uses, failures
             FROM usage_events WHERE workspace = $1 ORDER BY at, skill, file, source",
        )?;
        let rows = q.query_map(params![workspace], |r| {
            let source: String = r.get(1)?;
            Ok((
                r.get(0)?,
                Key {
                    source: Source::parse(&source).unwrap_or(Source::Read),
                    workspace: r.get(2)?,
                    principal: r.get(3)?,
                    toolkit: r.get(4)?,
                    commit: r.get(5)?,
                    bundle: r.get(6)?,
                    tier: r.get(7)?,
                    skill: r.get(8)?,
                    file: r.get(9)?,
                },
                r.get(10)?,
                r.get(11)?,
            ))
        })?;
        rows.collect()
    })
}

//! Skill uses in the state database: each flush adds its counts to the hour's row of
//! `usage_events` (one per key and hour, the file named) and to the day's row of
//! `usage_daily` (per source, workspace, principal, toolkit, commit, bundle, tier and skill),
//! a few hundred keys a transaction, and moves the skill's last day in `usage_skills` (what
//! the usage view walks) forward. The retention deletes events older than
//! `usage.retention_days` and daily rows older than `usage.daily_retention_days`, an hour or a
//! day at a time (the days outlive the events they sum), then the skills with no day left.

use super::{Batch, Key};
use crate::state::{self, Conn, Db, Param};
use cloud_harness_error::{Error, Result};
use std::collections::BTreeMap;

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

/// A day, in milliseconds.
pub(crate) const DAY_MS: i64 = 24 * 3600 * 1000;

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

/// Keys written per transaction: a flush never holds the database's one writer (on
/// PostgreSQL, the fleet's write lock) for long, whatever the batch.
pub const CHUNK: usize = 200;
const HOUR_MS: i64 = 3600 * 1000;

/// Writes a batch, [`CHUNK`] keys a transaction, each key added to its hour's event row and
/// its day's row. On an error, what was not written is handed back (what was, stays).
pub fn flush(db: &Db, batch: Batch) -> std::result::Result<(), (Error, Batch)> {
    let mut rest = batch;
    while !rest.is_empty() {
        let chunk: Batch = rest.drain(..rest.len().min(CHUNK)).collect();
        if let Err(e) = db.write(|tx| write_chunk(tx, &chunk)) {
            rest.extend(chunk);
            return Err((e, rest));
        }
    }
    Ok(())
}

/// `n` rows of `width` parameters: `($1, …, $width), ($width+1, …)`, numbered in order.
fn rows(n: usize, width: usize) -> String {
    (0..n)
        .map(|r| {
            let row: Vec<String> = (1..=width).map(|c| format!("${}", r * width + c)).collect();
            format!("({})", row.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn write_chunk(tx: &Conn, chunk: &Batch) -> Result<()> {
    let mut events: Vec<Box<dyn Param>> = Vec::with_capacity(chunk.len() * WIDTH);
    // The day's rows, summed first (two keys differing only by their file share one): one
    // statement may not touch a row twice.
    let mut merged: BTreeMap<Vec<String>, (i64, i64, i64, i64)> = BTreeMap::new();
    for (k, t) in chunk {
        let (uses, failures) = (t.uses as i64, t.failures as i64);
        let duration = t.duration_ms.min(i64::MAX as u64) as i64;
        events.extend(event_params(t.last_ms.div_euclid(HOUR_MS) * HOUR_MS, k));
        events.extend([uses, failures, duration].map(|n| Box::new(n) as Box<dyn Param>));
        let mut id = vec![day_of(t.last_ms)];
        id.extend(daily_fields(k));
        let day = merged.entry(id).or_default();
        day.0 += uses;
        day.1 += failures;
        day.2 = day.2.saturating_add(duration);
        day.3 = day.3.max(t.last_ms);
    }
    upsert(tx, EVENTS, EVENTS_CONFLICT, WIDTH, events)?;
    let mut daily: Vec<Box<dyn Param>> = Vec::with_capacity(merged.len() * WIDTH);
    // Each skill's last day among the chunk's (the id is day, source, …, toolkit at 4, skill at 8).
    let mut skills: BTreeMap<(String, String), String> = BTreeMap::new();
    for (id, (uses, failures, duration, last)) in merged {
        let day = skills.entry((id[4].clone(), id[8].clone())).or_default();
        if id[0] > *day {
            day.clone_from(&id[0]);
        }
        daily.extend(id.into_iter().map(|f| Box::new(f) as Box<dyn Param>));
        daily.extend([uses, failures, duration, last].map(|n| Box::new(n) as Box<dyn Param>));
    }
    upsert(tx, DAILY, DAILY_CONFLICT, WIDTH, daily)?;
    upsert_skills(tx, skills.into_iter().map(|((t, s), day)| (t, s, day)))
}

/// Each (toolkit, skill, day) made the skill's last day if it is newer.
fn upsert_skills(tx: &Conn, skills: impl Iterator<Item = (String, String, String)>) -> Result<()> {
    let fields: Vec<Box<dyn Param>> = skills
        .flat_map(|(toolkit, skill, day)| [toolkit, skill, day])
        .map(|f| Box::new(f) as Box<dyn Param>)
        .collect();
    upsert(tx, SKILLS, SKILLS_CONFLICT, 3, fields)
}

const EVENTS: &str = "INSERT INTO usage_events (at, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, file, uses, failures, duration_ms) VALUES";
const EVENTS_CONFLICT: &str = "ON CONFLICT (at, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, file) DO UPDATE SET
   uses = usage_events.uses + excluded.uses,
   failures = usage_events.failures + excluded.failures,
   duration_ms = usage_events.duration_ms + excluded.duration_ms";
const DAILY: &str = "INSERT INTO usage_daily (day, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, uses, failures, duration_ms, last_at) VALUES";
const DAILY_CONFLICT: &str = "ON CONFLICT (day, source, workspace, principal, toolkit, commit_id, bundle, tier, skill) DO UPDATE SET
   uses = usage_daily.uses + excluded.uses,
   failures = usage_daily.failures + excluded.failures,
   duration_ms = usage_daily.duration_ms + excluded.duration_ms,
   last_at = CASE WHEN excluded.last_at > usage_daily.last_at THEN excluded.last_at ELSE usage_daily.last_at END";
// (Written only when the day is newer: a skill's row is not rewritten by every flush.)
const SKILLS: &str = "INSERT INTO usage_skills (toolkit, skill, last_day) VALUES";
const SKILLS_CONFLICT: &str =
    "ON CONFLICT (toolkit, skill) DO UPDATE SET last_day = excluded.last_day
   WHERE excluded.last_day > usage_skills.last_day";

/// The events' and the days' rows have this many columns.
const WIDTH: usize = 13;
/// The statements' sizes, in rows: a few statements of a few shapes, each prepared once per
/// connection, rather than one of a new shape for each chunk.
const SIZES: [usize; 4] = [64, 16, 4, 1];

/// `params` (`width` a row) upserted by `insert … VALUES (…), … conflict`, in statements of
/// [`SIZES`] rows.
fn upsert(
    tx: &Conn,
    insert: &str,
    conflict: &str,
    width: usize,
    params: Vec<Box<dyn Param>>,
) -> Result<()> {
    let mut at = 0;
    let rows_in = params.len() / width;
    for size in SIZES {
        while rows_in - at >= size {
            let sql = format!("{insert} {} {conflict}", rows(size, width));
            let slice = &params[at * width..(at + size) * width];
            let refs: Vec<&dyn Param> = slice.iter().map(|p| p.as_ref()).collect();
            tx.execute(&sql, &refs).map_err(state::internal)?;
            at += size;
        }
    }
    Ok(())
}

/// A key's fields as an event row starts: the hour, then the key with its file.
fn event_params(hour: i64, k: &Key) -> Vec<Box<dyn Param>> {
    let mut out: Vec<Box<dyn Param>> = vec![Box::new(hour)];
    let mut fields = daily_fields(k);
    fields.push(k.file.clone());
    out.extend(fields.into_iter().map(|f| Box::new(f) as Box<dyn Param>));
    out
}

/// A key's fields as a day's row names them (no file).
fn daily_fields(k: &Key) -> Vec<String> {
    vec![
        k.source.as_str().to_owned(),
        k.workspace.clone(),
        k.principal.clone(),
        k.toolkit.clone(),
        k.commit.clone(),
        k.bundle.clone(),
        k.tier.clone(),
        k.skill.clone(),
    ]
}

/// Takes what was counted and writes it; what the database refused is put back for the next
/// flush, unless `give_up` (it refused for long enough): then it is counted as dropped.
pub fn flush_counted(db: &Db, give_up: bool) -> Result<()> {
    flush(db, super::take()).map_err(|(e, rest)| {
        match give_up {
            true => super::drop_batch(&rest),
            false => super::put_back(rest),
        }
        e
    })
}

/// The most rows one retention deletes in a transaction: a bucket (an hour of events, a day
/// of sums) at a time, never one long statement.
const RETAIN_STEPS: usize = 10_000;

/// Deletes what is older than `retention` at `now_ms`, an hour (events) or a day (sums) a
/// transaction; returns the events and days deleted.
pub fn retain(db: &Db, retention: Retention, now_ms: i64) -> Result<(u64, u64)> {
    let events_before = now_ms - retention.events_days.max(1) * DAY_MS;
    let days_before = day_of(now_ms - retention.daily_days.max(1) * DAY_MS);
    let events = delete_oldest(
        db,
        "DELETE FROM usage_events WHERE at = (SELECT MIN(at) FROM usage_events WHERE at < $1)",
        &events_before,
    )?;
    let days = delete_oldest(
        db,
        "DELETE FROM usage_daily WHERE day = (SELECT MIN(day) FROM usage_daily WHERE day < $1)",
        &days_before,
    )?;
    db.write(|tx| {
        // A skill whose last day is gone goes if no day of it is left; one that kept a day
        // (written by a runner on an older binary, say) has its last day read again.
        tx.execute(
            "DELETE FROM usage_skills WHERE last_day < $1 AND NOT EXISTS
               (SELECT 1 FROM usage_daily d
                WHERE d.toolkit = usage_skills.toolkit AND d.skill = usage_skills.skill)",
            &[&days_before as &dyn Param],
        )
        .map_err(state::internal)?;
        tx.execute(
            "UPDATE usage_skills SET last_day =
               (SELECT MAX(d.day) FROM usage_daily d
                WHERE d.toolkit = usage_skills.toolkit AND d.skill = usage_skills.skill)
             WHERE last_day < $1",
            &[&days_before as &dyn Param],
        )
        .map_err(state::internal)
    })?;
    fold_recent(db, now_ms)?;
    Ok((events, days))
}

/// Yesterday's and today's daily rows folded into `usage_skills`: a runner of a fleet still on
/// a binary older than migration 16 writes days only. Read outside the write lock (`day IN`:
/// a seek of the two days, which SQLite's planner does not make of a `>=`), written a
/// [`CHUNK`] of skills a transaction; a last day only ever moves forward.
fn fold_recent(db: &Db, now_ms: i64) -> Result<()> {
    let (yesterday, today) = (day_of(now_ms - DAY_MS), day_of(now_ms));
    let skills: Vec<(String, String, String)> = db.with(|c| {
        let mut q = c.prepare_cached(
            "SELECT toolkit, skill, MAX(day) FROM usage_daily WHERE day IN ($1, $2)
             GROUP BY toolkit, skill",
        )?;
        let rows = q.query_map(crate::params![yesterday, today], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
        rows.collect()
    })?;
    for chunk in skills.chunks(CHUNK) {
        db.write(|tx| upsert_skills(tx, chunk.iter().cloned()))?;
    }
    Ok(())
}

/// Runs `delete` (the oldest bucket before `before`) a transaction at a time until it deletes
/// nothing, at most [`RETAIN_STEPS`] times; the rows deleted.
fn delete_oldest(db: &Db, delete: &str, before: &dyn Param) -> Result<u64> {
    let mut deleted = 0;
    for _ in 0..RETAIN_STEPS {
        let n = db.write(|tx| tx.execute(delete, &[before]).map_err(state::internal))?;
        if n == 0 {
            break;
        }
        deleted += n;
    }
    Ok(deleted)
}

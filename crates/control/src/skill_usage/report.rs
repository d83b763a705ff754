//! What the usage view reads of the stored uses: per skill over a period (a page at a time),
//! the period's totals per day, which skills of a toolkit were used and when one was last;
//! and, for the tests, the raw days and events (unbounded: not for a request). The view's
//! answers are bounded: a page's skill-days, the days of the period, one toolkit's skills.

use super::stored::DAY_MS;
use super::{Key, Source};
use crate::params;
use crate::state::Db;
use cloud_harness_error::{Code, Error, Result};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

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

/// One skill's use over a period: its uses by source, its runs' failures, when last used and
/// by how many principals and workspaces, and its uses per day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkillUse {
    pub toolkit: String,
    pub skill: String,
    /// By source (`read`, `resource`, `run`, `mount`): uses in the period.
    pub uses: BTreeMap<&'static str, i64>,
    pub run_failures: i64,
    /// Milliseconds since the Unix epoch.
    pub last_used: i64,
    pub principals: i64,
    pub workspaces: i64,
    /// Oldest first: the day and its uses, all sources.
    pub days: Vec<(String, i64)>,
}

/// The most skills a page of [`skills`] holds.
pub const MAX_PAGE: usize = 500;
/// The most skill-days a page of [`skills`] holds: over a long period, a page holds fewer
/// skills (400 days, 25 skills), so no page reads more than this many rows a day and source.
pub const MAX_PAGE_DAYS: usize = 10_000;

/// The skills a page over `days` days holds at most, of `limit` asked.
pub fn page_fits(limit: usize, days: usize) -> usize {
    limit
        .clamp(1, MAX_PAGE)
        .min((MAX_PAGE_DAYS / days.max(1)).max(1))
}

/// The daily rows of the skills used from `$1` to `$2`, of toolkit `$3` if not null: each
/// skill of `usage_skills` whose last day is in the period, joined to its rows of the period
/// (a seek of the `usage_daily_view` index each), so a short period reads its own days, not
/// every day kept. (`CROSS JOIN` keeps SQLite's planner from driving the join from the days,
/// which reads every row of the period and sorts them; PostgreSQL's plans it as a join.)
macro_rules! period_rows {
    () => {
        " FROM usage_skills k CROSS JOIN usage_daily d
          WHERE d.toolkit = k.toolkit AND d.skill = k.skill AND d.day >= $1 AND d.day <= $2
            AND k.last_day >= $1 AND (CAST($3 AS TEXT) IS NULL OR k.toolkit = $3)
          "
    };
}

/// The skills used from `since` to `until` (`YYYY-MM-DD`), of `toolkit` alone if named, in
/// the database's (toolkit, skill) order after `after`, at most `limit` (one more than
/// [`MAX_PAGE`] at most: a caller asks one more to learn whether there is more). Two
/// queries: the page's skills with their distinct principals and workspaces, then their uses
/// by source and day, from the page's first skill to its last.
pub fn skills(
    db: &Db,
    since: &str,
    until: &str,
    toolkit: Option<&str>,
    after: Option<(&str, &str)>,
    limit: usize,
) -> Result<Vec<SkillUse>> {
    let limit = limit.clamp(1, MAX_PAGE + 1) as i64;
    let (after_toolkit, after_skill) = after.unwrap_or(("", ""));
    // (The cursor as a range of `usage_skills`' key, which the walk seeks.)
    let pairs: Vec<(String, String, i64, i64)> = db.with(|c| {
        let mut q = c.prepare_cached(concat!(
            "SELECT k.toolkit, k.skill, COUNT(DISTINCT d.principal), COUNT(DISTINCT d.workspace)",
            period_rows!(),
            "AND k.toolkit >= $4 AND (k.toolkit > $4 OR k.skill > $5)
             GROUP BY k.toolkit, k.skill ORDER BY k.toolkit, k.skill LIMIT $6"
        ))?;
        let rows = q.query_map(
            params![since, until, toolkit, after_toolkit, after_skill, limit],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        rows.collect()
    })?;
    let (Some(first), Some(last)) = (pairs.first(), pairs.last()) else {
        return Ok(Vec::new());
    };
    let (first, last) = (
        (first.0.clone(), first.1.clone()),
        (last.0.clone(), last.1.clone()),
    );
    let mut out: Vec<SkillUse> = pairs
        .into_iter()
        .map(|(toolkit, skill, principals, workspaces)| SkillUse {
            toolkit,
            skill,
            uses: BTreeMap::new(),
            run_failures: 0,
            last_used: 0,
            principals,
            workspaces,
            days: Vec::new(),
        })
        .collect();
    // By name, not by order: the database's collation need not be Rust's byte order. A skill
    // a flush added to the range since the first query is not on this page.
    let at: HashMap<(String, String), usize> = out
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.toolkit.clone(), s.skill.clone()), i))
        .collect();
    let range = params![since, until, toolkit, first.0, first.1, last.0, last.1];
    // Per day and source in one pass over the range: at most the page's skill-days times the
    // sources.
    let rows: Vec<(String, String, String, String, i64, i64, i64)> = db.with(|c| {
        let mut q = c.prepare_cached(concat!(
            "SELECT k.toolkit, k.skill, d.day, d.source, CAST(SUM(d.uses) AS BIGINT), CAST(SUM(d.failures) AS BIGINT), MAX(d.last_at)",
            period_rows!(),
            "AND k.toolkit >= $4 AND (k.toolkit > $4 OR k.skill >= $5)
             AND k.toolkit <= $6 AND (k.toolkit < $6 OR k.skill <= $7)
             GROUP BY k.toolkit, k.skill, d.day, d.source"
        ))?;
        let rows = q.query_map(range, |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
        })?;
        rows.collect()
    })?;
    for (toolkit, skill, day, source, uses, failures, last) in rows {
        let Some(&i) = at.get(&(toolkit, skill)) else {
            continue;
        };
        let s = &mut out[i];
        let source = Source::parse(&source).map_or("unknown", Source::as_str);
        *s.uses.entry(source).or_default() += uses;
        if source == "run" {
            s.run_failures += failures;
        }
        s.last_used = s.last_used.max(last);
        s.days.push((day, uses));
    }
    for s in &mut out {
        // Byte order, which `YYYY-MM-DD` sorts as dates in (the rows came in the
        // database's); a day's rows, one per source, merged.
        s.days.sort();
        s.days.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 += b.1;
            }
            same
        });
    }
    Ok(out)
}

/// One day of a period: its uses by source, all skills (of one toolkit if named).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Total {
    pub day: String,
    pub uses: BTreeMap<&'static str, i64>,
    pub run_failures: i64,
}

/// Each day from `since` (`YYYY-MM-DD`) to `until`, oldest first, days without a use
/// included (at most [`MAX_DAYS`]).
pub fn totals(db: &Db, since: &str, until: &str, toolkit: Option<&str>) -> Result<Vec<Total>> {
    let rows: Vec<(String, String, i64, i64)> = db.with(|c| {
        let mut q = c.prepare_cached(
            "SELECT day, source, CAST(SUM(uses) AS BIGINT), CAST(SUM(failures) AS BIGINT)
             FROM usage_daily
             WHERE day >= $1 AND day <= $2 AND (CAST($3 AS TEXT) IS NULL OR toolkit = $3)
             GROUP BY day, source ORDER BY day, source",
        )?;
        let rows = q.query_map(params![since, until, toolkit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
        rows.collect()
    })?;
    let mut out: Vec<Total> = period(since, until)
        .into_iter()
        .map(|day| Total {
            day,
            uses: Source::ALL.iter().map(|s| (s.as_str(), 0)).collect(),
            run_failures: 0,
        })
        .collect();
    for (day, source, uses, failures) in rows {
        let (Ok(at), Some(source)) = (
            out.binary_search_by(|t| t.day.as_str().cmp(&day)),
            Source::parse(&source),
        ) else {
            continue;
        };
        *out[at].uses.entry(source.as_str()).or_default() += uses;
        if source == Source::Run {
            out[at].run_failures += failures;
        }
    }
    Ok(out)
}

/// The longest period a report covers, in days (the daily rows' default retention).
pub const MAX_DAYS: i64 = 400;

/// The days from `since` to `until` (`YYYY-MM-DD`, both included), at most [`MAX_DAYS`].
pub fn period(since: &str, until: &str) -> Vec<String> {
    let Some(mut ms) = ms_of(since) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while out.len() < MAX_DAYS as usize {
        let day = super::stored::day_of(ms);
        if day.as_str() > until {
            break;
        }
        out.push(day);
        ms += DAY_MS;
    }
    out
}

/// Midnight UTC of `day` (`YYYY-MM-DD`), in milliseconds since the Unix epoch.
fn ms_of(day: &str) -> Option<i64> {
    let mut parts = day.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (parts.next()??, parts.next()??, parts.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Howard Hinnant's days-from-civil, the inverse of `day_of`.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some((era * 146_097 + doe - 719_468) * DAY_MS)
}

/// The skills of `toolkit` used since `since` (`YYYY-MM-DD`): as many as the toolkit has
/// skills served in the period.
pub fn used_since(db: &Db, toolkit: &str, since: &str) -> Result<HashSet<String>> {
    db.with(|c| {
        let mut q = c.prepare_cached(
            "SELECT skill FROM usage_skills WHERE toolkit = $1 AND last_day >= $2",
        )?;
        let rows = q.query_map(params![toolkit, since], |r| r.get(0))?;
        rows.collect()
    })
}

/// The last use of `skill` of `toolkit` the daily rows still keep (milliseconds since the
/// Unix epoch).
pub fn last_use(db: &Db, toolkit: &str, skill: &str) -> Result<Option<i64>> {
    db.with(|c| {
        c.query_row(
            "SELECT MAX(last_at) FROM usage_daily WHERE toolkit = $1 AND skill = $2",
            params![toolkit, skill],
            |r| r.get(0),
        )
    })
}

/// What a report covers: its first and last day (`YYYY-MM-DD`, UTC), today the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    pub since: String,
    pub until: String,
    /// How many days: `since` to `until`, both included.
    pub days: usize,
}

impl Period {
    /// The last `days` days (1 to [`MAX_DAYS`]) up to `now_ms`, today included.
    pub fn last(days: u64, now_ms: i64) -> Result<Period> {
        if !(1..=MAX_DAYS as u64).contains(&days) {
            return Err(Error::field(
                Code::InvalidArgument,
                "days",
                format!("from 1 to {MAX_DAYS}"),
            ));
        }
        Ok(Period {
            since: super::stored::day_of(now_ms - (days as i64 - 1) * DAY_MS),
            until: super::stored::day_of(now_ms),
            days: days as usize,
        })
    }
}

/// The size of a page asked (1 to [`MAX_PAGE`], 100 if not said).
pub fn page_size(limit: Option<usize>) -> Result<usize> {
    let limit = limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Error::field(
            Code::InvalidArgument,
            "limit",
            format!("from 1 to {MAX_PAGE}"),
        ));
    }
    Ok(limit)
}

/// A cursor: the (toolkit, skill) a page ended with, opaque to clients.
pub fn cursor_of(toolkit: &str, skill: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{toolkit}\0{skill}"))
}

/// The (toolkit, skill) of a cursor [`cursor_of`] gave.
pub fn cursor_value(cursor: &str) -> Result<(String, String)> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            s.split_once('\0')
                .map(|(t, k)| (t.to_owned(), k.to_owned()))
        })
        .ok_or_else(|| {
            Error::field(
                Code::InvalidArgument,
                "after",
                "not a cursor this server gave",
            )
        })
}

/// A page of the skills used in `period` (of `toolkit` alone if named), after the cursor
/// `after`, of `limit` (1 to [`MAX_PAGE`], 100 if not said; fewer over a long period), and
/// the next page's cursor: what the API and the CLI answer.
pub fn skills_page(
    db: &Db,
    period: &Period,
    toolkit: Option<&str>,
    after: Option<&str>,
    limit: Option<usize>,
) -> Result<(Vec<SkillUse>, Option<String>)> {
    let limit = page_fits(page_size(limit)?, period.days);
    let after = after.map(cursor_value).transpose()?;
    let after = after.as_ref().map(|(t, s)| (t.as_str(), s.as_str()));
    let found = skills(db, &period.since, &period.until, toolkit, after, limit + 1)?;
    Ok(paged(found, limit, |s| (&s.toolkit, &s.skill)))
}

/// A page of `limit` from `found` (which holds one more when there is more), and the
/// cursor of the next.
pub fn paged<T>(
    mut found: Vec<T>,
    limit: usize,
    key: impl Fn(&T) -> (&str, &str),
) -> (Vec<T>, Option<String>) {
    let more = found.len() > limit;
    found.truncate(limit);
    let next = more
        .then(|| {
            found.last().map(|t| {
                let (toolkit, skill) = key(t);
                cursor_of(toolkit, skill)
            })
        })
        .flatten();
    (found, next)
}

//! What the usage view's reads cost on a large table, against a scan of the same days in the
//! same run (interleaved, medians of the rounds): a table of a million daily rows (400 days,
//! 25 workspaces a day, 10 toolkits of 10 skills), the first page of skills over the last 30
//! days (100 skills) and over 400 days (25: a page holds at most 10,000 skill-days), and the
//! period's totals per day. The baseline, `COUNT(*)` of the period's rows, is the least any
//! answer over those rows reads.
//!
//! `cargo bench --bench usage_view` (SQLite, in a temporary home).

use cloud_harness_control::params;
use cloud_harness_control::skill_usage::report::{self, Period};
use cloud_harness_control::state::Db;
use std::time::Instant;

const ROUNDS: usize = 5;
const NOW_MS: i64 = 1_796_601_600_000; // 2026-12-07, noon-ish UTC.

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn fill(db: &Db) {
    db.write(|c| {
        c.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 999999)
             INSERT INTO usage_daily (day, source, workspace, principal, toolkit, commit_id, bundle,
                                      tier, skill, uses, failures, duration_ms, last_at)
             SELECT date($1 / 1000, 'unixepoch', '-' || (i / 2500) || ' days'), 'read',
                    'ws-' || (i / 2500) || '-' || (i % 25), 'token:p' || (i % 7),
                    'https://git.example/team/kit' || ((i / 25) % 10) || '.git', 'c0ffee',
                    'sha256:00', 'owner', 'skill-' || ((i / 250) % 10), 3, 0, 0, $1 - i
             FROM n",
            params![NOW_MS],
        )?;
        // Each skill with its last day, as the flushes keep it (and migration 16 fills it).
        c.execute(
            "INSERT INTO usage_skills (toolkit, skill, last_day)
             SELECT toolkit, skill, MAX(day) FROM usage_daily GROUP BY toolkit, skill",
            params![],
        )?;
        Ok(())
    })
    .unwrap();
}

fn main() {
    let home = tempfile::tempdir().unwrap();
    let db = Db::open_sqlite(home.path()).unwrap();
    let t = Instant::now();
    fill(&db);
    println!(
        "usage view: a million daily rows written in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let scan = |since: &str| {
        db.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM usage_daily WHERE day >= $1",
                params![since],
                |r| r.get::<i64>(0),
            )
        })
        .unwrap()
    };
    for (days, limit) in [(30_u64, 100_usize), (400, 100)] {
        let p = Period::last(days, NOW_MS).unwrap();
        let limit = report::page_fits(limit, p.days);
        // (What the API and the CLI ask: a page of 100, fewer over a long period.)
        let (mut page, mut totals, mut base) = (Vec::new(), Vec::new(), Vec::new());
        let mut rows = 0;
        for _ in 0..ROUNDS {
            let t = Instant::now();
            let (got, _) = report::skills_page(&db, &p, None, None, Some(100)).unwrap();
            page.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(got.len(), limit);
            let t = Instant::now();
            report::totals(&db, &p.since, &p.until, None).unwrap();
            totals.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            rows = scan(&p.since);
            base.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let (page, totals, base) = (median(page), median(totals), median(base));
        println!(
            "usage view, {days} days ({rows} rows, a page of {limit}): page {page:.0} ms ({:.2}x the scan), totals {totals:.0} ms ({:.2}x), scan {base:.0} ms",
            page / base,
            totals / base
        );
    }
}

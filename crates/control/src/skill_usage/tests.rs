use super::stored::day_of;
use super::*;

fn origin(toolkit: &str) -> Origin {
    Origin {
        toolkit: toolkit.to_owned(),
        commit: "c0ffee".to_owned(),
        bundle: "sha256:00".to_owned(),
        tier: "repository".to_owned(),
    }
}

fn read<'a>(origin: &'a Origin, principal: &'a str, file: &'a str) -> Use<'a> {
    Use {
        source: Source::Read,
        workspace: "ws-1",
        principal,
        origin,
        skill: "tdd",
        file,
        failed: false,
        duration_ms: 0,
    }
}

/// Held by each test of the process's one tally: tests run at once would count into each
/// other.
static TALLY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn uses_of(toolkit: &str, source: Source) -> u64 {
    let counts = counts();
    let found = counts.series.iter().find(|(name, _)| name == toolkit);
    found.map_or(0, |(_, by)| by[source as usize].0)
}

#[test]
fn the_tally_counts_merges_and_stays_bounded() {
    let _one = TALLY.lock().unwrap_or_else(|e| e.into_inner());
    let kit = origin("acme/kit");
    take();
    let base = uses_of("acme/kit", Source::Read);
    // A storm of the same read is one key.
    for _ in 0..10_000 {
        record(&read(&kit, "alice", "SKILL.md"));
    }
    assert_eq!(held(), 1);
    let batch = take();
    assert_eq!(batch.len(), 1);
    assert_eq!(batch[0].1.uses, 10_000);
    assert_eq!(batch[0].0.file, "SKILL.md");
    assert_eq!(held(), 0);
    assert_eq!(uses_of("acme/kit", Source::Read) - base, 10_000);

    // One principal's distinct files stop at its share; another's still count.
    let before = dropped();
    let files: Vec<String> = (0..MAX_KEYS_PER_PRINCIPAL + 100)
        .map(|i| format!("f{i}"))
        .collect();
    for f in &files {
        record(&read(&kit, "greedy", f));
    }
    assert_eq!(held(), MAX_KEYS_PER_PRINCIPAL);
    assert_eq!(dropped() - before, 100);
    record(&read(&kit, "bob", "SKILL.md"));
    assert_eq!(held(), MAX_KEYS_PER_PRINCIPAL + 1);
    // The whole tally stops at MAX_KEYS, however many principals.
    for p in 0..MAX_KEYS / MAX_KEYS_PER_PRINCIPAL {
        let who = format!("p{p}");
        for f in &files[..MAX_KEYS_PER_PRINCIPAL] {
            record(&read(&kit, &who, f));
        }
    }
    assert_eq!(held(), MAX_KEYS);

    // A batch put back merges with what came since, within the bounds.
    let batch = take();
    record(&read(&kit, "bob", "SKILL.md"));
    put_back(batch);
    assert_eq!(held(), MAX_KEYS);
    let bob: Vec<_> = take()
        .into_iter()
        .filter(|(k, _)| k.principal == "bob")
        .collect();
    assert_eq!(bob.len(), 1);
    assert_eq!(bob[0].1.uses, 2);

    // Long fields are cut, NUL ends one.
    let long = "x".repeat(MAX_FIELD * 4);
    record(&read(&kit, "carol", &long));
    record(&read(&kit, "carol", "a\0b"));
    let mut got: Vec<String> = take().into_iter().map(|(k, _)| k.file).collect();
    got.sort();
    assert_eq!(got, vec!["a".to_owned(), "x".repeat(MAX_FIELD)]);

    // Toolkit series stop at MAX_TOOLKIT_SERIES; the rest are `other`.
    for i in 0..MAX_TOOLKIT_SERIES + 10 {
        record(&read(&origin(&format!("kit-{i}")), "dave", "SKILL.md"));
    }
    assert!(counts().series.len() <= MAX_TOOLKIT_SERIES + 1);
    assert!(uses_of(OTHER, Source::Read) >= 10);
    take();

    // Off counts nothing.
    set_enabled(false);
    record(&read(&kit, "erin", "SKILL.md"));
    set_enabled(true);
    assert_eq!(held(), 0);
}

#[test]
fn a_label_value_cannot_end_its_quotes() {
    assert_eq!(label("https://git.example/kit"), "https://git.example/kit");
    assert_eq!(label("a\"} 1\nx{b=\"\\"), "a\\\"} 1\\nx{b=\\\"\\\\");
}

#[test]
fn days_are_utc_calendar_days() {
    assert_eq!(day_of(0), "1970-01-01");
    assert_eq!(day_of(86_400_000 - 1), "1970-01-01");
    assert_eq!(day_of(86_400_000), "1970-01-02");
    // 2024-02-29T12:00:00Z and 2026-12-07T00:00:00Z.
    assert_eq!(day_of(1_709_208_000_000), "2024-02-29");
    assert_eq!(day_of(1_796_601_600_000), "2026-12-07");
    assert_eq!(day_of(-1), "1969-12-31");
}

fn key(source: Source, workspace: &str, file: &str) -> Key {
    Key {
        source,
        workspace: workspace.to_owned(),
        principal: "token:alice".to_owned(),
        toolkit: "https://git.example/acme/kit".to_owned(),
        commit: "c0ffee".to_owned(),
        bundle: "sha256:00".to_owned(),
        tier: "owner".to_owned(),
        skill: "tdd".to_owned(),
        file: file.to_owned(),
    }
}

fn at(ms: i64, uses: u64, failures: u64) -> Tally {
    Tally {
        uses,
        failures,
        duration_ms: 10 * uses,
        last_ms: ms,
    }
}

/// Flushes add up per day; the retention deletes old events and keeps their days, then
/// deletes days past their own retention.
#[test]
fn flushes_roll_up_per_day_and_the_retention_keeps_days_longer_than_events() {
    use super::report::{days, events};
    use super::stored::{flush, retain, Retention};
    let home = tempfile::tempdir().unwrap();
    let db = crate::state::Db::open_sqlite(home.path()).unwrap();
    const DAY: i64 = 86_400_000;
    // 2026-12-01 and 2026-12-02, noon UTC.
    let d1 = 1_796_126_400_000;
    let d2 = d1 + DAY;
    let flush = |batch: Batch| flush(&db, batch).map_err(|(e, _)| e).unwrap();
    flush(vec![(key(Source::Read, "ws-1", "SKILL.md"), at(d1, 3, 0))]);
    flush(vec![
        (
            key(Source::Read, "ws-1", "references/a.md"),
            at(d1 + 1000, 2, 0),
        ),
        (key(Source::Read, "ws-2", "SKILL.md"), at(d1 + 2000, 1, 0)),
        (
            key(Source::Run, "ws-1", "scripts/x.sh"),
            at(d1 + 3000, 2, 1),
        ),
    ]);
    // The same key again in the same hour adds to its row; a day later, a row of its own.
    flush(vec![(
        key(Source::Read, "ws-1", "SKILL.md"),
        at(d1 + 5000, 1, 0),
    )]);
    flush(vec![(key(Source::Read, "ws-1", "SKILL.md"), at(d2, 5, 0))]);
    let summed = |since: &str| -> Vec<(String, &'static str, i64, i64, i64)> {
        days(&db, since)
            .unwrap()
            .into_iter()
            .map(|d| (d.day, d.source, d.uses, d.failures, d.workspaces))
            .collect()
    };
    let all = vec![
        ("2026-12-01".to_owned(), "read", 7, 0, 2),
        ("2026-12-01".to_owned(), "run", 2, 1, 1),
        ("2026-12-02".to_owned(), "read", 5, 0, 1),
    ];
    assert_eq!(summed("2026-01-01"), all);
    assert_eq!(summed("2026-12-02"), all[2..].to_vec());
    assert_eq!(events(&db, "ws-1").unwrap().len(), 4);

    // Events a day old go at a retention of one day; the days stay.
    let retention = Retention {
        events_days: 1,
        daily_days: 3,
    };
    assert_eq!(retain(&db, retention, d2 + DAY / 2).unwrap(), (4, 0));
    assert_eq!(events(&db, "ws-1").unwrap().len(), 1);
    assert_eq!(summed("2026-01-01"), all);
    // Days past their retention go too.
    assert_eq!(retain(&db, retention, d1 + 4 * DAY).unwrap(), (1, 3));
    assert_eq!(summed("2026-01-01"), all[2..].to_vec());
}

/// A page of skills lists those used in its period, with the period's days alone; a skill's
/// last day follows its flushes (an older day does not move it back) and the retention.
#[test]
fn a_period_lists_the_skills_used_in_it_and_the_retention_forgets_skills_with_no_day_left() {
    use super::report::{skills, used_since};
    use super::stored::{flush, retain, Retention};
    let home = tempfile::tempdir().unwrap();
    let db = crate::state::Db::open_sqlite(home.path()).unwrap();
    const DAY: i64 = 86_400_000;
    let d1 = 1_796_126_400_000; // 2026-12-01, noon UTC.
    let flush = |batch: Batch| flush(&db, batch).map_err(|(e, _)| e).unwrap();
    let of = |skill: &str| Key {
        skill: skill.to_owned(),
        ..key(Source::Read, "ws-1", "SKILL.md")
    };
    flush(vec![(of("old"), at(d1 - 10 * DAY, 4, 0))]);
    flush(vec![
        (of("tdd"), at(d1, 3, 0)),
        (of("tdd"), at(d1 + DAY, 2, 0)),
    ]);
    // An older day of `tdd`, flushed later.
    flush(vec![(of("tdd"), at(d1 - 5 * DAY, 1, 0))]);
    let listed = |since: &str| -> Vec<(String, Vec<(String, i64)>)> {
        skills(&db, since, "2026-12-02", None, None, 10)
            .unwrap()
            .into_iter()
            .map(|s| (s.skill, s.days))
            .collect()
    };
    let tdd_days = vec![("2026-12-01".to_owned(), 3), ("2026-12-02".to_owned(), 2)];
    assert_eq!(
        listed("2026-12-01"),
        vec![("tdd".to_owned(), tdd_days.clone())]
    );
    let mut all_tdd = vec![("2026-11-26".to_owned(), 1)];
    all_tdd.extend(tdd_days);
    assert_eq!(
        listed("2026-11-01"),
        vec![
            ("old".to_owned(), vec![("2026-11-21".to_owned(), 4)]),
            ("tdd".to_owned(), all_tdd)
        ]
    );
    let toolkit = "https://git.example/acme/kit";
    let used = |since: &str| -> Vec<String> {
        let mut v: Vec<String> = used_since(&db, toolkit, since)
            .unwrap()
            .into_iter()
            .collect();
        v.sort();
        v
    };
    assert_eq!(used("2026-12-02"), ["tdd"]);
    assert_eq!(used("2026-11-22"), ["tdd"]);
    assert_eq!(used("2026-11-21"), ["old", "tdd"]);
    // A retention of 3 days at 2026-12-03: `old`'s day goes, and `old` with it.
    let retention = Retention {
        events_days: 1,
        daily_days: 3,
    };
    retain(&db, retention, d1 + 2 * DAY).unwrap();
    assert_eq!(used("2026-01-01"), ["tdd"]);
    let kept: i64 = db
        .with(|c| {
            c.query_row("SELECT COUNT(*) FROM usage_skills", crate::params![], |r| {
                r.get(0)
            })
        })
        .unwrap();
    assert_eq!(kept, 1);
    // A day written as a runner on an older binary writes it (no `usage_skills`): in the
    // view after the next retention.
    db.write(|c| {
        c.execute(
            "INSERT INTO usage_daily (day, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, uses, failures, duration_ms, last_at)
             VALUES ('2026-12-03', 'read', 'ws-9', 'token:bob', $1, 'c0ffee', 'sha256:00', 'owner', 'legacy', 1, 0, 0, $2)",
            crate::params![toolkit, d1 + 2 * DAY],
        )?;
        Ok(())
    })
    .unwrap();
    assert_eq!(used("2026-12-03"), Vec::<String>::new());
    retain(&db, retention, d1 + 2 * DAY + 3_600_000).unwrap();
    assert_eq!(used("2026-12-03"), ["legacy"]);
    assert_eq!(used("2026-01-01"), ["legacy", "tdd"]);
    // A skill whose last day is past the retention but which kept a later day (written
    // without `usage_skills`, older than the fold's two days) stays, its last day read again.
    flush(vec![(of("kept"), at(d1 - 10 * DAY, 1, 0))]);
    db.write(|c| {
        c.execute(
            "INSERT INTO usage_daily (day, source, workspace, principal, toolkit, commit_id, bundle, tier, skill, uses, failures, duration_ms, last_at)
             VALUES ('2026-12-01', 'read', 'ws-9', 'token:bob', $1, 'c0ffee', 'sha256:00', 'owner', 'kept', 1, 0, 0, $2)",
            crate::params![toolkit, d1],
        )?;
        Ok(())
    })
    .unwrap();
    retain(&db, retention, d1 + 2 * DAY + 7_200_000).unwrap();
    assert_eq!(used("2026-12-01"), ["kept", "legacy", "tdd"]);
}

/// More keys than a transaction takes are written in several; a flush the database refuses
/// is put back for the next one, then, told to give up, counted as dropped.
#[test]
fn a_flush_writes_in_chunks_and_what_the_database_refuses_is_kept_then_given_up() {
    use super::report::{days, events};
    use super::stored::{flush, flush_counted, CHUNK};
    let _one = TALLY.lock().unwrap_or_else(|e| e.into_inner());
    let home = tempfile::tempdir().unwrap();
    let db = crate::state::Db::open_sqlite(home.path()).unwrap();
    let d1 = 1_796_126_400_000;
    let many: Batch = (0..CHUNK * 2 + 7)
        .map(|i| (key(Source::Mount, "ws-9", &format!("f{i}")), at(d1, 2, 0)))
        .collect();
    flush(&db, many).map_err(|(e, _)| e).unwrap();
    assert_eq!(events(&db, "ws-9").unwrap().len(), CHUNK * 2 + 7);
    let day = &days(&db, "2026-12-01").unwrap()[0];
    assert_eq!((day.uses, day.workspaces), ((CHUNK as i64 * 2 + 7) * 2, 1));

    take();
    let kit = origin("acme/kit");
    for _ in 0..3 {
        record(&read(&kit, "alice", "SKILL.md"));
    }
    db.write(|tx| {
        tx.execute_batch("DROP TABLE usage_daily")
            .map_err(crate::state::internal)
    })
    .unwrap();
    assert!(flush_counted(&db, false).is_err());
    let kept = take();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].1.uses, 3);
    assert!(
        events(&db, "ws-1").unwrap().is_empty(),
        "nothing half written"
    );
    put_back(kept);
    let before = dropped();
    assert!(flush_counted(&db, true).is_err());
    assert_eq!(held(), 0);
    assert_eq!(dropped() - before, 3);
}

#[test]
fn a_period_is_its_days_in_order_across_months_and_leap_years() {
    use super::report::{period, Period, MAX_DAYS};
    use super::stored::day_of;
    let day = 24 * 3600 * 1000_i64;
    assert_eq!(
        period("2024-02-27", "2024-03-01"),
        ["2024-02-27", "2024-02-28", "2024-02-29", "2024-03-01"]
    );
    assert_eq!(
        period("2026-12-31", "2027-01-01"),
        ["2026-12-31", "2027-01-01"]
    );
    assert!(period("2026-12-02", "2026-12-01").is_empty());
    assert!(period("not a day", "2026-12-01").is_empty());
    assert_eq!(period("1970-01-01", "2999-01-01").len(), MAX_DAYS as usize);
    // The last days up to a moment, today included; none, or more than kept, refused.
    let now = 1_796_000_000_000_i64;
    let p = Period::last(7, now).unwrap();
    assert_eq!((p.since, p.until), (day_of(now - 6 * day), day_of(now)));
    assert_eq!(period(&day_of(now - 6 * day), &day_of(now)).len(), 7);
    assert!(Period::last(0, now).is_err());
    assert!(Period::last(MAX_DAYS as u64 + 1, now).is_err());
}

#[test]
fn a_cursor_is_its_toolkit_and_skill_and_a_foreign_one_is_refused() {
    use super::report::{cursor_of, cursor_value, paged};
    let c = cursor_of("https://git.example/kit.git", "lint");
    assert_eq!(
        cursor_value(&c).unwrap(),
        ("https://git.example/kit.git".to_owned(), "lint".to_owned())
    );
    for bad in ["", "!!", "bm90IG9uZQ"] {
        let e = cursor_value(bad).unwrap_err();
        assert_eq!(e.code, cloud_harness_error::Code::InvalidArgument, "{bad}");
    }
    let rows = vec![("a", "x"), ("a", "y"), ("b", "x")];
    let (page, next) = paged(rows.clone(), 2, |r| (r.0, r.1));
    assert_eq!((page.len(), next), (2, Some(cursor_of("a", "y"))));
    let (page, next) = paged(rows, 3, |r| (r.0, r.1));
    assert_eq!((page.len(), next), (3, None));
}

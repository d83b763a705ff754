//! The database's waits: reads beside a write that waits for the lock, and what running out
//! of a wait is.

use super::*;
use std::time::Duration;

fn sqlite() -> (tempfile::TempDir, Db) {
    let home = tempfile::tempdir().unwrap();
    let db = Db::open_sqlite(home.path()).unwrap();
    (home, db)
}

/// Another process's connection holding the write lock (`BEGIN EXCLUSIVE`).
fn locker(home: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path(home)).unwrap();
    c.execute_batch("BEGIN EXCLUSIVE").unwrap();
    c
}

/// A row of the tokens table, as the token module writes one.
fn add_token(db: &Db, name: &str) -> Result<()> {
    db.write(|tx| {
        tx.execute(
            "INSERT INTO tokens (id, name, role, hash, created_at, created_by) VALUES ($1, $2, $3, $4, $5, $6)",
            crate::params![crate::ids::new_id("tok"), name, "client", name, now_ms(), "test"],
        )
        .map_err(internal)?;
        Ok(())
    })
}

fn token_names(db: &Db) -> Result<Vec<String>> {
    db.with(|c| {
        let mut q = c.prepare_cached("SELECT name FROM tokens ORDER BY name")?;
        let rows = q.query_map(crate::params![], |r| r.get(0))?;
        rows.collect()
    })
}

#[test]
fn reads_answer_while_a_write_waits_for_another_process_lock() {
    let (home, db) = sqlite();
    add_token(&db, "one").unwrap();
    let lock = locker(home.path());
    // A write of this process waits for the lock (holding the writer)...
    let writer = {
        let db = db.clone();
        std::thread::spawn(move || add_token(&db, "two"))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!writer.is_finished(), "the write did not wait for the lock");
    // ...and reads still answer, from every reading connection at once.
    let readers: Vec<_> = (0..MAX_READERS * 2)
        .map(|_| {
            let db = db.clone();
            std::thread::spawn(move || token_names(&db))
        })
        .collect();
    for r in readers {
        let names = r.join().unwrap().unwrap();
        assert_eq!(names, ["one"]);
    }
    assert!(!writer.is_finished());
    assert!(db.readers.count() <= MAX_READERS);
    // Once the lock is let go, the write goes through.
    drop(lock);
    writer.join().unwrap().unwrap();
    let names = token_names(&db).unwrap();
    assert_eq!(names, ["one", "two"]);
}

#[test]
fn a_busy_sqlite_is_a_retryable_timeout_not_internal() {
    let (home, _db) = sqlite();
    let _lock = locker(home.path());
    let mut c = sqlite::open(&path(home.path())).unwrap();
    c.busy_timeout(Duration::ZERO).unwrap();
    let e: Error = sqlite::write(&mut c, |tx| {
        tx.execute_batch("DELETE FROM tokens")
            .map_err(sqlite::error)
            .map_err(internal)
    })
    .unwrap_err();
    assert_eq!(e.code, Code::Timeout, "{e}");
    assert_eq!(e.details["retryable"], true);
}

#[test]
fn timeouts_are_retryable_and_constraints_are_not_internal_upstream() {
    let timeout = internal(DbError {
        kind: ErrorKind::Timeout,
        message: "slow".into(),
    });
    assert_eq!(
        (timeout.code, timeout.details["retryable"].clone()),
        (Code::Timeout, serde_json::json!(true))
    );
    let down = internal(DbError {
        kind: ErrorKind::Unavailable,
        message: "down".into(),
    });
    assert_eq!(down.code, Code::Upstream);
    assert_eq!(internal(DbError::other("bug")).code, Code::Internal);
}

//! Whether the state database is the one this home used. A SQLite file that fails its quick
//! check is refused, named; and a database found empty where the home says it held data (a
//! file lost or truncated, a PostgreSQL database dropped and made again) is refused too,
//! never started afresh in silence — a silent fresh start would forget every token, decision
//! and workspace, and make a new operator token.

use super::sql::Conn;
use cloud_harness_error::{Error, Result};
use std::path::{Path, PathBuf};

/// In the home: the schema version its database was last brought to.
const FILE: &str = "state-database";

fn file(home: &Path) -> PathBuf {
    home.join(FILE)
}

/// The schema version the database is at now: 0 when it is empty.
pub(super) fn current(conn: &Conn) -> Result<i64> {
    let tables: i64 = match conn {
        Conn::Sqlite(_) => conn.query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'schema_migrations'",
            crate::params![],
            |r| r.get(0),
        )?,
        Conn::Postgres(_) => conn.query_row(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'schema_migrations' AND table_schema = current_schema()",
            crate::params![],
            |r| r.get(0),
        )?,
    };
    if tables == 0 {
        return Ok(0);
    }
    Ok(conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        crate::params![],
        |r| r.get(0),
    )?)
}

/// Refuses a database that is empty (`current` 0) when this home recorded one with data.
pub(super) fn check(home: &Path, current: i64, shown: &str) -> Result<()> {
    let path = file(home);
    let seen: i64 = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().unwrap_or(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(Error::io(&path, e)),
    };
    if seen > 0 && current == 0 {
        return Err(Error::internal(format!(
            "the state database {shown} is empty, but this home ({}) used it at schema version {seen}: \
             it was lost, truncated or replaced. Restore it from its backup (docs/durability.md, \"Backing up and restoring\"); \
             to start afresh on purpose, with no tokens, decisions or workspaces, remove {}",
            home.display(),
            path.display()
        )));
    }
    Ok(())
}

/// Records that this home's database is at schema `version`.
pub(super) fn record(home: &Path, version: i64) -> Result<()> {
    crate::home::write_atomic(&file(home), format!("{version}\n").as_bytes())
}

/// SQLite's quick check of the file at `path` (every page and index, without the content
/// comparisons of a full check): a damaged file is refused with its name.
pub(super) fn quick_check(conn: &rusqlite::Connection, path: &Path) -> Result<()> {
    let damaged = |why: String| {
        Error::internal(format!(
            "the state database {} is damaged ({why}): restore it from its backup (docs/durability.md, \"Backing up and restoring\"), \
             or move it aside to start with an empty one",
            path.display()
        ))
    };
    let mut statement = conn
        .prepare("PRAGMA quick_check(5)")
        .map_err(|e| damaged(e.to_string()))?;
    let found: Vec<String> = statement
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| damaged(e.to_string()))?;
    match found.as_slice() {
        [ok] if ok == "ok" => Ok(()),
        problems => Err(damaged(problems.join("; "))),
    }
}

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

/// What this home recorded: the engine (`sqlite`, `postgres`; none in a file from before it
/// was written) and the schema version.
fn seen(home: &Path) -> Result<(Option<String>, i64)> {
    let path = file(home);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((None, 0)),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let mut words = text.split_whitespace();
    Ok(match (words.next(), words.next()) {
        (Some(kind), Some(version)) => (Some(kind.to_owned()), version.parse().unwrap_or(0)),
        (Some(version), None) => (None, version.parse().unwrap_or(0)),
        _ => (None, 0),
    })
}

/// Refuses a database of engine `kind` that is empty (`current` 0) when this home recorded
/// one with data. Only an empty PostgreSQL database after SQLite is let through: that is the
/// move to a fleet's database, not a loss. The other way round is a PostgreSQL URL that went
/// missing (the server fell back to SQLite in its home), and starting afresh would hide it.
pub(super) fn check(home: &Path, kind: &str, current: i64, shown: &str) -> Result<()> {
    let (seen_kind, seen) = seen(home)?;
    // Back from PostgreSQL to SQLite: the file is empty, or an old copy left from before the
    // move (its tokens and decisions stale). Either way the URL went missing.
    let fell_back = seen > 0 && seen_kind.as_deref() == Some("postgres") && kind == "sqlite";
    let moved = seen_kind.as_deref() == Some("sqlite") && kind == "postgres";
    if !fell_back && (seen == 0 || current > 0 || moved) {
        return Ok(());
    }
    if fell_back {
        return Err(Error::internal(format!(
            "this home ({}) used a PostgreSQL database (schema version {seen}), but none is configured, so the server would use the SQLite file {shown}{}: \
             set CLOUD_HARNESS_DATABASE_URL (`database` in the configuration) as the server has it. To go back to SQLite on purpose, remove {}",
            home.display(),
            if current == 0 { ", which is empty" } else { ", an old copy from before the move" },
            file(home).display()
        )));
    }
    Err(Error::internal(format!(
        "the state database {shown} is empty, but this home ({}) used one at schema version {seen}: \
         it was lost, truncated or replaced. Restore it from its backup (docs/durability.md, \"Backing up and restoring\"); \
         to start afresh on purpose, with no tokens, decisions or workspaces, remove {}",
        home.display(),
        file(home).display()
    )))
}

/// Records that this home's database is of engine `kind` at schema `version`, unless it says
/// so already: an open writes nothing in the usual case, so a full disk does not stop a
/// restart. A failure to record is only warned of (the next start tries again).
pub(super) fn record(home: &Path, kind: &str, version: i64) {
    let wanted = format!("{kind} {version}\n");
    let path = file(home);
    if std::fs::read_to_string(&path).is_ok_and(|t| t == wanted) {
        return;
    }
    if let Err(e) = crate::home::write_atomic(&path, wanted.as_bytes()) {
        tracing::warn!(error = %e, "could not record which state database this home uses");
    }
}

/// SQLite's quick check of the file at `path` (every page and index, without the content
/// comparisons of a full check): a damaged file is refused with its name.
pub(super) fn quick_check(conn: &rusqlite::Connection, path: &Path) -> Result<()> {
    let fresh = path
        .parent()
        .map_or_else(|| FILE.into(), |home| file(home).display().to_string());
    let damaged = |why: String| {
        Error::internal(format!(
            "the state database {} is damaged ({why}): restore it from its backup (docs/durability.md, \"Backing up and restoring\"), \
             or, to start afresh on purpose with no tokens, decisions or workspaces, move it aside and remove {fresh}",
            path.display()
        ))
    };
    // The check itself failing on a malformed file is damage; failing otherwise (the file
    // locked, a read error) says nothing of the pages.
    let failed = |e: rusqlite::Error| match &e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            ) =>
        {
            damaged(e.to_string())
        }
        _ => Error::internal(format!(
            "the state database {} could not be checked: {e}",
            path.display()
        )),
    };
    let mut statement = conn.prepare("PRAGMA quick_check(5)").map_err(failed)?;
    let found: Vec<String> = statement
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(failed)?;
    match found.as_slice() {
        [ok] if ok == "ok" => Ok(()),
        problems => Err(damaged(problems.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn an_unchanged_record_is_not_written_again() {
        let home = tempfile::tempdir().unwrap();
        record(home.path(), "sqlite", 7);
        let inode = std::fs::metadata(file(home.path())).unwrap().ino();
        record(home.path(), "sqlite", 7);
        assert_eq!(std::fs::metadata(file(home.path())).unwrap().ino(), inode);
        record(home.path(), "sqlite", 8);
        assert_eq!(
            std::fs::read_to_string(file(home.path())).unwrap(),
            "sqlite 8\n"
        );
    }

    #[test]
    fn an_empty_database_is_refused_unless_it_is_the_move_to_postgres() {
        let home = tempfile::tempdir().unwrap();
        check(home.path(), "sqlite", 0, "new").unwrap(); // a first start
        record(home.path(), "sqlite", 7);
        assert!(check(home.path(), "sqlite", 0, "lost").is_err());
        check(home.path(), "sqlite", 7, "kept").unwrap();
        // Moved to PostgreSQL: its empty database is the move, not a loss.
        check(home.path(), "postgres", 0, "moved").unwrap();
        // Back from PostgreSQL to an empty SQLite file: its URL was lost, not a move.
        record(home.path(), "postgres", 7);
        let lost = check(home.path(), "sqlite", 0, "fallback").unwrap_err();
        assert!(
            lost.message.contains("set CLOUD_HARNESS_DATABASE_URL"),
            "{}",
            lost.message
        );
        // Nor to a SQLite file with data, left from before the move: stale, not the one.
        let stale = check(home.path(), "sqlite", 7, "stale copy").unwrap_err();
        assert!(
            stale.message.contains("an old copy from before the move"),
            "{}",
            stale.message
        );
        // A record from before engines were named holds for either.
        std::fs::write(file(home.path()), "7\n").unwrap();
        assert!(check(home.path(), "postgres", 0, "lost").is_err());
    }
}

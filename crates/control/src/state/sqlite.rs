//! The embedded engine: one SQLite file, `<home>/state.db`, shared by `serve` and the CLI
//! (WAL, a busy timeout); a write transaction takes the write lock at once. Reads have
//! connections of their own ([`open_reader`]): in WAL mode they read while another connection
//! or process holds the write lock.

use super::values::{DbError, DbResult, ErrorKind, Row, Value};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, TransactionBehavior};
use std::path::Path;
use std::time::Duration;

/// How long a writer waits for another (a CLI while `serve` writes) before giving up.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn open(path: &Path) -> DbResult<Connection> {
    let conn = Connection::open(path).map_err(error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(error)?;
    // WAL: readers never wait for the writer; FULL: an acknowledged decision survives a
    // power cut, not only a killed process.
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(error)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(error)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(error)?;
    // The file holds token hashes and decisions: the server's user only.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    Ok(conn)
}

/// A connection for reads only, to a database [`open`] made: WAL is the file's mode already
/// and durability is the writer's concern, so it only waits as long, and checks keys.
pub(crate) fn open_reader(path: &Path) -> DbResult<Connection> {
    let conn = Connection::open(path).map_err(error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(error)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(error)?;
    Ok(conn)
}

/// `f` in a transaction holding the write lock (`BEGIN IMMEDIATE`), committed only if it
/// succeeds.
pub fn write<T, E: From<DbError>>(
    conn: &mut Connection,
    f: impl FnOnce(&Connection) -> Result<T, E>,
) -> Result<T, E> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(error)?;
    let value = f(&tx)?;
    tx.commit().map_err(error)?;
    Ok(value)
}

pub fn error(e: rusqlite::Error) -> DbError {
    let kind = match &e {
        rusqlite::Error::QueryReturnedNoRows => ErrorKind::NoRows,
        e if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) => {
            ErrorKind::Constraint
        }
        // The busy timeout ran out: another connection held the lock all along.
        e if matches!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        ) =>
        {
            ErrorKind::Timeout
        }
        e if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) => ErrorKind::Full,
        _ => ErrorKind::Other,
    };
    DbError {
        kind,
        message: e.to_string(),
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Int(i) => ToSqlOutput::Borrowed(ValueRef::Integer(*i)),
            Value::Bool(b) => ToSqlOutput::Borrowed(ValueRef::Integer(i64::from(*b))),
            Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        })
    }
}

pub fn execute(conn: &Connection, sql: &str, values: &[Value]) -> DbResult<u64> {
    let mut st = conn.prepare_cached(sql).map_err(error)?;
    let n = st
        .execute(rusqlite::params_from_iter(values))
        .map_err(error)?;
    Ok(n as u64)
}

pub fn rows(conn: &Connection, sql: &str, values: &[Value]) -> DbResult<Vec<Row>> {
    let mut st = conn.prepare_cached(sql).map_err(error)?;
    let columns = st.column_count();
    let names: std::sync::Arc<[String]> = st.column_names().iter().map(|n| n.to_string()).collect();
    let mut rows = st
        .query(rusqlite::params_from_iter(values))
        .map_err(error)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(error)? {
        let mut row = Vec::with_capacity(columns);
        for i in 0..columns {
            row.push(match r.get_ref(i).map_err(error)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(n) => Value::Int(n),
                ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                other => {
                    return Err(DbError::other(format!(
                        "column {i} holds a {}, which the schema never stores",
                        other.data_type()
                    )))
                }
            });
        }
        out.push(Row {
            names: names.clone(),
            values: row,
        });
    }
    Ok(out)
}

//! The control plane's state: one SQLite database, `<home>/state.db`, shared by `serve` and the
//! CLI (WAL, a busy timeout), with versioned migrations. Every query of the control plane
//! goes through this module's connection. The SQL is kept to what PostgreSQL also accepts
//! (numbered `$n` parameters, `ON CONFLICT`, partial unique indexes, `RETURNING`), so a fleet's
//! shared database can take the same statements.

mod migrations;

use cloud_harness_fs::{Error, Result};
use rusqlite::{Connection, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a writer waits for another (a CLI while `serve` writes) before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The database. Cheap to clone; one connection per process, used one statement at a time.
#[derive(Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("path", &self.path).finish()
    }
}

pub fn path(home: &Path) -> PathBuf {
    home.join("state.db")
}

/// A database error as the harness reports it: a constraint is the caller's to name, anything
/// else is internal.
pub fn internal(e: rusqlite::Error) -> Error {
    Error::internal(format!("state database: {e}"))
}

/// Whether `e` is a unique or check constraint refusing a row.
pub fn is_constraint(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ConstraintViolation)
    )
}

/// Milliseconds since the Unix epoch: every time the control plane records.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Db {
    /// Opens (creating it if need be) the database under `home` and brings it to the schema
    /// this binary knows. A database from a newer binary is refused, not written.
    pub fn open(home: &Path) -> Result<Db> {
        std::fs::create_dir_all(home).map_err(|e| Error::io(home, e))?;
        let path = path(home);
        let mut conn = Connection::open(&path).map_err(internal)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(internal)?;
        // WAL: readers never wait for the writer; FULL: an acknowledged decision survives a
        // power cut, not only a killed process.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(internal)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(internal)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(internal)?;
        migrations::apply(&mut conn)?;
        // The file holds token hashes and decisions: the server's user only.
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        Ok(Db {
            conn: Arc::new(Mutex::new(conn)),
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection (one statement or a few reads).
    pub fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let conn = self.conn.lock().expect("database lock");
        f(&conn).map_err(internal)
    }

    /// Runs `f` in one write transaction, taken at once (`BEGIN IMMEDIATE`), so two
    /// processes writing serialize instead of failing midway; committed only if `f`
    /// succeeds, so nothing partial is ever stored.
    pub fn write<T>(&self, f: impl FnOnce(&rusqlite::Transaction) -> Result<T>) -> Result<T> {
        let mut conn = self.conn.lock().expect("database lock");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(internal)?;
        let value = f(&tx)?;
        tx.commit().map_err(internal)?;
        Ok(value)
    }
}

/// A random secret of 32 bytes, URL-safe base64 (43 characters).
pub fn secret() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the kernel's random numbers");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// An id of `prefix` and 16 random hex digits.
pub fn new_id(prefix: &str) -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the kernel's random numbers");
    format!("{prefix}_{}", hex_of(&bytes))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

//! The control plane's state, behind one data module: SQLite at `<home>/state.db` by
//! default (shared by `serve` and the CLI of one machine), or PostgreSQL at
//! `CLOUD_HARNESS_DATABASE_URL` for a fleet of runners sharing one database. Every query of
//! the control plane goes through [`Db`], written once in the SQL both engines accept
//! (numbered `$n` parameters, first used in their order: SQLite numbers `$n` by where it
//! first appears, `ON CONFLICT`, partial unique indexes, `RETURNING`; a parameter
//! that is only tested for NULL is cast, `CAST($1 AS TEXT) IS NULL`, so PostgreSQL knows its
//! type), with the same versioned migrations on both.
//!
//! One connection writes, one write transaction at a time; reads have connections of their
//! own (`readers`), so a read never waits behind a write that waits for the database's lock.
//! Every wait is bounded: SQLite's busy timeout, PostgreSQL's `lock_timeout` and
//! `statement_timeout`; running out of one is TIMEOUT, retryable.

mod identity;
mod migrations;
mod pool;
mod postgres;
mod sql;
mod sqlite;
mod values;

pub(crate) use pool::MAX_READERS;

pub use sql::Conn;
use sql::Engine;
pub use values::{DbError, DbResult, ErrorKind, FromValue, Optional, Param, Row, Value};

pub use crate::ids::new_id;
use cloud_harness_error::{Code, Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a fleet's shared database is: `postgres://user:password@host:port/database`.
pub const URL_VAR: &str = "CLOUD_HARNESS_DATABASE_URL";

/// The database. Cheap to clone; per process one connection that writes and a few that read.
#[derive(Clone)]
pub struct Db {
    /// The connection of [`Db::write`].
    writer: Arc<pool::Pool>,
    /// The connections of [`Db::with`].
    readers: Arc<pool::Pool>,
    /// `sqlite` or `postgres`, known at open.
    kind: &'static str,
    /// The file, or the URL without its password.
    shown: String,
    /// This runner's name ([`crate::home::runner_name`]).
    runner: String,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("at", &self.shown).finish()
    }
}

pub fn path(home: &Path) -> PathBuf {
    home.join("state.db")
}

/// Where this process's state database is (the file, or the URL without its password), for
/// errors that name it; the last one opened.
static LOCATION: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

fn location() -> String {
    LOCATION.lock().map(|l| l.clone()).unwrap_or_default()
}

/// Names the database being opened, before anything of it is read: a full disk met while
/// opening it names it too.
fn locate(shown: &str) {
    if let Ok(mut l) = LOCATION.lock() {
        shown.clone_into(&mut l);
    }
}

/// A database error as the harness reports it: a constraint is the caller's to name, a
/// database out of reach is UPSTREAM and one that did not answer in time TIMEOUT (both
/// retryable), anything else is internal.
pub fn internal(e: DbError) -> Error {
    match e.kind {
        ErrorKind::Unavailable => Error::new(Code::Upstream, e.message)
            .with_details(serde_json::json!({ "retryable": true })),
        ErrorKind::Timeout => Error::new(Code::Timeout, e.message)
            .with_details(serde_json::json!({ "retryable": true })),
        ErrorKind::Full => {
            let mut full = Error::new(
                Code::ResourceExhausted,
                format!(
                    "the state database ({}): no space left on its device (ENOSPC): {}",
                    location(),
                    e.message
                ),
            )
            .with_details(
                serde_json::json!({ "condition": "ENOSPC", "path": location(), "retryable": true }),
            );
            full.status = cloud_harness_error::INSUFFICIENT_STORAGE;
            full
        }
        _ => Error::internal(format!("state database: {e}")),
    }
}

impl From<DbError> for Error {
    fn from(e: DbError) -> Error {
        internal(e)
    }
}

/// Whether `e` is a unique or check constraint refusing a row.
pub fn is_constraint(e: &DbError) -> bool {
    e.kind == ErrorKind::Constraint
}

/// Milliseconds since the Unix epoch: every time the control plane records.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Db {
    /// The database this process is configured for: PostgreSQL when
    /// `CLOUD_HARNESS_DATABASE_URL` is set, else SQLite under `home`.
    pub fn open(home: &Path) -> Result<Db> {
        match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => Db::connect(&url, home),
            _ => Db::open_sqlite(home),
        }
    }

    /// Opens (creating it if need be) the SQLite database under `home` and brings it to the
    /// schema this binary knows. A database from a newer binary is refused, not written.
    pub fn open_sqlite(home: &Path) -> Result<Db> {
        std::fs::create_dir_all(home).map_err(|e| Error::io(home, e))?;
        let path = path(home);
        locate(&path.display().to_string());
        let conn = sqlite::open(&path).map_err(|e| match Error::from(e) {
            full if full.is_full_disk() => full, // it names the database already
            e => e.context(format_args!("the state database {}", path.display())),
        })?;
        identity::quick_check(&conn, &path)?;
        let shown = path.display().to_string();
        let readers = pool::Pool::new("reading", MAX_READERS, move || {
            Ok(Engine::Sqlite(sqlite::open_reader(&path)?))
        });
        Db::migrated(Engine::Sqlite(conn), readers, shown, home)
    }

    /// Connects to the PostgreSQL database at `url` and brings it to the schema this binary
    /// knows (the first runner to start migrates; the others find it done).
    pub fn connect(url: &str, home: &Path) -> Result<Db> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::field(
                Code::InvalidArgument,
                URL_VAR,
                format!(
                    "{URL_VAR} must be a postgres:// URL, not {}",
                    crate::config::redact(url)
                ),
            ));
        }
        locate(&crate::config::redact(url));
        let target = postgres::Target::parse(url)?;
        let pg = Box::new(target.connect()?);
        let shown = pg.shown().to_owned();
        // Readers connect as the writer did, when first needed.
        let readers = pool::Pool::new("reading", MAX_READERS, move || {
            Ok(Engine::Postgres(Box::new(target.connect()?)))
        });
        Db::migrated(Engine::Postgres(pg), readers, shown, home)
    }

    fn migrated(engine: Engine, readers: pool::Pool, shown: String, home: &Path) -> Result<Db> {
        let kind = match engine {
            Engine::Sqlite(_) => "sqlite",
            Engine::Postgres(_) => "postgres",
        };
        let db = Db {
            writer: Arc::new(pool::Pool::one("writing", engine)),
            readers: Arc::new(readers),
            kind,
            shown,
            runner: crate::home::runner_name(home)?,
        };
        locate(&db.shown);
        let before = db.write(identity::current)?;
        identity::check(home, kind, before, &db.shown)?;
        db.write(migrations::apply)?;
        identity::record(home, kind, migrations::latest());
        Ok(db)
    }

    /// The file, or the URL without its password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// This runner's name, which marks what it owns in a shared database.
    pub fn runner(&self) -> &str {
        &self.runner
    }

    /// `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        self.kind
    }

    /// Runs `f`, reads only, on a reading connection: it never waits for the writer (nor
    /// for another process's write lock, on SQLite). On PostgreSQL, reads that found the
    /// connection lost run once more on a new one.
    pub fn with<T>(&self, f: impl Fn(&Conn) -> DbResult<T>) -> Result<T> {
        let mut lease = self.readers.get()?;
        match lease.engine() {
            Engine::Sqlite(c) => f(&Conn::Sqlite(c)).map_err(internal),
            Engine::Postgres(p) => {
                p.ensure()?;
                match f(&Conn::Postgres(p)) {
                    Err(e) if e.kind == ErrorKind::Unavailable => {
                        p.reconnect()?;
                        f(&Conn::Postgres(p)).map_err(internal)
                    }
                    r => r.map_err(internal),
                }
            }
        }
    }

    /// Runs `f` in one write transaction holding the write lock from its start (SQLite's
    /// `BEGIN IMMEDIATE`; on PostgreSQL one advisory lock for the whole fleet), so two
    /// writers serialize instead of failing midway; committed only if `f` succeeds, so
    /// nothing partial is ever stored. It waits at most `CONNECTION_WAIT` for this
    /// process's other writes, then the engine's own bound for the lock.
    pub fn write<T>(&self, f: impl FnOnce(&Conn) -> Result<T>) -> Result<T> {
        let mut lease = self.writer.get()?;
        match lease.engine() {
            Engine::Sqlite(c) => sqlite::write(c, |c| f(&Conn::Sqlite(c))),
            Engine::Postgres(p) => p.write(|p| f(&Conn::Postgres(p))),
        }
    }
}

/// A random secret of 32 bytes, URL-safe base64 (43 characters).
pub fn secret() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the kernel's random numbers");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod parameters {
    /// SQLite takes `$n` as a name and numbers names as they first appear: a statement whose
    /// `$2` comes before its `$1` binds them the other way round there (and right on
    /// PostgreSQL). Every statement of the harness uses its parameters first in order.
    #[test]
    fn every_statement_uses_its_parameters_first_in_order() {
        // Every crate's sources: the statements live in the crates that own their tables.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut stack = vec![root.join("src"), root.join("crates")];
        let mut wrong = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for literal in text.split('"').skip(1).step_by(2) {
                    let sql = ["SELECT ", "UPDATE ", "INSERT ", "DELETE "];
                    if !sql.iter().any(|k| literal.contains(k)) {
                        continue;
                    }
                    let mut seen: Vec<u32> = Vec::new();
                    for part in literal.split('$').skip(1) {
                        let digits: String =
                            part.chars().take_while(char::is_ascii_digit).collect();
                        if let Ok(n) = digits.parse() {
                            if !seen.contains(&n) {
                                seen.push(n);
                            }
                        }
                    }
                    if seen.iter().enumerate().any(|(i, n)| *n as usize != i + 1) {
                        wrong.push(format!("{}: {}", path.display(), literal.trim()));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}

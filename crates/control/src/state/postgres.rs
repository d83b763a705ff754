//! The fleet's engine: PostgreSQL at `CLOUD_HARNESS_DATABASE_URL`, shared by every runner.
//! One connection per process, driven by a runtime of its own so that callers on any thread
//! (async or not) wait for it the same way they wait for SQLite. Write transactions take one
//! advisory lock first, so writers across the fleet serialize exactly as SQLite's
//! `BEGIN IMMEDIATE` makes them (the control plane writes little; what it writes must never
//! interleave). A lost connection is made again on the next use. Every session waits at most
//! [`LOCK_TIMEOUT`] for a lock and runs a statement at most [`STATEMENT_TIMEOUT`] (unless
//! the URL's `options` set them), so a lock held elsewhere or a slow server is an error to
//! retry, never a wait without end.

use super::values::{DbError, DbResult, ErrorKind, Row, Value};
use bytes::BytesMut;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

/// The advisory lock every write transaction holds ("ch" and 1).
const WRITE_LOCK: i64 = 0x6368_0001;

/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a statement may wait for a lock (`lock_timeout`): as long as SQLite's busy
/// timeout.
pub(crate) const LOCK_TIMEOUT: Duration = super::sqlite::BUSY_TIMEOUT;
/// How long a statement may run (`statement_timeout`).
pub(crate) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long this side waits for any answer before it gives the connection up (a server or a
/// network that hangs never says `statement_timeout`): that, and a margin.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(35);

/// Where the database is: what connecting needs, and the URL without its password.
#[derive(Clone)]
pub struct Target {
    config: tokio_postgres::Config,
    shown: String,
}

impl Target {
    pub fn parse(url: &str) -> DbResult<Target> {
        let shown = crate::config::redact(url);
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| DbError {
            kind: ErrorKind::Other,
            message: format!("CLOUD_HARNESS_DATABASE_URL {shown}: {e}"),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("cloud-harness");
        }
        Ok(Target { config, shown })
    }

    /// A new connection (a session with its timeouts set).
    pub fn connect(&self) -> DbResult<Pg> {
        Ok(Pg {
            client: open(&self.config, &self.shown)?,
            target: self.clone(),
            statements: RefCell::default(),
            failed: Cell::new(false),
            lost: Cell::new(false),
        })
    }
}

/// Rolls a transaction back if dropped while a panic unwinds.
struct RollbackOnPanic<'a>(&'a Pg);

impl Drop for RollbackOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lost.set(true);
            let _ = self.0.batch("ROLLBACK");
        }
    }
}

pub struct Pg {
    target: Target,
    client: tokio_postgres::Client,
    statements: RefCell<HashMap<String, tokio_postgres::Statement>>,
    /// A statement failed inside the current transaction (PostgreSQL then refuses the rest).
    failed: Cell<bool>,
    /// An answer never came: the connection is made again before its next use.
    lost: Cell<bool>,
}

impl Pg {
    pub fn shown(&self) -> &str {
        &self.target.shown
    }

    /// A new connection if the last one is known to be lost.
    pub(crate) fn ensure(&mut self) -> DbResult<()> {
        if self.client.is_closed() || self.lost.get() {
            self.reconnect()?;
        }
        Ok(())
    }

    /// A new connection (the last one failed: the server restarted, a proxy cut it).
    pub(crate) fn reconnect(&mut self) -> DbResult<()> {
        tracing::warn!(database = %self.target.shown, "the state database connection was lost; connecting again");
        self.client = open(&self.target.config, &self.target.shown)?;
        self.statements.borrow_mut().clear();
        self.lost.set(false);
        Ok(())
    }

    /// `f` in a transaction holding the fleet's write lock, committed only if `f` succeeds
    /// and no statement in it failed.
    pub fn write<T, E: From<DbError>>(
        &mut self,
        f: impl FnOnce(&Pg) -> Result<T, E>,
    ) -> Result<T, E> {
        self.ensure()?;
        let begin = format!("BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})");
        match self.batch(&begin) {
            // Nothing was done yet: on a new connection, begin again.
            Err(e) if e.kind == ErrorKind::Unavailable => {
                self.reconnect()?;
                self.batch(&begin)?;
            }
            r => r?,
        }
        self.failed.set(false);
        // A panic in `f` leaves no transaction open, and so no fleet-wide lock held: it is
        // rolled back as the panic goes by, and the connection made again before its next use.
        let guard = RollbackOnPanic(self);
        let value = f(self);
        std::mem::forget(guard);
        match value {
            Ok(v) if !self.failed.get() => {
                self.batch("COMMIT")?;
                Ok(v)
            }
            Ok(_) => {
                let _ = self.batch("ROLLBACK");
                Err(DbError::other("a statement failed inside a transaction that went on").into())
            }
            Err(e) => {
                let _ = self.batch("ROLLBACK");
                Err(e)
            }
        }
    }

    pub fn batch(&self, sql: &str) -> DbResult<()> {
        self.wait(self.client.batch_execute(sql))
    }

    pub fn execute(&self, sql: &str, values: &[Value]) -> DbResult<u64> {
        let st = self.statement(sql)?;
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as _).collect();
        self.wait(self.client.execute(&st, &params))
    }

    pub fn rows(&self, sql: &str, values: &[Value]) -> DbResult<Vec<Row>> {
        let st = self.statement(sql)?;
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as _).collect();
        let rows = self.wait(self.client.query(&st, &params))?;
        let names: std::sync::Arc<[String]> =
            st.columns().iter().map(|c| c.name().to_owned()).collect();
        rows.iter()
            .map(|r| {
                let values = (0..r.len())
                    .map(|i| r.try_get::<_, Value>(i).map_err(|e| self.error(e)))
                    .collect::<DbResult<Vec<Value>>>()?;
                Ok(Row {
                    names: names.clone(),
                    values,
                })
            })
            .collect()
    }

    fn statement(&self, sql: &str) -> DbResult<tokio_postgres::Statement> {
        if let Some(st) = self.statements.borrow().get(sql) {
            return Ok(st.clone());
        }
        let st = self.wait(self.client.prepare(sql))?;
        self.statements
            .borrow_mut()
            .insert(sql.to_owned(), st.clone());
        Ok(st)
    }

    /// The answer of `request`, waited for at most [`ANSWER_TIMEOUT`] (the runtime's timer
    /// keeps the time, whichever thread waits).
    fn wait<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> DbResult<T> {
        let _timer = runtime()?.enter();
        match futures_executor::block_on(tokio::time::timeout(ANSWER_TIMEOUT, request)) {
            Ok(r) => self.checked(r),
            Err(_) => {
                self.failed.set(true);
                self.lost.set(true);
                Err(DbError {
                    kind: ErrorKind::Timeout,
                    message: format!(
                        "the state database at {} did not answer within {} s",
                        self.target.shown,
                        ANSWER_TIMEOUT.as_secs()
                    ),
                })
            }
        }
    }

    fn checked<T>(&self, r: Result<T, tokio_postgres::Error>) -> DbResult<T> {
        r.map_err(|e| {
            self.failed.set(true);
            self.error(e)
        })
    }

    fn error(&self, e: tokio_postgres::Error) -> DbError {
        error(e, &self.target.shown)
    }
}

/// The runtime that drives every connection to the state database, whatever thread queries
/// it (a server's worker, a blocking thread, the CLI's main thread). Static: a runtime may not
/// be dropped from inside another.
fn runtime() -> DbResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: std::sync::OnceLock<std::io::Result<tokio::runtime::Runtime>> =
        std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("state-db")
                .enable_all()
                .build()
                // Rows are decoded here and dropped by whoever asked (memory::idle).
                .inspect(|made| cloud_harness_memory::idle::answered_by(made.handle()))
        })
        .as_ref()
        .map_err(|e| DbError::other(format!("a runtime for the state database: {e}")))
}

/// The `SET`s that bound every statement of a session, but for those the URL's `options`
/// set already (`options=-c statement_timeout=5s`).
fn session_settings(config: &tokio_postgres::Config) -> String {
    let options = config.get_options().unwrap_or_default();
    [
        ("lock_timeout", LOCK_TIMEOUT),
        ("statement_timeout", STATEMENT_TIMEOUT),
    ]
    .iter()
    .filter(|(name, _)| !options.contains(name))
    .map(|(name, d)| format!("SET {name} = {}; ", d.as_millis()))
    .collect()
}

fn open(config: &tokio_postgres::Config, shown: &str) -> DbResult<tokio_postgres::Client> {
    let config = config.clone();
    let tls = tls().map_err(|e| DbError::other(format!("TLS for the state database: {e}")))?;
    let settings = session_settings(&config);
    // The whole of it bounded: `connect_timeout` covers the TCP connect only, and a server
    // (or a balancer) that accepts and then says nothing would hold the caller forever.
    let connecting = async move {
        let (client, connection) = config.connect(tls).await?;
        // The connection's own task does the reading and writing for every query.
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "the state database connection ended");
            }
        });
        if !settings.is_empty() {
            client.batch_execute(&settings).await?;
        }
        Ok::<_, tokio_postgres::Error>(client)
    };
    // (The timer is made on the runtime: it needs its clock.)
    let connected =
        runtime()?.spawn(async move { tokio::time::timeout(ANSWER_TIMEOUT, connecting).await });
    match futures_executor::block_on(connected) {
        Ok(Ok(r)) => r.map_err(|e| error(e, shown)),
        Ok(Err(_)) => Err(DbError {
            kind: ErrorKind::Timeout,
            message: format!(
                "connecting to the state database at {shown} took more than {} s",
                ANSWER_TIMEOUT.as_secs()
            ),
        }),
        Err(e) => Err(DbError::other(format!(
            "connecting to the state database: {e}"
        ))),
    }
}

/// TLS as the URL's `sslmode` asks (PostgreSQL's default, `prefer`, uses it when offered),
/// checked against the system's roots.
fn tls() -> Result<postgres_native_tls::MakeTlsConnector, native_tls::Error> {
    Ok(postgres_native_tls::MakeTlsConnector::new(
        native_tls::TlsConnector::new()?,
    ))
}

/// Whether the connection failed in its TLS handshake (a certificate that does not verify).
fn tls_failed(e: &tokio_postgres::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<native_tls::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

fn error(e: tokio_postgres::Error, shown: &str) -> DbError {
    let kind = match e.code() {
        Some(c)
            if *c == SqlState::UNIQUE_VIOLATION
                || *c == SqlState::CHECK_VIOLATION
                || *c == SqlState::FOREIGN_KEY_VIOLATION
                || *c == SqlState::NOT_NULL_VIOLATION
                || *c == SqlState::EXCLUSION_VIOLATION =>
        {
            ErrorKind::Constraint
        }
        // The server ended the session (an administrator, a restart, a failover: class 57P)
        // or the connection failed (class 08): nothing of the statement ran, a new
        // connection may succeed.
        Some(c) if c.code().starts_with("57P") || c.code().starts_with("08") => {
            ErrorKind::Unavailable
        }
        // `statement_timeout` (or a cancel) and `lock_timeout`: the statement was undone.
        Some(c) if *c == SqlState::QUERY_CANCELED || *c == SqlState::LOCK_NOT_AVAILABLE => {
            ErrorKind::Timeout
        }
        Some(c) if *c == SqlState::DISK_FULL => ErrorKind::Full,
        Some(_) => ErrorKind::Other,
        // No SQL state: the connection (refused, lost, timed out) rather than a statement.
        None => ErrorKind::Unavailable,
    };
    let message = match kind {
        ErrorKind::Unavailable if tls_failed(&e) => format!(
            "the state database at {shown}: {e} (its certificate must verify against the system's roots; on a trusted network add sslmode=disable to the URL)"
        ),
        ErrorKind::Unavailable => format!("the state database at {shown} is unreachable: {e}"),
        ErrorKind::Full => format!("the state database at {shown}: its disk is full (ENOSPC)"),
        ErrorKind::Timeout => format!(
            "the state database at {shown} did not answer in time: {}",
            e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_owned())
        ),
        _ => match e.as_db_error() {
            Some(db) => db.message().to_owned(),
            None => e.to_string(),
        },
    };
    DbError { kind, message }
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match (self, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Int(i), &Type::INT8) => i.to_sql(ty, out),
            (Value::Int(i), &Type::INT4) => i32::try_from(*i)?.to_sql(ty, out),
            (Value::Int(i), &Type::INT2) => i16::try_from(*i)?.to_sql(ty, out),
            (Value::Int(i), &Type::BOOL) => (*i != 0).to_sql(ty, out),
            (Value::Bool(b), &Type::BOOL) => b.to_sql(ty, out),
            (Value::Bool(b), &Type::INT8) => i64::from(*b).to_sql(ty, out),
            (Value::Text(s), _) if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
            (v, ty) => Err(format!("{v:?} cannot be a parameter of type {ty}").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

impl<'a> FromSql<'a> for Value {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Value, Box<dyn std::error::Error + Sync + Send>> {
        Ok(match *ty {
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Bool(bool::from_sql(ty, raw)?),
            _ if <String as FromSql>::accepts(ty) => Value::Text(String::from_sql(ty, raw)?),
            _ => {
                return Err(format!("a column of type {ty}, which the schema never stores").into())
            }
        })
    }

    fn from_sql_null(_: &Type) -> Result<Value, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Value::Null)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

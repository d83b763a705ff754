//! What the control plane's queries pass and get back, whichever engine runs them: values,
//! parameters, rows and errors.

/// A value going into or coming out of a statement: the few kinds the schema uses.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Bool(bool),
    Text(String),
}

/// Something a statement can take as a parameter.
pub trait Param {
    fn value(&self) -> Value;
}

impl Param for i64 {
    fn value(&self) -> Value {
        Value::Int(*self)
    }
}

impl Param for bool {
    fn value(&self) -> Value {
        Value::Bool(*self)
    }
}

impl Param for str {
    fn value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl Param for String {
    fn value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl<T: Param + ?Sized> Param for &T {
    fn value(&self) -> Value {
        (**self).value()
    }
}

impl<T: Param> Param for Option<T> {
    fn value(&self) -> Value {
        self.as_ref().map_or(Value::Null, Param::value)
    }
}

/// Parameters for a statement, `$1` first: `params![id, name]`.
#[macro_export]
macro_rules! params {
    ($($p:expr),* $(,)?) => {
        &[$(&$p as &dyn $crate::state::Param),*] as &[&dyn $crate::state::Param]
    };
}

/// A column's value as a Rust type.
pub trait FromValue: Sized {
    fn from_value(v: &Value) -> Option<Self>;
}

impl FromValue for i64 {
    fn from_value(v: &Value) -> Option<i64> {
        match v {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
}

impl FromValue for bool {
    // SQLite has no booleans: 0 and 1 stand for them.
    fn from_value(v: &Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }
}

impl FromValue for String {
    fn from_value(v: &Value) -> Option<String> {
        match v {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Option<Option<T>> {
        match v {
            Value::Null => Some(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// One row of an answer.
#[derive(Debug)]
pub struct Row {
    /// The answer's column names, shared by its rows.
    pub(super) names: std::sync::Arc<[String]>,
    pub(super) values: Vec<Value>,
}

/// A column by position (from 0) or by name.
pub trait Column: std::fmt::Debug {
    fn position(&self, names: &[String]) -> Option<usize>;
}

impl Column for usize {
    fn position(&self, names: &[String]) -> Option<usize> {
        (*self < names.len()).then_some(*self)
    }
}

impl Column for &str {
    fn position(&self, names: &[String]) -> Option<usize> {
        names.iter().position(|n| n == self)
    }
}

impl Row {
    /// Column `c` as a `T`.
    pub fn get<T: FromValue>(&self, c: impl Column) -> DbResult<T> {
        let v = c
            .position(&self.names)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| DbError::other(format!("no column {c:?}")))?;
        T::from_value(v).ok_or_else(|| {
            DbError::other(format!(
                "column {c:?} holds {v:?}, not a {}",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// What went wrong, as far as a caller decides on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A query for one row found none.
    NoRows,
    /// A unique, check or foreign-key constraint refused a row.
    Constraint,
    /// The database cannot be reached (a server down, a connection lost).
    Unavailable,
    /// A statement waited too long for a lock or ran too long (SQLite's busy timeout,
    /// PostgreSQL's `lock_timeout` or `statement_timeout`): nothing of it was kept, and trying
    /// again later may succeed.
    Timeout,
    /// The database's disk is full (SQLite's `SQLITE_FULL`, PostgreSQL's `disk_full`): the
    /// statement was undone, and it may succeed once space returns.
    Full,
    Other,
}

#[derive(Debug)]
pub struct DbError {
    pub kind: ErrorKind,
    pub message: String,
}

impl DbError {
    pub(super) fn other(message: impl Into<String>) -> DbError {
        DbError {
            kind: ErrorKind::Other,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

pub type DbResult<T> = std::result::Result<T, DbError>;

/// `query_row`'s "no row" as `None`.
pub trait Optional<T> {
    fn optional(self) -> DbResult<Option<T>>;
}

impl<T> Optional<T> for DbResult<T> {
    fn optional(self) -> DbResult<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind == ErrorKind::NoRows => Ok(None),
            Err(e) => Err(e),
        }
    }
}

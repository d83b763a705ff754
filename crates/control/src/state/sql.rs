//! What the control plane's queries are written against, whichever engine runs them: a
//! connection that SQLite and PostgreSQL each answer (the values, parameters, rows and errors
//! it takes and gives are in `values`). The statements themselves are written once, in the SQL
//! both engines accept.

use super::values::{DbError, DbResult, ErrorKind, Param, Row, Value};
use super::{postgres::Pg, sqlite};

/// An open connection of either engine.
pub(super) enum Engine {
    Sqlite(rusqlite::Connection),
    Postgres(Box<Pg>),
}

/// A connection (inside a transaction when [`super::Db::write`] gave it).
#[derive(Clone, Copy)]
pub enum Conn<'a> {
    Sqlite(&'a rusqlite::Connection),
    Postgres(&'a Pg),
}

impl<'a> Conn<'a> {
    /// Runs a statement; how many rows it changed.
    pub fn execute(&self, sql: &str, params: &[&dyn Param]) -> DbResult<u64> {
        let values = values(params);
        match self {
            Conn::Sqlite(c) => sqlite::execute(c, sql, &values),
            Conn::Postgres(p) => p.execute(sql, &values),
        }
    }

    /// Runs statements without parameters, separated by semicolons.
    pub fn execute_batch(&self, sql: &str) -> DbResult<()> {
        match self {
            Conn::Sqlite(c) => c.execute_batch(sql).map_err(sqlite::error),
            Conn::Postgres(p) => p.batch(sql),
        }
    }

    /// The first row's `f`; [`ErrorKind::NoRows`] when there is none.
    pub fn query_row<T>(
        &self,
        sql: &str,
        params: &[&dyn Param],
        f: impl FnOnce(&Row) -> DbResult<T>,
    ) -> DbResult<T> {
        let rows = self.rows(sql, params)?;
        match rows.first() {
            Some(r) => f(r),
            None => Err(DbError {
                kind: ErrorKind::NoRows,
                message: "no row".to_owned(),
            }),
        }
    }

    /// Every row's `f`, in order.
    pub fn query_map<T>(
        &self,
        sql: &str,
        params: &[&dyn Param],
        f: impl FnMut(&Row) -> DbResult<T>,
    ) -> DbResult<std::vec::IntoIter<DbResult<T>>> {
        let rows = self.rows(sql, params)?;
        Ok(rows.iter().map(f).collect::<Vec<_>>().into_iter())
    }

    /// A statement to run (each engine keeps it prepared for next time).
    pub fn prepare_cached<'s>(&self, sql: &'s str) -> DbResult<Statement<'a, 's>> {
        Ok(Statement { conn: *self, sql })
    }

    fn rows(&self, sql: &str, params: &[&dyn Param]) -> DbResult<Vec<Row>> {
        let values = values(params);
        match self {
            Conn::Sqlite(c) => sqlite::rows(c, sql, &values),
            Conn::Postgres(p) => p.rows(sql, &values),
        }
    }
}

fn values(params: &[&dyn Param]) -> Vec<Value> {
    params.iter().map(|p| p.value()).collect()
}

/// A statement and the connection it runs on.
pub struct Statement<'a, 's> {
    conn: Conn<'a>,
    sql: &'s str,
}

impl Statement<'_, '_> {
    pub fn execute(&mut self, params: &[&dyn Param]) -> DbResult<u64> {
        self.conn.execute(self.sql, params)
    }

    pub fn query_row<T>(
        &mut self,
        params: &[&dyn Param],
        f: impl FnOnce(&Row) -> DbResult<T>,
    ) -> DbResult<T> {
        self.conn.query_row(self.sql, params, f)
    }

    pub fn query_map<T>(
        &mut self,
        params: &[&dyn Param],
        f: impl FnMut(&Row) -> DbResult<T>,
    ) -> DbResult<std::vec::IntoIter<DbResult<T>>> {
        self.conn.query_map(self.sql, params, f)
    }
}

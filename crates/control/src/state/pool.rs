//! Connections lent out one caller at a time, with a bounded wait for one: the writer (one
//! connection, opened at start) and the readers (a few, each opened when first needed, so a
//! CLI opens one). A write waiting for the database's lock (another process's SQLite
//! transaction, a PostgreSQL lock, the fleet's advisory lock) holds the writer, never a
//! reader: SQLite's WAL lets readers read while another connection writes.

use super::sql::Engine;
use cloud_harness_error::{Code, Error, Result};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Reading connections at most, per process.
pub(crate) const MAX_READERS: usize = 4;
/// How long a statement waits for a connection when all are in use (then TIMEOUT).
pub(crate) const CONNECTION_WAIT: Duration = Duration::from_secs(10);

type Opener = Box<dyn Fn() -> Result<Engine> + Send + Sync>;

pub struct Pool {
    /// What the connections are for, as errors name them: `reading`, `writing`.
    role: &'static str,
    max: usize,
    open: Opener,
    slots: Mutex<Slots>,
    freed: Condvar,
}

#[derive(Default)]
struct Slots {
    idle: Vec<Engine>,
    /// Opened and not closed, idle or in use.
    count: usize,
}

/// A connection lent out; back to the idle ones when dropped.
pub struct Lease<'a> {
    pool: &'a Pool,
    engine: Option<Engine>,
}

impl Pool {
    /// Up to `max` connections, opened by `open` when first needed.
    pub fn new(
        role: &'static str,
        max: usize,
        open: impl Fn() -> Result<Engine> + Send + Sync + 'static,
    ) -> Pool {
        Pool {
            role,
            max,
            open: Box::new(open),
            slots: Mutex::default(),
            freed: Condvar::new(),
        }
    }

    /// One connection, `engine`, already open.
    pub fn one(role: &'static str, engine: Engine) -> Pool {
        let pool = Pool::new(role, 1, || {
            Err(Error::internal("a pool of one opens no other connection"))
        });
        let mut slots = pool.slots.lock().expect("connections");
        slots.idle.push(engine);
        slots.count = 1;
        drop(slots);
        pool
    }

    /// An idle connection, a new one while there are fewer than `max`, or the first one
    /// freed within [`CONNECTION_WAIT`] (else TIMEOUT, retryable).
    pub fn get(&self) -> Result<Lease<'_>> {
        let deadline = Instant::now() + CONNECTION_WAIT;
        let mut slots = self.slots.lock().expect("connections");
        loop {
            if let Some(engine) = slots.idle.pop() {
                return Ok(self.lease(engine));
            }
            if slots.count < self.max {
                slots.count += 1;
                drop(slots);
                return match (self.open)() {
                    Ok(engine) => Ok(self.lease(engine)),
                    Err(e) => {
                        self.slots.lock().expect("connections").count -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    Code::Timeout,
                    format!(
                        "the {} connections to the state database stayed busy for {} s (another process may hold its lock)",
                        self.role,
                        CONNECTION_WAIT.as_secs()
                    ),
                )
                .with_details(serde_json::json!({ "retryable": true })));
            }
            slots = self.freed.wait_timeout(slots, left).expect("connections").0;
        }
    }

    fn lease(&self, engine: Engine) -> Lease<'_> {
        Lease {
            pool: self,
            engine: Some(engine),
        }
    }

    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.slots.lock().expect("connections").count
    }
}

impl Lease<'_> {
    pub fn engine(&mut self) -> &mut Engine {
        self.engine.as_mut().expect("a leased connection")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            self.pool
                .slots
                .lock()
                .expect("connections")
                .idle
                .push(engine);
            self.pool.freed.notify_one();
        }
    }
}

//! The connections that read, apart from the one that writes: a write waiting for the
//! database's lock (another process's SQLite transaction, a PostgreSQL lock, the fleet's
//! advisory lock) holds the writer, never a read. SQLite's WAL lets these read while another
//! connection writes. A few at most, each opened when first needed, so a CLI opens one.

use super::Engine;
use cloud_harness_fs::{Code, Error, Result};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Reading connections at most, per process.
pub const MAX_READERS: usize = 4;
/// How long a read waits for a connection when all are in use.
pub const READER_WAIT: Duration = Duration::from_secs(10);

type Opener = Box<dyn Fn() -> Result<Engine> + Send + Sync>;

pub struct Readers {
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
    readers: &'a Readers,
    engine: Option<Engine>,
}

impl Readers {
    pub fn new(open: impl Fn() -> Result<Engine> + Send + Sync + 'static) -> Readers {
        Readers {
            open: Box::new(open),
            slots: Mutex::default(),
            freed: Condvar::new(),
        }
    }

    /// An idle connection, a new one while there are fewer than [`MAX_READERS`], or the first
    /// one freed within [`READER_WAIT`] (else TIMEOUT).
    pub fn get(&self) -> Result<Lease<'_>> {
        let deadline = Instant::now() + READER_WAIT;
        let mut slots = self.slots.lock().expect("readers");
        loop {
            if let Some(engine) = slots.idle.pop() {
                return Ok(self.lease(engine));
            }
            if slots.count < MAX_READERS {
                slots.count += 1;
                drop(slots);
                return match (self.open)() {
                    Ok(engine) => Ok(self.lease(engine)),
                    Err(e) => {
                        self.slots.lock().expect("readers").count -= 1;
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
                        "all {MAX_READERS} reading connections to the state database stayed busy for {} s",
                        READER_WAIT.as_secs()
                    ),
                )
                .with_details(serde_json::json!({ "retryable": true })));
            }
            slots = self.freed.wait_timeout(slots, left).expect("readers").0;
        }
    }

    fn lease(&self, engine: Engine) -> Lease<'_> {
        Lease {
            readers: self,
            engine: Some(engine),
        }
    }

    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.slots.lock().expect("readers").count
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
            self.readers
                .slots
                .lock()
                .expect("readers")
                .idle
                .push(engine);
            self.readers.freed.notify_one();
        }
    }
}

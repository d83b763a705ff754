//! The thread that writes what was counted: every `usage.flush_seconds` (and once more when
//! the server stops), with the retention applied at start and every hour after.

use super::stored::{self, Retention};
use crate::config::env_number;
use crate::state::Db;
use cloud_harness_error::{Error, Result};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const RETAIN_EVERY: Duration = Duration::from_secs(3600);
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

/// The usage settings, as the environment (or the configuration file) gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub counting: bool,
    pub every: Duration,
    pub retention: Retention,
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        let counting = match std::env::var("CLOUD_HARNESS_USAGE").as_deref() {
            Err(_) | Ok("" | "on") => true,
            Ok("off") => false,
            Ok(other) => {
                return Err(Error::invalid(format!(
                    "CLOUD_HARNESS_USAGE: {other:?} is neither on nor off"
                )))
            }
        };
        let every = env_number("CLOUD_HARNESS_USAGE_FLUSH_SECONDS", 10)?.clamp(1, 3600);
        let days = |name, default| env_number(name, default).map(|d| d.clamp(1, 36_500) as i64);
        Ok(Settings {
            counting,
            every: Duration::from_secs(every),
            retention: Retention {
                events_days: days("CLOUD_HARNESS_USAGE_RETENTION_DAYS", 30)?,
                daily_days: days("CLOUD_HARNESS_USAGE_DAILY_RETENTION_DAYS", 400)?,
            },
        })
    }
}

/// The running flush; [`Flusher::stop`] writes what is left.
pub struct Flusher {
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Counting turned on or off as `settings` say, and, when on, flushed into `db`.
    pub fn start(db: Db, settings: Settings) -> Result<Option<Flusher>> {
        super::set_enabled(settings.counting);
        if !settings.counting {
            return Ok(None);
        }
        // What the database refuses is kept for the next flushes for about a minute, then
        // given up (counted as dropped): a row it will never take does not stop the others.
        let keep = (GIVE_UP_AFTER.as_secs() / settings.every.as_secs().max(1)).max(1);
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("usage-flush".into())
            .spawn(move || {
                let mut retained: Option<Instant> = None;
                let mut refused = 0;
                loop {
                    if retained.is_none_or(|at| at.elapsed() >= RETAIN_EVERY) {
                        retained = Some(Instant::now());
                        match stored::retain(&db, settings.retention, crate::state::now_ms()) {
                            Ok((events, days)) if events + days > 0 => {
                                tracing::info!(events, days, "old skill usage deleted")
                            }
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "cannot delete old skill usage"),
                        }
                    }
                    let last = !matches!(
                        stopped.recv_timeout(settings.every),
                        Err(RecvTimeoutError::Timeout)
                    );
                    match stored::flush_counted(&db, refused + 1 >= keep || last) {
                        Ok(()) => refused = 0,
                        Err(e) => {
                            refused += 1;
                            tracing::warn!(error = %e, "cannot write skill usage; kept for the next flush, for a minute");
                        }
                    }
                    if last {
                        return;
                    }
                }
            })
            .map_err(|e| Error::internal(format!("starting the usage flush: {e}")))?;
        Ok(Some(Flusher {
            stop,
            thread: Some(thread),
        }))
    }

    /// Writes what was counted since the last flush and ends the thread.
    pub fn stop(mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

//! Default-head resolutions: a git toolkit without `ref` targets its default branch head, and
//! the commit that head was at is kept per URL for `CLOUD_HARNESS_HEAD_TTL` seconds (default
//! 600), so a burst of opens — a fleet of agent sessions starting on one task — fetches once
//! and the rest start warm, while a push still shows within ten minutes. 0 asks every time.

use crate::params;
use crate::state::Optional;
use crate::state::{self, Db};
use cloud_harness_error::Result;
use std::time::Duration;

pub(crate) const DEFAULT_TTL_SECS: u64 = 600;

pub fn ttl() -> Result<Duration> {
    crate::config::env_number("CLOUD_HARNESS_HEAD_TTL", DEFAULT_TTL_SECS).map(Duration::from_secs)
}

/// The commit `url`'s head was found at, and when (ms), if that is less than `ttl` ago.
pub fn fresh(db: &Db, url: &str, ttl: Duration) -> Result<Option<(String, i64)>> {
    if ttl.is_zero() {
        return Ok(None);
    }
    let oldest = state::now_ms() - ttl.as_millis() as i64;
    db.with(|c| {
        c.prepare_cached("SELECT commit_id, resolved_at FROM head_resolutions WHERE url = $1 AND resolved_at > $2")?
            .query_row(params![url, oldest], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
    })
}

/// Keeps that `url`'s head is at `commit` now; when that was (ms).
pub fn remember(db: &Db, url: &str, commit: &str) -> Result<i64> {
    let now = state::now_ms();
    db.write(|tx| {
        tx.execute(
            "INSERT INTO head_resolutions (url, commit_id, resolved_at) VALUES ($1, $2, $3)
             ON CONFLICT (url) DO UPDATE SET commit_id = $2, resolved_at = $3",
            params![url, commit, now],
        )
        .map_err(state::internal)?;
        Ok(now)
    })
}

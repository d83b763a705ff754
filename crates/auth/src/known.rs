//! The secrets that exist, by hash: every active token and live browser session, read from
//! the database at most once per [`CACHE_TTL`] (and again after anything this
//! process makes or ends one), so a secret no one made is refused from memory. A flood of
//! made-up tokens then costs a hash each and never queues before the callers whose tokens
//! are real, new ones included.

use cloud_harness_control::params;
use cloud_harness_control::state::Db;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a secret's check is reused (a revocation by another process takes this long to
/// reach this one; one by this process, none).
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(1);
/// How long a request waits for its check (a free slot and the database's answer).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What a secret is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bearer token (`cht_…`).
    Token,
    /// A browser session's cookie.
    Cookie,
}

/// Secrets of each kind read at most (past it, the set is not used: every check asks the
/// database, as before there was one).
const MOST: i64 = 200_000;

/// Bumped when this process makes or ends a secret: a set read before is stale.
static CHANGED: AtomicU64 = AtomicU64::new(0);

/// A secret was made or ended here.
pub fn changed() {
    CHANGED.fetch_add(1, Ordering::SeqCst);
}

struct Loaded {
    at: Instant,
    generation: u64,
    tokens: HashSet<String>,
    sessions: HashSet<String>,
}

pub struct Known {
    loaded: watch::Sender<Option<Arc<Loaded>>>,
    reading: Arc<AtomicBool>,
}

impl Default for Known {
    fn default() -> Self {
        Known {
            loaded: watch::channel(None).0,
            reading: Arc::default(),
        }
    }
}

impl Known {
    /// Whether a secret of `kind` whose hash is `hash` exists; `None` when that cannot be
    /// known in time (the database is slow or out of reach): the caller asks it as before.
    pub async fn exists(&self, db: &Db, kind: Kind, hash: &str) -> Option<bool> {
        let fresh = |l: &Option<Arc<Loaded>>| {
            l.as_ref()
                .filter(|l| {
                    l.at.elapsed() < CACHE_TTL && l.generation == CHANGED.load(Ordering::SeqCst)
                })
                .cloned()
        };
        let mut seen = self.loaded.subscribe();
        if let Some(l) = fresh(&seen.borrow_and_update()) {
            return Some(l.has(kind, hash));
        }
        self.read(db);
        let waited = tokio::time::timeout(CHECK_TIMEOUT, async {
            loop {
                if seen.changed().await.is_err() {
                    return None;
                }
                if let Some(l) = fresh(&seen.borrow_and_update()) {
                    return Some(l);
                }
            }
        })
        .await;
        waited.ok().flatten().map(|l| l.has(kind, hash))
    }

    /// Reads the sets again on the blocking pool, unless a read is under way.
    fn read(&self, db: &Db) {
        if self.reading.swap(true, Ordering::SeqCst) {
            return;
        }
        let (db, loaded, reading) = (db.clone(), self.loaded.clone(), self.reading.clone());
        cloud_harness_memory::idle::spawn_blocking(move || {
            let generation = CHANGED.load(Ordering::SeqCst);
            let at = Instant::now();
            let hashes = |sql: &str, value: i64| -> Option<HashSet<String>> {
                let all: Vec<String> = db
                    .with(|c| {
                        c.prepare_cached(sql)?
                            .query_map(params![value, MOST + 1], |r| r.get(0))?
                            .collect()
                    })
                    .ok()?;
                (all.len() as i64 <= MOST).then(|| all.into_iter().collect())
            };
            let tokens = hashes(
                "SELECT hash FROM tokens WHERE revoked_at IS NULL AND created_at >= $1 LIMIT $2",
                0,
            );
            let sessions = hashes(
                "SELECT hash FROM browser_sessions WHERE expires_at > $1 LIMIT $2",
                cloud_harness_control::state::now_ms(),
            );
            if let (Some(tokens), Some(sessions)) = (tokens, sessions) {
                loaded.send_replace(Some(Arc::new(Loaded {
                    at,
                    generation,
                    tokens,
                    sessions,
                })));
            }
            reading.store(false, Ordering::SeqCst);
        });
    }
}

impl Loaded {
    fn has(&self, kind: Kind, hash: &str) -> bool {
        match kind {
            Kind::Token => self.tokens.contains(hash),
            Kind::Cookie => self.sessions.contains(hash),
        }
    }
}

//! Token and session checks as the HTTP listener makes them: never on an async worker, never
//! more than a few at once, never waited for beyond [`CHECK_TIMEOUT`].
//!
//! A secret's check is kept for [`CACHE_TTL`] (one it refused, [`REFUSED_TTL`]); one check
//! per secret runs at a time, on the blocking pool, and callers of that secret share its
//! answer. Secrets seen before (a caller at work) are checked again under their own bound
//! ([`KNOWN_CHECKS`]), apart from secrets never seen ([`UNKNOWN_CHECKS`]); a secret no one
//! made is refused from the set of those that exist (`known`) without asking the database, so
//! a flood of made-up tokens never delays callers, new or already let in. When the
//! database does not answer in time, a caller checked within [`STALE_GRACE`] is let in as it
//! was; anyone else gets a retryable TIMEOUT. A revocation in this process voids every kept
//! check at once ([`forget_cached`]); one made elsewhere takes effect here within
//! [`CACHE_TTL`] (within [`STALE_GRACE`] while this process cannot reach the database).

pub(crate) use super::known::Kind;
use super::known::{CACHE_TTL, CHECK_TIMEOUT};
use super::Identity;
use cloud_harness_control::state::Db;
use cloud_harness_error::{Code, Error};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How long a secret found unknown stays refused without asking again.
pub(crate) const REFUSED_TTL: Duration = Duration::from_secs(10);
/// How long a checked identity stays good while the database cannot answer.
pub(crate) const STALE_GRACE: Duration = Duration::from_secs(60);
/// Checks at once of secrets that were let in before.
pub(crate) const KNOWN_CHECKS: usize = 2;
/// Checks at once of secrets never seen (or refused before).
pub(crate) const UNKNOWN_CHECKS: usize = 1;
/// Identities kept at most; past it, those older than [`STALE_GRACE`] go, then all.
const MAX_FOUND: usize = 10_000;
/// Refused secrets kept at most; past it, all go.
const MAX_REFUSED: usize = 4_096;

/// Bumped by every revocation in this process: checks made before it are void.
static REVOKED: AtomicU64 = AtomicU64::new(0);

/// Voids every kept check (a token was revoked, a session ended).
pub(crate) fn forget_cached() {
    REVOKED.fetch_add(1, Ordering::SeqCst);
    super::known::changed();
}

type Answer = Result<Option<Identity>, Error>;

pub struct Checks {
    db: Db,
    /// The secrets that exist: one no one made is refused without queuing for the database.
    exist: super::known::Known,
    known: Arc<Semaphore>,
    unknown: Arc<Semaphore>,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    found: HashMap<String, Found>,
    refused: HashMap<String, Instant>,
    flights: HashMap<String, Flight>,
}

#[derive(Clone)]
struct Found {
    at: Instant,
    /// [`REVOKED`] when the check began.
    generation: u64,
    id: Identity,
}

/// A check under way, which every caller of its secret awaits.
#[derive(Clone)]
struct Flight {
    started: Instant,
    generation: u64,
    answer: Shared<BoxFuture<'static, Answer>>,
}

impl Checks {
    pub fn new(db: Db) -> Arc<Checks> {
        Arc::new(Checks {
            db,
            exist: Default::default(),
            known: Arc::new(Semaphore::new(KNOWN_CHECKS)),
            unknown: Arc::new(Semaphore::new(UNKNOWN_CHECKS)),
            kept: Mutex::default(),
        })
    }

    /// The identity of `secret`, or `None` when it is unknown, revoked or expired.
    pub(crate) async fn identify(self: &Arc<Self>, secret: &str, kind: Kind) -> Answer {
        if !well_formed(secret, kind) {
            return Ok(None);
        }
        // Kept by hash: the secrets themselves stay in no table of this process.
        let hashed = super::hash(secret);
        let key = format!("{kind:?}:{hashed}");
        let generation = REVOKED.load(Ordering::SeqCst);
        let seen = self
            .kept
            .lock()
            .expect("token checks")
            .found
            .contains_key(&key);
        if !seen && self.exist.exists(&self.db, kind, &hashed).await == Some(false) {
            return Ok(None);
        }
        let (found, flight) = {
            let mut kept = self.kept.lock().expect("token checks");
            // Let in before, even if a revocation since voids that check: its next check
            // is a known caller's.
            let seen = kept.found.get(&key);
            let known = seen.is_some();
            let found = seen.filter(|f| f.generation == generation).cloned();
            if let Some(f) = &found {
                if f.at.elapsed() < CACHE_TTL {
                    return Ok(Some(f.id.clone()));
                }
            }
            if kept
                .refused
                .get(&key)
                .is_some_and(|at| at.elapsed() < REFUSED_TTL)
            {
                return Ok(None);
            }
            let flight = match kept.flights.get(&key) {
                Some(f) if f.generation == generation => f.clone(),
                _ => {
                    let f = self.start(&key, secret, kind, generation, known);
                    kept.flights.insert(key, f.clone());
                    f
                }
            };
            (found, flight)
        };
        let stale = found.filter(|f| f.at.elapsed() < STALE_GRACE).map(|f| f.id);
        // A caller let in before waits only as long as the check has left; anyone else the
        // whole bound.
        let wait = match stale {
            Some(_) => CHECK_TIMEOUT.saturating_sub(flight.started.elapsed()),
            None => CHECK_TIMEOUT,
        };
        match (tokio::time::timeout(wait, flight.answer).await, stale) {
            (Ok(Ok(id)), _) => Ok(id),
            (Ok(Err(e)), Some(id)) if retryable(&e) => {
                tracing::warn!(error = %e.message, "the database cannot check a token: a caller checked in the last minute is let in");
                Ok(Some(id))
            }
            (Ok(Err(e)), _) => Err(e),
            (Err(_), Some(id)) => {
                tracing::warn!(
                    "the database did not check a token in time: a caller checked in the last minute is let in"
                );
                Ok(Some(id))
            }
            (Err(_), None) => Err(Error::new(
                Code::Timeout,
                format!(
                    "the state database did not check this token within {} s; try again",
                    CHECK_TIMEOUT.as_secs()
                ),
            )
            .with_details(serde_json::json!({ "retryable": true }))),
        }
    }

    /// Starts the check of `secret` on the blocking pool, under the bound of its kind; its
    /// answer is kept when it comes, whoever still waits for it.
    fn start(
        self: &Arc<Self>,
        key: &str,
        secret: &str,
        kind: Kind,
        generation: u64,
        known: bool,
    ) -> Flight {
        let checks = self.clone();
        let slots = if known { &self.known } else { &self.unknown }.clone();
        let (key, secret) = (key.to_owned(), secret.to_owned());
        let task = tokio::spawn(async move {
            let answer = match tokio::time::timeout(CHECK_TIMEOUT, slots.acquire_owned()).await {
                Ok(Ok(slot)) => {
                    let db = checks.db.clone();
                    let checked = cloud_harness_memory::idle::spawn_blocking(move || {
                        // The slot is held until the database answers, however long after
                        // the caller stopped waiting: the bound holds.
                        let _slot = slot;
                        match kind {
                            Kind::Token => super::authenticate(&db, &secret),
                            Kind::Cookie => super::session(&db, &secret),
                        }
                    });
                    checked
                        .await
                        .unwrap_or_else(|e| Err(Error::internal(format!("a token check: {e}"))))
                }
                _ => Err(Error::new(
                    Code::Timeout,
                    "too many token checks are waiting for the state database; try again",
                )
                .with_details(serde_json::json!({ "retryable": true }))),
            };
            checks.settle(&key, generation, &answer);
            answer
        });
        let answer = async move {
            task.await
                .unwrap_or_else(|e| Err(Error::internal(format!("a token check: {e}"))))
        };
        Flight {
            started: Instant::now(),
            generation,
            answer: answer.boxed().shared(),
        }
    }

    fn settle(&self, key: &str, generation: u64, answer: &Answer) {
        let mut kept = self.kept.lock().expect("token checks");
        if kept
            .flights
            .get(key)
            .is_some_and(|f| f.generation == generation)
        {
            kept.flights.remove(key);
        }
        match answer {
            Ok(Some(id)) => {
                if kept.found.len() >= MAX_FOUND {
                    kept.found.retain(|_, f| f.at.elapsed() < STALE_GRACE);
                    if kept.found.len() >= MAX_FOUND {
                        kept.found.clear();
                    }
                }
                let found = Found {
                    at: Instant::now(),
                    generation,
                    id: id.clone(),
                };
                kept.found.insert(key.to_owned(), found);
            }
            Ok(None) => {
                kept.found.remove(key);
                if kept.refused.len() >= MAX_REFUSED {
                    kept.refused.clear();
                }
                kept.refused.insert(key.to_owned(), Instant::now());
            }
            // Nothing learnt: the next caller asks again.
            Err(_) => {}
        }
    }

    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.kept.lock().unwrap().flights.len()
    }
}

fn retryable(e: &Error) -> bool {
    matches!(e.code, Code::Upstream | Code::Timeout)
}

/// Whether `secret` has the shape the harness makes (`cht_` and 43 characters of URL-safe
/// base64 for a token, the 43 alone for a cookie): anything else is refused unasked.
fn well_formed(secret: &str, kind: Kind) -> bool {
    let body = match kind {
        Kind::Token => match secret.strip_prefix(super::TOKEN_PREFIX) {
            Some(b) => b,
            None => return false,
        },
        Kind::Cookie => secret,
    };
    body.len() == 43
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role;

    fn db() -> (tempfile::TempDir, Db) {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open_sqlite(home.path()).unwrap();
        (home, db)
    }

    fn made_up() -> String {
        format!(
            "{}{}",
            super::super::TOKEN_PREFIX,
            cloud_harness_control::state::secret()
        )
    }

    #[test]
    fn only_the_shapes_the_harness_makes_are_looked_up() {
        let token = made_up();
        assert!(well_formed(&token, Kind::Token));
        assert!(!well_formed(&token, Kind::Cookie));
        assert!(well_formed(
            &cloud_harness_control::state::secret(),
            Kind::Cookie
        ));
        for bad in [
            "",
            "cht_",
            "cht_short",
            &format!("{token}x"),
            &token.replace('_', "/"),
        ] {
            assert!(!well_formed(bad, Kind::Token), "{bad}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_known_token_is_kept_and_a_revocation_here_voids_it_at_once() {
        let (_home, db) = db();
        let made = crate::create(&db, "agent", Role::Client, "test").unwrap();
        let checks = Checks::new(db.clone());
        let id = checks.identify(&made.token, Kind::Token).await.unwrap();
        assert_eq!(id.unwrap().name, "agent");
        crate::revoke(&db, "agent", "test").unwrap();
        assert_eq!(
            checks.identify(&made.token, Kind::Token).await.unwrap(),
            None
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_made_up_tokens_is_bounded_and_leaves_nothing_running() {
        let (_home, db) = db();
        let made = crate::create(&db, "agent", Role::Client, "test").unwrap();
        let checks = Checks::new(db.clone());
        // The real caller was let in before; its check is due again during the flood.
        assert!(checks
            .identify(&made.token, Kind::Token)
            .await
            .unwrap()
            .is_some());
        let key = format!("Token:{}", super::super::hash(&made.token));
        checks.kept.lock().unwrap().found.get_mut(&key).unwrap().at -= CACHE_TTL * 2;
        let flood: Vec<_> = (0..200)
            .map(|_| {
                let checks = checks.clone();
                tokio::spawn(async move { checks.identify(&made_up(), Kind::Token).await })
            })
            .collect();
        // The real caller is served meanwhile (the flood waits on its own bound).
        let id = checks.identify(&made.token, Kind::Token).await.unwrap();
        assert_eq!(id.unwrap().name, "agent");
        // Each is refused from the set of the secrets that exist: none waits, none asks the
        // database.
        for f in flood {
            assert_eq!(f.await.unwrap().unwrap(), None);
        }
        assert_eq!(checks.in_flight(), 0);
        assert!(checks.kept.lock().unwrap().refused.is_empty());
        // A token made meanwhile (here, or within a second elsewhere) is let in at once.
        let new = crate::create(&db, "newcomer", Role::Client, "test").unwrap();
        let id = checks.identify(&new.token, Kind::Token).await.unwrap();
        assert_eq!(id.unwrap().name, "newcomer");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_checked_before_is_let_in_while_the_database_is_out_of_reach() {
        let (_home, db) = db();
        let made = crate::create(&db, "agent", Role::Client, "test").unwrap();
        let checks = Checks::new(db.clone());
        assert!(checks
            .identify(&made.token, Kind::Token)
            .await
            .unwrap()
            .is_some());
        // Its check is older than the cache's life, and the database now fails retryably.
        let key = format!("Token:{}", super::super::hash(&made.token));
        {
            let mut kept = checks.kept.lock().unwrap();
            kept.found.get_mut(&key).unwrap().at -= CACHE_TTL * 2;
        }
        let failing =
            async { Err::<Option<Identity>, _>(Error::new(Code::Timeout, "the database is slow")) };
        let flight = Flight {
            started: Instant::now(),
            generation: REVOKED.load(Ordering::SeqCst),
            answer: failing.boxed().shared(),
        };
        checks
            .kept
            .lock()
            .unwrap()
            .flights
            .insert(key.clone(), flight.clone());
        let id = checks.identify(&made.token, Kind::Token).await.unwrap();
        assert_eq!(id.unwrap().name, "agent");
        // A real one never seen gets the retryable error instead.
        let other = crate::create(&db, "other", Role::Client, "test")
            .unwrap()
            .token;
        let key = format!("Token:{}", super::super::hash(&other));
        checks.kept.lock().unwrap().flights.insert(key, flight);
        let e = checks.identify(&other, Kind::Token).await.unwrap_err();
        assert_eq!(e.code, Code::Timeout);
    }
}

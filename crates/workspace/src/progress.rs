//! What an open in progress shows of itself, and how it is asked to stop: the steps done of
//! those it will take (cloning the project, acquiring each toolkit, writing workspace-scope
//! skills, mounting, making the executor), the step it is in, the bytes its fetches have
//! taken so far. A caller that holds it reads it while the open runs (MCP progress
//! notifications); cancelling it stops the open at its next step (no fetch starts after it)
//! and the open then undoes what it made, as for any failure. Fetches in flight finish and
//! publish into the store: a client that gave up (a timeout, a dropped connection) and asks
//! again finds them warm instead of starting over.

use cloud_harness_control::principal::Principal;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::observe::Observer;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct OpenProgress {
    done: AtomicU64,
    total: AtomicU64,
    /// The step now going, and when it started (its time is logged, at debug, as it ends).
    step: Mutex<(&'static str, Option<Instant>)>,
    cancelled: AtomicBool,
    /// Cancelled because the server is stopping (not by its caller): said so, and retryable.
    stopping: AtomicBool,
    /// The acquisitions of the open, each with its own phase and bytes.
    fetches: Mutex<Vec<Arc<Observer>>>,
}

/// One look at an open in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub done: u64,
    pub total: u64,
    pub step: &'static str,
    /// Bytes fetched so far by the open's acquisitions.
    pub bytes: u64,
}

impl OpenProgress {
    /// Stops the open at its next step.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    pub fn snapshot(&self) -> Snapshot {
        let bytes = self
            .fetches
            .lock()
            .expect("fetches lock")
            .iter()
            .map(|f| f.bytes())
            .sum();
        Snapshot {
            done: self.done.load(Ordering::Relaxed),
            total: self.total.load(Ordering::Relaxed),
            step: self.step.lock().expect("step lock").0,
            bytes,
        }
    }

    /// The open will take `total` steps.
    pub(crate) fn plan(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
    }

    /// Starts the step `name`, unless the open was cancelled: CANCELLED then.
    pub(crate) fn step(&self, name: &'static str) -> Result<()> {
        self.check()?;
        *self.step.lock().expect("step lock") = (name, Some(Instant::now()));
        Ok(())
    }

    /// One step more is done.
    pub(crate) fn advance(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
        // A step of several parts (the toolkits) says each part's time since it started.
        let (step, started) = *self.step.lock().expect("step lock");
        if let Some(started) = started {
            tracing::debug!(
                step,
                ms = started.elapsed().as_secs_f64() * 1000.0,
                "open step done"
            );
        }
    }

    /// Stops the open at its next step because the server is stopping.
    fn cancel_for_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.cancel();
    }

    /// CANCELLED when the open was asked to stop.
    pub(crate) fn check(&self) -> Result<()> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(stopping());
        }
        if self.is_cancelled() {
            return Err(Error::new(
                Code::Cancelled,
                "workspace_open was cancelled; nothing it made is kept",
            ));
        }
        Ok(())
    }

    /// An observer for one of the open's fetches (paid by `actor`), whose bytes count here.
    pub(crate) fn fetch(&self, actor: &str) -> Arc<Observer> {
        let observer = Arc::new(Observer::paid_by(actor));
        self.fetches
            .lock()
            .expect("fetches lock")
            .push(observer.clone());
        observer
    }
}

/// What an open the stopping server refused or cancelled answers: 503, to be asked again
/// (of this server once it is back, or of another).
pub(crate) fn stopping() -> Error {
    let mut e = Error::new(
        Code::Cancelled,
        "the server is stopping: workspace_open again once it is back",
    )
    .with_details(json!({ "retryable": true }));
    e.status = 503;
    e
}

/// The opens in progress in this process, by workspace id, for whoever watches them (the API
/// and the dashboard). As many as the opens the quotas allow at once. A stopping server
/// admits no more, and waits for those in progress (see [`Openings::stop`]).
#[derive(Debug, Default)]
pub(crate) struct Openings {
    all: Mutex<Listing>,
    /// Signalled as each open ends.
    ended: Condvar,
}

#[derive(Debug, Default)]
struct Listing {
    by_id: HashMap<String, Opening>,
    stopping: bool,
}

#[derive(Debug)]
struct Opening {
    owner: String,
    key: String,
    started_ms: i64,
    progress: Arc<OpenProgress>,
}

/// An open listed in [`Openings`] while it lives: dropped, it is gone from the list.
pub(crate) struct Listed<'a> {
    openings: &'a Openings,
    id: String,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        let mut all = self.openings.all.lock().expect("openings lock");
        all.by_id.remove(&self.id);
        self.openings.ended.notify_all();
    }
}

impl Openings {
    /// Lists the open of workspace `id` until the guard it returns is dropped; CANCELLED
    /// once the server is stopping.
    pub(crate) fn list(
        &self,
        id: &str,
        owner: &str,
        key: &str,
        progress: Arc<OpenProgress>,
    ) -> Result<Listed<'_>> {
        let opening = Opening {
            owner: owner.to_owned(),
            key: key.to_owned(),
            started_ms: cloud_harness_control::state::now_ms(),
            progress,
        };
        let mut all = self.all.lock().expect("openings lock");
        if all.stopping {
            return Err(stopping());
        }
        all.by_id.insert(id.to_owned(), opening);
        Ok(Listed {
            openings: self,
            id: id.to_owned(),
        })
    }

    /// Whether the server is stopping (an open then takes nothing, not even a spare).
    pub(crate) fn is_stopping(&self) -> bool {
        self.all.lock().expect("openings lock").stopping
    }

    /// Admits no more opens, cancels those in progress (each undoes what it made) and waits
    /// up to `wait` for them to end. Whether none is left.
    pub(crate) fn stop(&self, wait: Duration) -> bool {
        let mut all = self.all.lock().expect("openings lock");
        all.stopping = true;
        for opening in all.by_id.values() {
            opening.progress.cancel_for_stop();
        }
        let (all, _) = self
            .ended
            .wait_timeout_while(all, wait, |all| !all.by_id.is_empty())
            .expect("openings lock");
        all.by_id.is_empty()
    }

    /// The opens in progress that `who` reaches, each with how far it is, oldest first.
    pub(crate) fn of(&self, who: &Principal) -> Vec<Value> {
        let all = self.all.lock().expect("openings lock");
        let mut out: Vec<(i64, Value)> = all
            .by_id
            .iter()
            .filter(|(_, o)| who.reaches(&o.owner))
            .map(|(id, o)| {
                let now = o.progress.snapshot();
                let summary = json!({
                    "workspace": id,
                    "owner": o.owner,
                    "idempotencyKey": o.key,
                    "state": "opening",
                    "step": now.step,
                    "done": now.done,
                    "total": now.total,
                    "bytes": now.bytes,
                    "startedAt": o.started_ms,
                });
                (o.started_ms, summary)
            })
            .collect();
        out.sort_by_key(|(at, _)| *at);
        out.into_iter().map(|(_, v)| v).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_stopping_server_cancels_opens_in_progress_waits_for_them_and_admits_no_more() {
        let openings = Arc::new(Openings::default());
        let progress = Arc::new(OpenProgress::default());
        let (says_listed, is_listed) = std::sync::mpsc::channel();
        let opening = {
            let (openings, progress) = (openings.clone(), progress.clone());
            std::thread::spawn(move || {
                let _listed = openings.list("w1", "alice", "k", progress.clone()).unwrap();
                says_listed.send(()).unwrap();
                // An open at work: it notices the cancel at its next step, then undoes.
                while progress.check().is_ok() {
                    std::thread::sleep(Duration::from_millis(10));
                }
                std::thread::sleep(Duration::from_millis(200));
                Instant::now()
            })
        };
        is_listed.recv().unwrap();
        assert!(openings.stop(Duration::from_secs(30)));
        let stopped = Instant::now();
        assert!(progress.is_cancelled());
        let why = progress.check().unwrap_err();
        assert_eq!((why.code, why.status), (Code::Cancelled, 503));
        assert!(why.message.contains("the server is stopping"), "{why:?}");
        assert!(
            opening.join().unwrap() <= stopped,
            "stop returned before the open ended"
        );
        let refused = openings
            .list("w2", "alice", "k2", Arc::default())
            .err()
            .unwrap();
        assert_eq!((refused.code, refused.status), (Code::Cancelled, 503));
        assert!(refused.message.contains("the server is stopping"));
        assert!(openings.is_stopping());
        assert!(openings.stop(Duration::ZERO));
    }

    #[test]
    fn a_stop_that_waits_in_vain_says_so() {
        let openings = Openings::default();
        let _stuck = openings.list("w1", "alice", "k", Arc::default()).unwrap();
        assert!(!openings.stop(Duration::from_millis(50)));
    }
}

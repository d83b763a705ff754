//! A request's toolkits acquired together: each on a thread of its own, a few at a time, so a
//! cold open waits about as long as its slowest fetch rather than for the sum of them. Results
//! keep the request's order, and every acquisition is recorded whatever became of the others.

use super::progress::OpenProgress;
use super::Workspaces;
use cloud_harness_control::toolkit::{self, Revision};
use cloud_harness_error::Result;
use cloud_harness_provision::Acquired;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Toolkits one open acquires at once (each cold one is a fetch: a helper container, or a
/// connection in-process).
const AT_ONCE: usize = 4;

/// A toolkit acquired for an open, and when its default head was found (ms), if it asked for
/// one.
pub(super) struct Acquisition {
    pub acquired: Acquired,
    pub resolved_at: Option<i64>,
}

impl Workspaces {
    /// Acquires every toolkit of an open for workspace `id`; the first failure, in the
    /// request's order, is the answer.
    pub(super) fn acquire_all(
        &self,
        toolkits: &[toolkit::Toolkit],
        actor: &str,
        id: &str,
        progress: &OpenProgress,
    ) -> Result<Vec<Acquisition>> {
        let head_ttl = cloud_harness_control::heads::ttl()?;
        // The call's span (its request id) goes with the work onto each thread.
        let span = tracing::Span::current();
        bounded_map(toolkits, AT_ONCE, |t| {
            span.in_scope(|| {
                let one = self.acquire_one(t, head_ttl, actor, id, progress);
                if one.is_ok() {
                    progress.advance();
                }
                one
            })
        })
        .into_iter()
        .collect()
    }

    fn acquire_one(
        &self,
        t: &toolkit::Toolkit,
        head_ttl: Duration,
        actor: &str,
        id: &str,
        progress: &OpenProgress,
    ) -> Result<Acquisition> {
        let started = Instant::now();
        let mut head = match t.revision {
            Revision::DefaultHead => Some(cloud_harness_control::heads::fresh(
                &self.db, &t.url, head_ttl,
            )?),
            _ => None,
        };
        let fetch = match &head {
            Some(Some((commit, _))) => toolkit::Toolkit {
                revision: Revision::Commit(commit.clone()),
                ..t.clone()
            },
            _ => t.clone(),
        };
        // A fetch from the network counts against the opener's hourly budget, and stops
        // when the open is cancelled.
        progress.check()?;
        let observer = progress.fetch(actor);
        let mut a = self.provisioner.acquire_observed(&fetch, &observer);
        // A remembered head that its branch has left since (a force-push) is no longer the
        // repository's: the head is asked for again.
        if matches!(head, Some(Some(_)))
            && matches!(&a, Err(e) if e.code == cloud_harness_error::Code::CommitNotInRepository)
        {
            a = self.provisioner.acquire_observed(t, &observer);
            head = Some(None);
        }
        let millis = started.elapsed().as_millis() as u64;
        // A fetch refused by the opener's budget is no acquisition: not kept in the history,
        // which a client looping on its refusal would otherwise fill. (A full disk is kept:
        // an operator looks for it there.)
        if !matches!(&a, Err(e) if e.code == cloud_harness_error::Code::ResourceExhausted && !e.is_full_disk())
        {
            cloud_harness_provision::acquisitions::record(
                &self.db,
                t,
                &a,
                millis,
                actor,
                "workspace_open",
                Some(id),
            );
        }
        let acquired = a?;
        let resolved_at = match head {
            Some(Some((_, at))) => Some(at),
            Some(None) => Some(cloud_harness_control::heads::remember(
                &self.db,
                &t.url,
                &acquired.record.key.commit,
            )?),
            None => None,
        };
        Ok(Acquisition {
            acquired,
            resolved_at,
        })
    }
}

/// `f` of every item, at most `at_once` at a time (this thread and scoped ones), in the
/// items' order. A thread that cannot start leaves its share to the others.
pub(crate) fn bounded_map<T: Sync, R: Send>(
    items: &[T],
    at_once: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<R>>> = Mutex::new(items.iter().map(|_| None).collect());
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(i) else { break };
        let r = f(item);
        done.lock().expect("results lock")[i] = Some(r);
    };
    std::thread::scope(|s| {
        for _ in 1..at_once.min(items.len()) {
            let _ = std::thread::Builder::new().spawn_scoped(s, work);
        }
        work();
    });
    done.into_inner()
        .expect("results lock")
        .into_iter()
        .map(|r| r.expect("every item was done"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::bounded_map;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn results_keep_their_order_and_no_more_than_the_bound_run_at_once() {
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let items: Vec<u64> = (0..10).collect();
        let out = bounded_map(&items, 3, |&i| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20 - i));
            running.fetch_sub(1, Ordering::SeqCst);
            i * 10
        });
        assert_eq!(out, (0..10).map(|i| i * 10).collect::<Vec<_>>());
        let most = most.load(Ordering::SeqCst);
        assert!(most > 1 && most <= 3, "{most} at once");
    }
}

//! Slots per principal: at most `size` held at once, with a queue of at most `queue` waiting
//! for one (runs wait; requests in flight do not). A slot is given back when its [`Held`]
//! drops, a waiter that gives up leaves the queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Principals tracked before idle ones are dropped.
const TRACKED: usize = 10_000;

pub struct Slots {
    size: usize,
    queue: usize,
    by_principal: Mutex<HashMap<String, Arc<Share>>>,
}

struct Share {
    free: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// A slot, held until dropped.
pub struct Held {
    _permit: OwnedSemaphorePermit,
}

/// Counts a waiter while it waits (also when its future is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slots {
    pub fn new(size: usize, queue: usize) -> Slots {
        Slots {
            size: size.max(1),
            queue,
            by_principal: Mutex::default(),
        }
    }

    fn share(&self, who: &str) -> Arc<Share> {
        let mut all = self.by_principal.lock().expect("slots lock");
        if all.len() >= TRACKED && !all.contains_key(who) {
            let size = self.size;
            all.retain(|_, s| {
                Arc::strong_count(s) > 1
                    || s.free.available_permits() < size
                    || s.waiting.load(Ordering::SeqCst) > 0
            });
        }
        if let Some(share) = all.get(who) {
            return share.clone();
        }
        let share = Arc::new(Share {
            free: Arc::new(Semaphore::new(self.size)),
            waiting: AtomicUsize::new(0),
        });
        all.insert(who.to_owned(), share.clone());
        share
    }

    /// A slot of `who`'s if one is free now.
    pub(crate) fn try_hold(&self, who: &str) -> Option<Held> {
        let share = self.share(who);
        let permit = share.free.clone().try_acquire_owned().ok()?;
        Some(Held { _permit: permit })
    }

    /// A slot of `who`'s, waiting for one when none is free; `None` when the queue is full.
    pub async fn hold(&self, who: &str) -> Option<Held> {
        let share = self.share(who);
        if let Ok(permit) = share.free.clone().try_acquire_owned() {
            return Some(Held { _permit: permit });
        }
        if share.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue {
            share.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let _waiting = Waiting(&share.waiting);
        let permit = share.free.clone().acquire_owned().await.ok()?;
        Some(Held { _permit: permit })
    }

    /// Slots `who` holds now.
    pub fn held(&self, who: &str) -> usize {
        let all = self.by_principal.lock().expect("slots lock");
        all.get(who)
            .map_or(0, |s| self.size - s.free.available_permits())
    }

    /// `who`'s waiters now.
    pub fn waiting(&self, who: &str) -> usize {
        let all = self.by_principal.lock().expect("slots lock");
        all.get(who).map_or(0, |s| s.waiting.load(Ordering::SeqCst))
    }

    pub fn keys(&self) -> Vec<String> {
        let all = self.by_principal.lock().expect("slots lock");
        all.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_full_share_queues_then_refuses_and_others_are_not_held_up() {
        let slots = Arc::new(Slots::new(2, 1));
        let a1 = slots.hold("a").await.unwrap();
        let _a2 = slots.hold("a").await.unwrap();
        assert_eq!(slots.held("a"), 2);
        // The third waits in the queue...
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.hold("a").await.is_some() })
        };
        while slots.waiting("a") == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // ...the fourth finds the queue full...
        assert!(slots.hold("a").await.is_none());
        // ...and another principal is served at once.
        assert!(slots.try_hold("b").is_some());
        drop(a1);
        assert!(waiter.await.unwrap());
        assert_eq!(slots.waiting("a"), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_the_queue() {
        let slots = Slots::new(1, 4);
        let _held = slots.try_hold("a").unwrap();
        let gave_up = tokio::time::timeout(Duration::from_millis(20), slots.hold("a")).await;
        assert!(gave_up.is_err());
        assert_eq!(slots.waiting("a"), 0);
    }
}

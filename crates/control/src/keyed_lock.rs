//! One lock per key (an idempotency key, a toolkit being acquired), taken by whoever works on
//! that key; entries live only while someone holds or waits for them, so the table stays as
//! small as the work under way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct KeyedLock {
    table: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl KeyedLock {
    /// Runs `work` holding the lock of `key`.
    pub fn with<T>(&self, key: &str, work: impl FnOnce() -> T) -> T {
        let lock = self
            .table
            .lock()
            .expect("lock table")
            .entry(key.to_owned())
            .or_default()
            .clone();
        let out = {
            let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            work()
        };
        let mut table = self.table.lock().expect("lock table");
        // The table's reference and ours: nobody else holds or waits for it. (Others clone
        // it only with the table locked, as we are now.)
        if Arc::strong_count(&lock) == 2 {
            table.remove(key);
        }
        out
    }

    /// How many keys have an entry (for tests).
    pub fn len(&self) -> usize {
        self.table.lock().expect("lock table").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_holder_per_key_and_nothing_kept_after() {
        let locks = Arc::new(KeyedLock::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (locks, inside, most) = (locks.clone(), inside.clone(), most.clone());
                std::thread::spawn(move || {
                    locks.with("k", || {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert!(locks.is_empty());
    }
}

//! Token buckets per principal: a rate with a burst. Requests per second and budgets per hour
//! (acquisitions, imports) are the same thing at different rates: a bucket holds up to
//! `burst` tokens, refills at `rate` per second, and each use takes one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Principals tracked before full, idle buckets are dropped (a full bucket is the state a
/// new one starts in, so dropping it loses nothing).
const TRACKED: usize = 10_000;

pub(crate) struct Buckets {
    rate: f64,
    burst: f64,
    by_principal: Mutex<HashMap<String, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refill(&mut self, rate: f64, burst: f64, now: Instant) {
        let gained = now.duration_since(self.at).as_secs_f64() * rate;
        self.tokens = (self.tokens + gained).min(burst);
        self.at = now;
    }
}

impl Buckets {
    pub fn new(rate: f64, burst: f64) -> Buckets {
        Buckets {
            rate,
            burst: burst.max(1.0),
            by_principal: Mutex::default(),
        }
    }

    /// Takes one token of `who`'s, or says how long until one is there.
    pub fn take(&self, who: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let mut all = self.by_principal.lock().expect("buckets lock");
        if all.len() >= TRACKED && !all.contains_key(who) {
            let (rate, burst) = (self.rate, self.burst);
            all.retain(|_, b| {
                b.refill(rate, burst, now);
                b.tokens < burst
            });
        }
        // Looked up first: a name is copied only the first time it is seen.
        if !all.contains_key(who) {
            all.insert(
                who.to_owned(),
                Bucket {
                    tokens: self.burst,
                    at: now,
                },
            );
        }
        let bucket = all.get_mut(who).expect("just inserted");
        bucket.refill(self.rate, self.burst, now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }

    /// How much of the burst `who` has used (0 when idle long enough).
    pub fn used(&self, who: &str) -> f64 {
        let mut all = self.by_principal.lock().expect("buckets lock");
        match all.get_mut(who) {
            Some(b) => {
                b.refill(self.rate, self.burst, Instant::now());
                self.burst - b.tokens
            }
            None => 0.0,
        }
    }

    pub fn keys(&self) -> Vec<String> {
        let all = self.by_principal.lock().expect("buckets lock");
        all.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_and_each_principal_on_its_own() {
        let b = Buckets::new(1.0, 3.0);
        for _ in 0..3 {
            b.take("a").unwrap();
        }
        let wait = b.take("a").unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        // Another principal is not slowed by the first.
        b.take("b").unwrap();
        assert!((b.used("a") - 3.0).abs() < 0.1);
        assert_eq!(b.used("nobody"), 0.0);
    }

    #[test]
    fn an_hourly_budget_refuses_with_the_time_to_the_next_token() {
        let b = Buckets::new(2.0 / 3600.0, 2.0);
        b.take("a").unwrap();
        b.take("a").unwrap();
        let wait = b.take("a").unwrap_err();
        assert!(wait > Duration::from_secs(1700) && wait <= Duration::from_secs(1800));
    }
}

//! Counters of the skill model's work since the process started: how often a skill folder's
//! parse came from the skill cache, the specification problems found in the folders parsed
//! (each distinct folder once), and the skills refused for them. The server's metrics read
//! them.

use crate::spec::{Problem, Rule};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Stats {
    pub skill_cache_hits: AtomicU64,
    pub skill_cache_misses: AtomicU64,
    /// Problems found, by rule (the index of the rule in [`Rule::ALL`]).
    pub problems: [AtomicU64; Rule::ALL.len()],
    /// Skills not served for their problems (`validation: refuse`), per discovery.
    pub skills_refused: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

pub static STATS: Stats = Stats {
    skill_cache_hits: AtomicU64::new(0),
    skill_cache_misses: AtomicU64::new(0),
    problems: [ZERO; Rule::ALL.len()],
    skills_refused: AtomicU64::new(0),
};

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The problems found so far, by rule.
    pub fn problems(&self) -> impl Iterator<Item = (Rule, u64)> + '_ {
        Rule::ALL
            .iter()
            .zip(&self.problems)
            .map(|(rule, n)| (*rule, n.load(Ordering::Relaxed)))
    }
}

/// Counts the problems of a skill folder parsed for the first time.
pub fn count_problems(problems: &[Problem]) {
    for p in problems {
        if let Some(i) = Rule::ALL.iter().position(|r| *r == p.rule) {
            Stats::add(&STATS.problems[i], 1);
        }
    }
}

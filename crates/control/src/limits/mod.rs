//! Quotas per principal: what one caller may hold or spend, so no single client can take the
//! server from the others. Each limit has a default a single-user install never meets, a key
//! in `[limits]` of `config.toml` and an environment variable. A refusal is
//! RESOURCE_EXHAUSTED (HTTP 429 with `Retry-After`) naming the limit and its value.
//!
//! What is counted where: open workspaces in the state database (with the key's claim, so a
//! fleet counts them together); sessions by the MCP endpoint's session table; everything
//! else in this process: request rates and hourly budgets as token buckets, runs, blocking
//! work and requests in flight as slots.

pub(crate) mod bucket;

mod slots;

use crate::config::env_number;
use crate::principal::Principal;
pub(crate) use bucket::Buckets;
use cloud_harness_error::{Code, Error, Result};
use serde_json::json;
pub use slots::{Held, Slots};
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The limits every principal gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open workspaces (and ones opening).
    pub workspaces: u64,
    /// MCP sessions of the 2025-11-25 protocol over HTTP.
    pub sessions: u64,
    /// `skills_run` calls running at once.
    pub runs: u64,
    /// `skills_run` calls waiting for a running one to end; more are refused.
    pub queued_runs: u64,
    /// CPU seconds one run may use (RLIMIT_CPU of its processes).
    pub run_cpu_seconds: u64,
    /// Bytes of memory one run's process may allocate (RLIMIT_DATA).
    pub run_memory: u64,
    /// Output kept per stream of one run; the rest is counted, not kept.
    pub run_output: u64,
    /// Acquisitions that go to the network (a cold toolkit), per hour.
    pub acquisitions_per_hour: u64,
    /// Import jobs submitted, per hour.
    pub imports_per_hour: u64,
    /// HTTP requests per second (bursts of twice as many).
    pub requests_per_second: u64,
    /// HTTP requests in flight at once.
    pub requests_in_flight: u64,
    /// Tasks on the blocking pool at once (file system, database, engine work); more wait.
    pub blocking: u64,
    /// Milliseconds of work one request's expensive step may take (a conflict's diff) before
    /// it gives up on precision or stops.
    pub request_millis: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            workspaces: 256,
            sessions: 100,
            runs: 16,
            queued_runs: 64,
            run_cpu_seconds: 600,
            run_memory: 4 << 30,
            run_output: 256 << 10,
            acquisitions_per_hour: 600,
            imports_per_hour: 120,
            requests_per_second: 1000,
            requests_in_flight: 256,
            blocking: 64,
            request_millis: 2000,
        }
    }
}

/// Each limit: its name in refusals and metrics, its environment variable (`[limits]` key =
/// the name), and where it lives in [`Limits`].
pub const NAMES: &[(&str, &str)] = &[
    ("workspaces", "CLOUD_HARNESS_LIMIT_WORKSPACES"),
    ("sessions", "CLOUD_HARNESS_LIMIT_SESSIONS"),
    ("runs", "CLOUD_HARNESS_LIMIT_RUNS"),
    ("queued_runs", "CLOUD_HARNESS_LIMIT_QUEUED_RUNS"),
    ("run_cpu_seconds", "CLOUD_HARNESS_LIMIT_RUN_CPU_SECONDS"),
    ("run_memory", "CLOUD_HARNESS_LIMIT_RUN_MEMORY"),
    ("run_output", "CLOUD_HARNESS_LIMIT_RUN_OUTPUT"),
    (
        "acquisitions_per_hour",
        "CLOUD_HARNESS_LIMIT_ACQUISITIONS_PER_HOUR",
    ),
    ("imports_per_hour", "CLOUD_HARNESS_LIMIT_IMPORTS_PER_HOUR"),
    (
        "requests_per_second",
        "CLOUD_HARNESS_LIMIT_REQUESTS_PER_SECOND",
    ),
    (
        "requests_in_flight",
        "CLOUD_HARNESS_LIMIT_REQUESTS_IN_FLIGHT",
    ),
    ("blocking", "CLOUD_HARNESS_LIMIT_BLOCKING"),
    ("request_millis", "CLOUD_HARNESS_LIMIT_REQUEST_MILLIS"),
];

/// The largest value a limit takes.
const MOST: u64 = u32::MAX as u64;

impl Limits {
    fn field(&mut self, name: &str) -> &mut u64 {
        match name {
            "workspaces" => &mut self.workspaces,
            "sessions" => &mut self.sessions,
            "runs" => &mut self.runs,
            "queued_runs" => &mut self.queued_runs,
            "run_cpu_seconds" => &mut self.run_cpu_seconds,
            "run_memory" => &mut self.run_memory,
            "run_output" => &mut self.run_output,
            "acquisitions_per_hour" => &mut self.acquisitions_per_hour,
            "imports_per_hour" => &mut self.imports_per_hour,
            "requests_per_second" => &mut self.requests_per_second,
            "requests_in_flight" => &mut self.requests_in_flight,
            "blocking" => &mut self.blocking,
            "request_millis" => &mut self.request_millis,
            _ => unreachable!("every name of NAMES is a field"),
        }
    }

    /// The value of the limit `name`.
    pub fn get(&self, name: &str) -> u64 {
        *self.clone().field(name)
    }

    /// The defaults, each overridden by its environment variable. Every limit but
    /// `queued_runs` is at least 1 (a limit of 0 would refuse everything); `queued_runs` of 0
    /// means a run never waits: it starts or is refused.
    pub fn from_env() -> Result<Limits> {
        let mut limits = Limits::default();
        for (name, var) in NAMES {
            let field = limits.field(name);
            let least = u64::from(*name != "queued_runs");
            // At most 2^32: past it a count is no bound at all, and a slot table cannot hold it.
            *field = env_number(var, *field)?.clamp(least, MOST);
        }
        // The older setting, per client address then, still read when the new one is unset.
        if std::env::var_os("CLOUD_HARNESS_LIMIT_SESSIONS").is_none() {
            limits.sessions = env_number(
                "CLOUD_HARNESS_HTTP_MAX_SESSIONS_PER_CLIENT",
                limits.sessions,
            )?
            .clamp(1, MOST);
        }
        Ok(limits)
    }
}

/// Refusals at each limit since the process started, by the limit's name (`/metrics` reads
/// them: the quotas count their refusals themselves, below whatever reports them). The names
/// are the code's own (the quotas and the few fixed limits, `logins_at_once` say): a handful.
static REFUSED: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Counts a refusal at the limit `name`.
pub fn refused(name: &str) {
    let mut refused = REFUSED.lock().expect("refusals lock");
    match refused.get_mut(name) {
        Some(n) => *n += 1,
        None => {
            refused.insert(name.to_owned(), 1);
        }
    }
}

/// The limits refused at since the process started, with how often.
pub fn refusals() -> Vec<(String, u64)> {
    let refused = REFUSED.lock().expect("refusals lock");
    refused.iter().map(|(name, n)| (name.clone(), *n)).collect()
}

/// The refusal of a request past the limit `name` of `value`: RESOURCE_EXHAUSTED, with when
/// to try again (the HTTP layer turns it into `Retry-After`).
pub fn exceeded(name: &str, value: u64, retry_after: Duration, what: &str) -> Error {
    let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
    refused(name);
    Error::new(
        Code::ResourceExhausted,
        format!("{what}: the limit `{name}` is {value} per principal; try again in {secs} s"),
    )
    .with_details(json!({ "limit": name, "value": value, "retryAfter": secs }))
}

/// Seconds to wait that an error asks for (a quota's `retryAfter`).
pub fn retry_after(e: &Error) -> Option<u64> {
    (e.code == Code::ResourceExhausted)
        .then(|| e.details.get("retryAfter").and_then(|v| v.as_u64()))
        .flatten()
}

/// The process's quotas: the limits and what each principal uses of them.
pub struct Quotas {
    pub limits: Limits,
    requests: Buckets,
    acquisitions: Buckets,
    imports: Buckets,
    runs: Slots,
    blocking: Slots,
    in_flight: Slots,
    /// MCP calls being handled (a call outlives its HTTP request: the SDK runs it on a task
    /// of its own, and keeps its answer for a late resume).
    calls: Slots,
    /// Blocking work of all principals together: the pool keeps [`RESERVED_BLOCKING`]
    /// threads for the server's own (token checks, probes, restores).
    all_blocking: Arc<tokio::sync::Semaphore>,
}

/// Threads of the blocking pool (`serve` builds its runtime with this many).
pub const BLOCKING_THREADS: usize = 512;
/// Of those, how many principals' work never takes.
pub(crate) const RESERVED_BLOCKING: usize = 64;
/// Blocking work of one principal waiting for a slot, per slot; more is refused.
const BLOCKING_QUEUE_PER_SLOT: usize = 4;

impl Quotas {
    pub fn new(limits: Limits) -> Quotas {
        let per_hour = |n: u64| n as f64 / 3600.0;
        Quotas {
            limits,
            requests: Buckets::new(
                limits.requests_per_second as f64,
                2.0 * limits.requests_per_second as f64,
            ),
            acquisitions: Buckets::new(
                per_hour(limits.acquisitions_per_hour),
                limits.acquisitions_per_hour as f64,
            ),
            imports: Buckets::new(
                per_hour(limits.imports_per_hour),
                limits.imports_per_hour as f64,
            ),
            runs: Slots::new(limits.runs as usize, limits.queued_runs as usize),
            blocking: Slots::new(
                limits.blocking as usize,
                (limits.blocking as usize).saturating_mul(BLOCKING_QUEUE_PER_SLOT),
            ),
            in_flight: Slots::new(limits.requests_in_flight as usize, 0),
            calls: Slots::new(limits.requests_in_flight as usize, 0),
            all_blocking: Arc::new(tokio::sync::Semaphore::new(
                BLOCKING_THREADS - RESERVED_BLOCKING,
            )),
        }
    }

    /// One HTTP request of `who`, or how long to wait.
    pub fn request(&self, who: &Principal) -> Result<()> {
        self.requests.take(&who.name).map_err(|wait| {
            exceeded(
                "requests_per_second",
                self.limits.requests_per_second,
                wait,
                "too many requests",
            )
        })
    }

    /// A request of `who` in flight while the returned slot lives.
    pub fn in_flight(&self, who: &Principal) -> Result<Held> {
        self.in_flight.try_hold(&who.name).ok_or_else(|| {
            exceeded(
                "requests_in_flight",
                self.limits.requests_in_flight,
                Duration::from_secs(1),
                "too many requests at once",
            )
        })
    }

    /// An MCP call of `who` being handled while the returned slot lives (the same limit as
    /// requests in flight, counted apart).
    pub fn call(&self, who: &str) -> Result<Held> {
        self.calls.try_hold(who).ok_or_else(|| {
            exceeded(
                "requests_in_flight",
                self.limits.requests_in_flight,
                Duration::from_secs(1),
                "too many MCP calls at once",
            )
        })
    }

    /// One acquisition of `who` that goes to the network.
    pub fn acquisition(&self, who: &str) -> Result<()> {
        self.acquisitions.take(who).map_err(|wait| {
            exceeded(
                "acquisitions_per_hour",
                self.limits.acquisitions_per_hour,
                wait,
                "too many toolkits fetched from the network",
            )
        })
    }

    /// One import job submitted by `who`.
    pub fn import(&self, who: &str) -> Result<()> {
        self.imports.take(who).map_err(|wait| {
            exceeded(
                "imports_per_hour",
                self.limits.imports_per_hour,
                wait,
                "too many imports",
            )
        })
    }

    /// A running slot for a run of `who`: at once, or after waiting in its queue; refused when
    /// the queue is full.
    pub async fn run(&self, who: &str) -> Result<Held> {
        self.runs.hold(who).await.ok_or_else(|| {
            exceeded(
                "queued_runs",
                self.limits.queued_runs,
                Duration::from_secs(5),
                &format!(
                    "{} runs are running and {} waiting",
                    self.limits.runs, self.limits.queued_runs
                ),
            )
        })
    }

    /// What `who` uses now of each limit counted here (sessions and workspaces are counted
    /// by their owners).
    pub fn usage(&self, who: &str) -> Vec<(&'static str, u64)> {
        vec![
            ("runs", self.runs.held(who) as u64),
            ("queued_runs", self.runs.waiting(who) as u64),
            (
                "requests_in_flight",
                (self.in_flight.held(who) + self.calls.held(who)) as u64,
            ),
            ("blocking", self.blocking.held(who) as u64),
            (
                "acquisitions_per_hour",
                self.acquisitions.used(who).round() as u64,
            ),
            ("imports_per_hour", self.imports.used(who).round() as u64),
        ]
    }

    /// Every principal this process has counted anything for.
    pub fn principals(&self) -> Vec<String> {
        let mut all = self.runs.keys();
        all.extend(self.in_flight.keys());
        all.extend(self.calls.keys());
        all.extend(self.blocking.keys());
        all.extend(self.acquisitions.keys());
        all.extend(self.imports.keys());
        all.sort();
        all.dedup();
        all
    }
}

/// The process's quotas, made from the environment at first use (`serve` makes them at its
/// start, after the configuration file has set the environment).
pub fn quotas() -> &'static Quotas {
    static QUOTAS: OnceLock<Quotas> = OnceLock::new();
    QUOTAS.get_or_init(|| {
        Quotas::new(Limits::from_env().unwrap_or_else(|e| {
            tracing::error!(error = %e, "a limit is not a number: the defaults are used");
            Limits::default()
        }))
    })
}

tokio::task_local! {
    /// The principal a task works for: blocking work it starts counts against its share.
    static CURRENT: Arc<str>;
}

/// Runs `work` as `who`'s: the blocking work it starts counts against their share.
pub async fn acting_as<F: Future>(who: &str, work: F) -> F::Output {
    CURRENT.scope(Arc::from(who), work).await
}

/// `work` on the blocking pool, in the caller's span, within the share of the principal the
/// task acts for (one principal waits for its own slots, and is refused RESOURCE_EXHAUSTED
/// when too many of its tasks wait; the others' work goes on), and never in the threads kept
/// for the server's own work. Work of no principal (the server's own) takes no slot. The slots
/// go with the work: a caller that goes away does not free them while the work runs.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let who = CURRENT.try_with(|w| w.clone()).ok();
    let quotas = quotas();
    let slots = match &who {
        Some(who) => {
            let mine = quotas.blocking.hold(who).await.ok_or_else(|| {
                exceeded(
                    "blocking",
                    quotas.limits.blocking,
                    Duration::from_secs(1),
                    "too much work waiting",
                )
            })?;
            let all = quotas
                .all_blocking
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Error::internal("the blocking pool is closed"))?;
            Some((mine, all))
        }
        None => None,
    };
    let span = tracing::Span::current();
    cloud_harness_memory::idle::spawn_blocking(move || {
        let _slots = slots;
        span.in_scope(work)
    })
    .await
    .map_err(|e| Error::internal(format!("the task failed: {e}")))
}

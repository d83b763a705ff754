//! The server's metrics, in the Prometheus text format at `/metrics` (operators only):
//! acquisitions by mode and result with their durations, warm starts, bytes fetched, egress
//! decisions by verdict, MCP tool calls by tool and code with their latency, executors made
//! and scripts run, and — read when scraped — open workspaces, the runtime's tasks and the file system's requests
//! and skill-cache hits. One registry per process: the work that moves a series records it
//! where it happens.

use cloud_harness_mount::stats::{Op, STATS};
use cloud_harness_skills::stats::STATS as SKILL_STATS;
use cloud_harness_store::stats::STATS as STORE_STATS;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

type Labels = Vec<(&'static str, String)>;
type Timings = Family<Labels, Histogram, fn() -> Histogram>;

/// Seconds from 1 ms to about 33 s.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

struct Metrics {
    registry: Mutex<Registry>,
    acquisitions: Family<Labels, Counter>,
    acquisition_seconds: Timings,
    warm_starts: Counter,
    fetched_bytes: Counter,
    egress: Family<Labels, Counter>,
    calls: Family<Labels, Counter>,
    call_seconds: Timings,
    executors: Family<Labels, Counter>,
    runs: Family<Labels, Counter>,
    remote: Family<Labels, Counter>,
    remote_bytes: Counter,
}

/// What is read when scraped rather than counted as it happens.
#[derive(Debug)]
struct Scraped;

/// Open workspaces, as the server last set them.
static OPEN_WORKSPACES: AtomicI64 = AtomicI64::new(0);
static PAUSED_WORKSPACES: AtomicI64 = AtomicI64::new(0);

/// What each principal uses of each limit, as the server last counted it: (principal, limit,
/// used).
static USAGE: Mutex<Vec<(String, &'static str, u64)>> = Mutex::new(Vec::new());

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let open = ConstGauge::new(OPEN_WORKSPACES.load(Ordering::Relaxed));
        open.encode(encoder.encode_descriptor(
            "cloud_harness_open_workspaces",
            "Workspaces open now",
            None,
            open.metric_type(),
        )?)?;
        let paused = ConstGauge::new(PAUSED_WORKSPACES.load(Ordering::Relaxed));
        paused.encode(encoder.encode_descriptor(
            "cloud_harness_paused_workspaces",
            "Open workspaces paused while idle (no mounts, live tiers or sandbox until used)",
            None,
            paused.metric_type(),
        )?)?;
        // Tasks that outlive their requests (a binding, a stream) show here first.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let tasks = ConstGauge::new(runtime.metrics().num_alive_tasks() as i64);
            tasks.encode(encoder.encode_descriptor(
                "cloud_harness_runtime_tasks",
                "Tasks alive on the server's runtime",
                None,
                tasks.metric_type(),
            )?)?;
        }
        let limits = crate::limits::quotas().limits;
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "cloud_harness_limit",
            "Each quota's value per principal (the [limits] of the configuration)",
            None,
            gauge.metric_type(),
        )?;
        for (name, _) in crate::limits::NAMES {
            let labels: Labels = vec![("limit", (*name).to_owned())];
            ConstGauge::new(limits.get(name) as i64).encode(family.encode_family(&labels)?)?;
        }
        let refusals = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "cloud_harness_quota_refusals",
            "Requests refused because a principal's quota was used up, by limit.",
            None,
            refusals.metric_type(),
        )?;
        for (name, n) in crate::limits::refusals() {
            let labels: Labels = vec![("limit", name)];
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cloud_harness_principal_usage",
            "What each principal uses now of a quota (hourly budgets: what the last hour took)",
            None,
            gauge.metric_type(),
        )?;
        for (principal, limit, used) in USAGE.lock().expect("usage lock").iter() {
            let labels: Labels = vec![
                ("principal", principal.clone()),
                ("limit", (*limit).to_owned()),
            ];
            ConstGauge::new(*used as i64).encode(family.encode_family(&labels)?)?;
        }
        let ops = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "cloud_harness_fuse_operations",
            "Requests the kernel made of the skills mounts, by operation",
            None,
            ops.metric_type(),
        )?;
        for op in Op::ALL {
            let labels: Labels = vec![("op", op.as_str().to_owned())];
            ConstCounter::new(STATS.ops(op)).encode(family.encode_family(&labels)?)?;
        }
        let problems = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "cloud_harness_skill_problems",
            "Problems of the Agent Skills specification found, by rule, each time a skill folder is parsed (a skill cache keeps a parse for the resolutions that share it)",
            None,
            problems.metric_type(),
        )?;
        for (rule, n) in SKILL_STATS.problems() {
            let labels: Labels = vec![("rule", rule.as_str().to_owned())];
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
        let counters = [
            ("cloud_harness_skills_refused", "Skills not served for breaking the Agent Skills specification (validation: refuse), counted at each resolution", &SKILL_STATS.skills_refused),
            ("cloud_harness_fuse_negative_lookups", "Lookups of names the mounts do not have (cached by the kernel as negative entries)", &STATS.negative_lookups),
            ("cloud_harness_fuse_read_bytes", "Bytes the mounts served to reads", &STATS.read_bytes),
            ("cloud_harness_skill_cache_hits", "Skill folders whose parse came from the skill cache", &SKILL_STATS.skill_cache_hits),
            ("cloud_harness_skill_cache_misses", "Skill folders parsed from the store", &SKILL_STATS.skill_cache_misses),
            ("cloud_harness_store_objects_hashed", "Store objects read and hashed against their digest", &STORE_STATS.objects_hashed),
            ("cloud_harness_store_objects_trusted", "Store objects read without hashing: this process had hashed the same, unchanged file", &STORE_STATS.objects_trusted),
        ];
        for (name, help, value) in counters {
            let c = ConstCounter::new(value.load(Ordering::Relaxed));
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            acquisitions: Family::default(),
            acquisition_seconds: Timings::new_with_constructor(seconds),
            warm_starts: Counter::default(),
            fetched_bytes: Counter::default(),
            egress: Family::default(),
            calls: Family::default(),
            call_seconds: Timings::new_with_constructor(seconds),
            executors: Family::default(),
            runs: Family::default(),
            remote: Family::default(),
            remote_bytes: Counter::default(),
        };
        registry.register(
            "cloud_harness_acquisitions",
            "Toolkit acquisitions, by mode (warm, in-process, container) and result (ok or an error code)",
            m.acquisitions.clone(),
        );
        registry.register(
            "cloud_harness_acquisition_seconds",
            "How long acquisitions took, by mode",
            m.acquisition_seconds.clone(),
        );
        registry.register(
            "cloud_harness_warm_starts",
            "Acquisitions served from the store without the network",
            m.warm_starts.clone(),
        );
        registry.register(
            "cloud_harness_fetched_bytes",
            "Bytes fetched from git servers",
            m.fetched_bytes.clone(),
        );
        registry.register(
            "cloud_harness_egress_decisions",
            "The built-in egress proxy's decisions, by verdict",
            m.egress.clone(),
        );
        registry.register(
            "cloud_harness_mcp_calls",
            "MCP tool calls, by tool and code (OK or the error's code)",
            m.calls.clone(),
        );
        registry.register(
            "cloud_harness_mcp_call_seconds",
            "How long MCP tool calls took, by tool",
            m.call_seconds.clone(),
        );
        registry.register(
            "cloud_harness_executors_started",
            "Executors made for workspaces, by kind",
            m.executors.clone(),
        );
        registry.register(
            "cloud_harness_runs",
            "skills_run calls that reached an executor, by kind and result (ok, or an error code)",
            m.runs.clone(),
        );
        registry.register(
            "cloud_harness_store_of_record",
            "What the store of record on object storage did, by event (hit, miss, unreachable, refused: a bad object, timeout: a download past the fetch timeout, published, publish_failed)",
            m.remote.clone(),
        );
        registry.register(
            "cloud_harness_store_of_record_bytes",
            "Bytes brought into the local store from the store of record",
            m.remote_bytes.clone(),
        );

        registry.register_collector(Box::new(Scraped));
        registry.register_collector(Box::new(crate::skill_usage::Series));
        registry.register_collector(Box::new(crate::skill_usage::spans::Counters));
        *m.registry.lock().expect("metrics lock") = registry;
        m
    })
}

/// The store of record did `event` (see its help text).
pub fn remote(event: &'static str) {
    metrics()
        .remote
        .get_or_create(&vec![("event", event.to_owned())])
        .inc();
}

/// An acquisition ended: `mode` is how it ran (`warm` when the store had it).
pub fn acquisition(mode: &str, result: &str, took: Duration, bytes: u64) {
    let m = metrics();
    let mode = mode.to_owned();
    m.acquisitions
        .get_or_create(&vec![("mode", mode.clone()), ("result", result.to_owned())])
        .inc();
    m.acquisition_seconds
        .get_or_create(&vec![("mode", mode.clone())])
        .observe(took.as_secs_f64());
    match mode.as_str() {
        "warm" => {
            m.warm_starts.inc();
        }
        // Bytes from object storage are not bytes from git servers.
        "remote" => {
            m.remote_bytes.inc_by(bytes);
        }
        _ => {
            m.fetched_bytes.inc_by(bytes);
        }
    }
}

/// The egress proxy decided: `allow` or `refuse`.
pub fn egress(verdict: &'static str) {
    metrics()
        .egress
        .get_or_create(&vec![("verdict", verdict.to_owned())])
        .inc();
}

/// An MCP tool call ended with `code` (`OK` or the error's).
pub fn call(tool: &str, code: &str, took: Duration) {
    let m = metrics();
    m.calls
        .get_or_create(&vec![("tool", tool.to_owned()), ("code", code.to_owned())])
        .inc();
    m.call_seconds
        .get_or_create(&vec![("tool", tool.to_owned())])
        .observe(took.as_secs_f64());
}

pub fn executor_started(kind: &str) {
    metrics()
        .executors
        .get_or_create(&vec![("kind", kind.to_owned())])
        .inc();
}

pub fn run(kind: &str, result: &str) {
    metrics()
        .runs
        .get_or_create(&vec![
            ("kind", kind.to_owned()),
            ("result", result.to_owned()),
        ])
        .inc();
}

/// What each principal uses now, counted by the caller (see `cloud_harness_principal_usage`).
pub fn set_usage(usage: Vec<(String, &'static str, u64)>) {
    *USAGE.lock().expect("usage lock") = usage;
}

pub fn set_open_workspaces(n: usize) {
    OPEN_WORKSPACES.store(n as i64, Ordering::Relaxed);
}

pub fn set_paused_workspaces(n: usize) {
    PAUSED_WORKSPACES.store(n as i64, Ordering::Relaxed);
}

/// Every series, in the text format.
pub fn text() -> String {
    let m = metrics();
    let mut out = String::new();
    let registry = m.registry.lock().expect("metrics lock");
    prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String");
    out
}

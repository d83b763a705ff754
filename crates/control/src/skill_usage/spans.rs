//! Each use as an OpenTelemetry span, sent to an OTLP/HTTP collector when one is configured
//! (`usage.otlp_endpoint`; off by default). A use is queued without waiting (a bounded queue:
//! past [`MAX_QUEUED`] a span is counted as dropped, never allocated for), and one thread sends
//! what is queued every [`EVERY`] in requests of at most [`MAX_BATCH`] spans, OTLP's JSON
//! encoding over HTTP (`POST …/v1/traces`): a collector that is slow or gone costs a request's
//! timeout on that thread, never a serving path's time.
//!
//! The encoding is written here (the spans are flat records; OTLP/JSON is a stable, documented
//! mapping) rather than through the OpenTelemetry SDK, whose crates would be most of this
//! feature's build.

use super::{field, Use};
use cloud_harness_error::{Error, Result};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, LazyLock, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Spans waiting to be sent.
pub const MAX_QUEUED: usize = 4096;
/// Spans in one request.
pub const MAX_BATCH: usize = 512;
/// How often the queue is sent.
pub const EVERY: Duration = Duration::from_secs(2);
/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// One use, as its span says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The use's fields ([`Use::fields`], each cut as the tally cuts it).
    fields: [String; 9],
    failed: bool,
    start_ns: u64,
    end_ns: u64,
    trace: [u8; 16],
    span: [u8; 8],
}

struct Queue {
    on: AtomicBool,
    spans: Mutex<VecDeque<Span>>,
    dropped: AtomicU64,
    sent: AtomicU64,
}

static QUEUE: LazyLock<Queue> = LazyLock::new(|| Queue {
    on: AtomicBool::new(false),
    spans: Mutex::new(VecDeque::new()),
    dropped: AtomicU64::new(0),
    sent: AtomicU64::new(0),
});

fn queue() -> std::sync::MutexGuard<'static, VecDeque<Span>> {
    QUEUE
        .spans
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Spans given up (the queue full, or a request the collector did not take), since the
/// process started.
pub fn dropped() -> u64 {
    QUEUE.dropped.load(Ordering::Relaxed)
}

/// Spans the collector took, since the process started.
pub fn sent() -> u64 {
    QUEUE.sent.load(Ordering::Relaxed)
}

/// The exporter's Prometheus counters: spans the collector took, and spans given up.
#[derive(Debug)]
pub struct Counters;

impl prometheus_client::collector::Collector for Counters {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::result::Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        for (name, help, n) in [
            ("cloud_harness_skill_spans_sent", "Skill use spans the OTLP collector took", sent()),
            ("cloud_harness_skill_spans_dropped", "Skill use spans given up: the queue full, or a request the OTLP collector did not take", dropped()),
        ] {
            let c = ConstCounter::new(n);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}

/// Queues `u`'s span (ending now), if spans are sent.
pub fn offer(u: &Use) {
    if !QUEUE.on.load(Ordering::Relaxed) {
        return;
    }
    offer_at(u, crate::state::now_ms());
}

fn offer_at(u: &Use, now_ms: i64) {
    if queue().len() >= MAX_QUEUED {
        QUEUE.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // Made outside the lock: the FUSE threads hold it for a push only.
    let end_ns = u64::try_from(now_ms).unwrap_or(0).saturating_mul(1_000_000);
    let mut ids = [0u8; 24];
    getrandom::fill(&mut ids).expect("the kernel's random numbers");
    let (trace, span) = ids.split_at(16);
    let fields = u.fields().map(|f| field(f).to_owned());
    let mut q = queue();
    if q.len() >= MAX_QUEUED {
        QUEUE.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    q.push_back(Span {
        fields,
        failed: u.failed,
        start_ns: end_ns.saturating_sub(u.duration_ms.saturating_mul(1_000_000)),
        end_ns,
        trace: trace.try_into().expect("16 bytes"),
        span: span.try_into().expect("8 bytes"),
    });
}

/// The attribute each field is sent as.
const ATTRIBUTES: [&str; 9] = [
    "cloud_harness.source",
    "cloud_harness.workspace",
    "enduser.id",
    "cloud_harness.toolkit",
    "vcs.ref.head.revision",
    "cloud_harness.bundle",
    "cloud_harness.tier",
    "cloud_harness.skill",
    "cloud_harness.file",
];

/// `spans` as one OTLP/JSON `ExportTraceServiceRequest`.
pub fn encode(spans: &[Span]) -> Value {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let attributes: Vec<Value> = ATTRIBUTES
                .iter()
                .zip(&s.fields)
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| json!({ "key": k, "value": { "stringValue": v } }))
                .collect();
            json!({
                "traceId": hex(&s.trace),
                "spanId": hex(&s.span),
                "name": format!("skill.{}", s.fields[0]),
                // SPAN_KIND_INTERNAL
                "kind": 1,
                "startTimeUnixNano": s.start_ns.to_string(),
                "endTimeUnixNano": s.end_ns.to_string(),
                "attributes": attributes,
                // STATUS_CODE_ERROR for a failed run, else unset.
                "status": if s.failed { json!({ "code": 2 }) } else { json!({}) },
            })
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [
                { "key": "service.name", "value": { "stringValue": "cloud-harness" } },
                { "key": "service.version", "value": { "stringValue": env!("CARGO_PKG_VERSION") } },
            ] },
            "scopeSpans": [{
                "scope": { "name": "cloud-harness.skill-usage" },
                "spans": spans,
            }],
        }],
    })
}

/// The collector spans go to, as the environment (or the configuration file) names it.
pub fn endpoint_from_env() -> Option<String> {
    std::env::var("CLOUD_HARNESS_USAGE_OTLP_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
}

/// The thread that sends the spans; [`Exporter::stop`] sends what is left.
pub struct Exporter {
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Exporter {
    /// Spans turned on and sent to `endpoint` (an `http://` or `https://` URL, the
    /// collector's `/v1/traces`).
    pub fn start(endpoint: &str) -> Result<Exporter> {
        let url = url::Url::parse(endpoint)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "usage.otlp_endpoint: {endpoint:?} is not an http:// or https:// URL"
                ))
            })?;
        // Straight to the collector: not through the egress proxy (`HTTPS_PROXY` is the
        // toolkits' way out), and no redirect followed.
        let client = reqwest::blocking::Client::builder()
            .timeout(TIMEOUT)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::internal(format!("the OTLP client: {e}")))?;
        QUEUE.on.store(true, Ordering::Relaxed);
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("usage-spans".into())
            .spawn(move || {
                let mut warned: Option<std::time::Instant> = None;
                loop {
                    let last = !matches!(
                        stopped.recv_timeout(EVERY),
                        Err(mpsc::RecvTimeoutError::Timeout)
                    );
                    loop {
                        let batch: Vec<Span> = {
                            let mut q = queue();
                            let n = q.len().min(MAX_BATCH);
                            q.drain(..n).collect()
                        };
                        if batch.is_empty() {
                            break;
                        }
                        let n = batch.len() as u64;
                        if let Err(e) = send(&client, &url, &batch) {
                            if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                                warned = Some(std::time::Instant::now());
                                tracing::warn!(error = %e, "the OTLP collector did not take the skill usage spans; given up");
                            }
                            QUEUE.dropped.fetch_add(n, Ordering::Relaxed);
                            // The rest waits for the next tick (the queue's bound holds it);
                            // a stopping server gives it up rather than wait on each batch.
                            if last {
                                let left = std::mem::take(&mut *queue()).len() as u64;
                                QUEUE.dropped.fetch_add(left, Ordering::Relaxed);
                            }
                            break;
                        }
                        QUEUE.sent.fetch_add(n, Ordering::Relaxed);
                    }
                    if last {
                        return;
                    }
                }
            })
            .map_err(|e| Error::internal(format!("starting the span exporter: {e}")))?;
        Ok(Exporter {
            stop,
            thread: Some(thread),
        })
    }

    /// Turns spans off, sends what is queued (giving it up at the first request the
    /// collector does not take) and ends the thread.
    pub fn stop(mut self) {
        QUEUE.on.store(false, Ordering::Relaxed);
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send(
    client: &reqwest::blocking::Client,
    url: &url::Url,
    batch: &[Span],
) -> std::result::Result<(), String> {
    let body = serde_json::to_vec(&encode(batch)).expect("spans serialize");
    let answer = client
        .post(url.clone())
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .map_err(|e| e.to_string())?;
    if answer.status().is_success() {
        Ok(())
    } else {
        Err(format!("{} answered {}", url, answer.status()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skill_usage::{Origin, Source};

    #[test]
    fn a_span_says_what_its_use_was() {
        let origin = Origin {
            toolkit: "https://example.test/kit.git".into(),
            commit: "a".repeat(40),
            bundle: "sha256:b".into(),
            tier: "owner".into(),
        };
        let u = Use {
            source: Source::Run,
            workspace: "ws_1",
            principal: "token:alice",
            origin: &origin,
            skill: "lint",
            file: "scripts/run.sh",
            failed: true,
            duration_ms: 1500,
        };
        offer_at(&u, 10_000);
        let span = queue().pop_back().unwrap();
        let v = encode(&[span]);
        let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["name"], "skill.run");
        assert_eq!(
            (&s["startTimeUnixNano"], &s["endTimeUnixNano"]),
            (&json!("8500000000"), &json!("10000000000"))
        );
        assert_eq!(s["status"]["code"], 2);
        assert_eq!(s["traceId"].as_str().unwrap().len(), 32);
        assert_eq!(s["spanId"].as_str().unwrap().len(), 16);
        let attr = |k: &str| {
            s["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["key"] == k)
                .map(|a| a["value"]["stringValue"].clone())
        };
        assert_eq!(attr("enduser.id"), Some(json!("token:alice")));
        assert_eq!(attr("cloud_harness.skill"), Some(json!("lint")));
        assert_eq!(attr("cloud_harness.file"), Some(json!("scripts/run.sh")));
        assert_eq!(attr("vcs.ref.head.revision"), Some(json!("a".repeat(40))));
    }
}

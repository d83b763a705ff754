//! Skill usage as OpenTelemetry spans: `serve --http` told of an OTLP/HTTP collector (a small
//! one here, on loopback, that keeps what it is sent), a built-in skill read through MCP, and
//! the span that reaches the collector checked as a trace backend would read it; then the
//! collector refusing, and the server serving on.

use crate::support;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A collector on loopback: every request's body kept, answered with `status`.
struct Collector {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    status: Arc<Mutex<u16>>,
}

fn collector() -> Collector {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let status = Arc::new(Mutex::new(200));
    let (kept, answer) = (bodies.clone(), status.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (kept, answer) = (kept.clone(), answer.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                loop {
                    // One request: its line, its headers, its body.
                    let mut length = 0;
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    assert!(line.starts_with("POST /v1/traces "), "{line}");
                    loop {
                        line.clear();
                        reader.read_line(&mut line).unwrap();
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    kept.lock()
                        .unwrap()
                        .push(serde_json::from_slice(&body).unwrap());
                    let status = *answer.lock().unwrap();
                    let reply = format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\n{{}}");
                    if conn.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Collector {
        url,
        bodies,
        status,
    }
}

impl Collector {
    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .flat_map(|b| {
                b["resourceSpans"][0]["scopeSpans"][0]["spans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .collect()
    }
}

fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["key"] == key)
        .map_or(&Value::Null, |a| &a["value"]["stringValue"])
}

#[test]
fn a_skill_read_reaches_the_collector_as_a_span_and_a_refusing_collector_stops_nothing() {
    let c = collector();
    let w = support::api::world_with(
        tempfile::tempdir().unwrap(),
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_USAGE_OTLP_ENDPOINT", &c.url),
        ],
    );
    let session = w.session();
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "spans"}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let out = &opened["structuredContent"];
    let ws = out["workspace"].as_str().unwrap().to_owned();
    let skill = out["skills"][0]["name"].as_str().unwrap().to_owned();
    let read = w.tool(
        &session,
        "skills_read",
        json!({"workspace": ws, "skill": skill, "path": "SKILL.md"}),
    );
    assert_eq!(read["isError"], false, "{read}");
    let me = w.op("GET", "/api/v1/whoami", None)["actor"].clone();

    let read_span = || c.spans().into_iter().find(|s| s["name"] == "skill.read");
    support::wait::until("the read's span", Duration::from_secs(20), || {
        read_span().is_some()
    });
    let span = read_span().unwrap();
    assert_eq!(
        attribute(&span, "cloud_harness.skill"),
        &json!(skill),
        "{span}"
    );
    assert_eq!(attribute(&span, "cloud_harness.workspace"), &json!(ws));
    assert_eq!(attribute(&span, "cloud_harness.file"), "SKILL.md");
    assert_eq!(attribute(&span, "cloud_harness.tier"), "builtin", "{span}");
    assert_eq!(attribute(&span, "enduser.id"), &me);
    assert_eq!(span["traceId"].as_str().unwrap().len(), 32);
    let (start, end): (u64, u64) = (
        span["startTimeUnixNano"].as_str().unwrap().parse().unwrap(),
        span["endTimeUnixNano"].as_str().unwrap().parse().unwrap(),
    );
    assert!(start <= end && end > 1_700_000_000_000_000_000, "{span}");
    let body = c.bodies.lock().unwrap()[0].clone();
    assert_eq!(
        body["resourceSpans"][0]["resource"]["attributes"][0],
        json!({"key": "service.name", "value": {"stringValue": "cloud-harness"}})
    );

    // The collector refuses from now on: the spans are given up, the reads still answered.
    *c.status.lock().unwrap() = 503;
    let before = c.bodies.lock().unwrap().len();
    for _ in 0..3 {
        let read = w.tool(
            &session,
            "skills_read",
            json!({"workspace": ws, "skill": skill, "path": "SKILL.md"}),
        );
        assert_eq!(read["isError"], false, "{read}");
    }
    support::wait::until("a refused request", Duration::from_secs(20), || {
        c.bodies.lock().unwrap().len() > before
    });
    let counter = |name: &str| -> u64 {
        let metrics = w.metrics();
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_total ")))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .parse()
            .unwrap()
    };
    // The refused spans are counted as given up; those taken before, as sent.
    support::wait::until("the spans given up", Duration::from_secs(10), || {
        counter("cloud_harness_skill_spans_dropped") >= 1
    });
    assert!(counter("cloud_harness_skill_spans_sent") >= 1);
    support::wait::until("the server's warning", Duration::from_secs(10), || {
        w.server
            .log
            .lock()
            .unwrap()
            .contains("did not take the skill usage spans")
    });
}

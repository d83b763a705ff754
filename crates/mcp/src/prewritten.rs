//! Listing pages go into HTTP answers as the JSON they were written as, once per page.
//!
//! rmcp takes a tool's result as an owned value, so every `skills_list` call copied its page's
//! value, wrote it out as JSON, and escaped the page's JSON text again for the text block: half
//! the server's CPU under load (`perf`), for bytes that are the same on every call. Over HTTP the
//! result rmcp writes carries two placeholders instead, short strings holding a secret that no
//! client or toolkit can know, and the guard writes the page's own bytes in their place as the
//! event goes out, on the POST's stream or on a GET stream that resumes it. The bytes on the
//! wire are the ones rmcp would have written. stdio gets the whole value, as before.
//!
//! A page is held here only while answers carrying its placeholders are in flight (and no
//! more than [`MAX_WAITING`] of pages: beyond that an answer carries its page); the escaped
//! text stays with the page in the workspace's page cache.

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use cloud_harness_workspace::ListPage;
use http_body_util::BodyExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Put on a request by the guard: an answer to it goes out through [`filling`], so it may
/// carry placeholders.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Filled;

/// The most bytes of pages held for answers in flight; beyond it answers carry their pages.
const MAX_WAITING: usize = 256 << 20;

/// An answer not written this long after its placeholders were made is taken to be lost
/// (its client went away before its stream was resumed), and its page is let go.
const LOST: Duration = Duration::from_secs(300);

/// Placeholders come from this process only: `ch-prewritten-<secret>-`, then `t` (the text
/// block, a string) or `v` (the structured value, an object with this one key, as rmcp keeps
/// only objects there) and the page's id.
fn prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).expect("the system's random numbers");
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        format!("ch-prewritten-{hex}-")
    })
}

/// A page that answers not yet written carry placeholders for.
struct Waiting {
    page: Arc<ListPage>,
    /// Placeholders of it not filled yet.
    placeholders: usize,
    since: Instant,
}

/// Pages by id while answers wait for them (the pages of answers in flight, no more), and
/// their bytes.
#[derive(Default)]
struct Pages {
    waiting: HashMap<u64, Waiting>,
    bytes: usize,
}

fn pages() -> &'static Mutex<Pages> {
    static PAGES: OnceLock<Mutex<Pages>> = OnceLock::new();
    PAGES.get_or_init(Default::default)
}

/// A page's share of [`MAX_WAITING`]: its JSON, and the same escaped for the text block.
fn size(page: &ListPage) -> usize {
    2 * page.json.len()
}

/// The text block and the structured value of an answer carrying `page`: placeholders [`fill`]
/// replaces with the page's bytes. `None` when the pages waiting already hold
/// [`MAX_WAITING`]: that answer carries the page itself.
pub(crate) fn placeholders(page: &Arc<ListPage>) -> Option<(String, serde_json::Value)> {
    placeholders_within(page, MAX_WAITING)
}

fn placeholders_within(page: &Arc<ListPage>, max: usize) -> Option<(String, serde_json::Value)> {
    let now = Instant::now();
    let mut pages = pages().lock().expect("waiting pages");
    if !pages.waiting.contains_key(&page.id) {
        let Pages { waiting, bytes } = &mut *pages;
        waiting.retain(|_, w| {
            let lost = now.duration_since(w.since) >= LOST;
            if lost {
                *bytes -= size(&w.page);
            }
            !lost
        });
        if pages.bytes + size(page) > max {
            return None;
        }
        pages.bytes += size(page);
    }
    let w = pages.waiting.entry(page.id).or_insert_with(|| Waiting {
        page: page.clone(),
        placeholders: 0,
        since: now,
    });
    w.placeholders += 2;
    w.since = now;
    drop(pages);
    let (p, id) = (prefix(), page.id);
    Some((
        format!("{p}t{id}"),
        serde_json::json!({ format!("{p}v{id}"): null }),
    ))
}

/// The page of a placeholder being filled; the page is let go with its last placeholder.
fn take(id: u64) -> Option<Arc<ListPage>> {
    let mut pages = pages().lock().expect("waiting pages");
    let w = pages.waiting.get_mut(&id)?;
    let page = w.page.clone();
    w.placeholders -= 1;
    if w.placeholders == 0 {
        pages.waiting.remove(&id);
        pages.bytes -= size(&page);
    }
    Some(page)
}

/// `data` with every placeholder replaced by its page's bytes; a message whose page was let go
/// (see [`LOST`]) becomes a JSON-RPC error saying to call again.
pub fn fill(data: Bytes) -> Bytes {
    let needle = prefix().as_bytes();
    if memchr::memmem::find(&data, needle).is_none() {
        return data;
    }
    let mut out = Vec::new();
    for line in data.split_inclusive(|&b| b == b'\n') {
        let start = out.len();
        if fill_line(line, needle, &mut out).is_none() {
            out.truncate(start);
            out.extend_from_slice(&gone(line));
        }
    }
    Bytes::from(out)
}

/// Appends `line` with its placeholders filled to `out`; `None` when a page was let go. The
/// secret written anywhere else (inside a string, say) is passed on as it is.
fn fill_line(line: &[u8], needle: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut rest = line;
    while let Some(at) = memchr::memmem::find(rest, needle) {
        let (before, tail) = (&rest[..at], &rest[at + needle.len()..]);
        let digits = tail.get(1..).unwrap_or_default();
        let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        let id: Option<u64> = std::str::from_utf8(&digits[..n])
            .ok()
            .and_then(|d| d.parse().ok());
        let after = &digits[n..];
        // A placeholder is a value of its own: `:"…t1"` (the text) or `:{"…v1":null}`; the
        // same characters escaped inside a string are not one.
        let (start, skip, text) = match tail.first() {
            Some(b't') if before.ends_with(b":\"") && after.starts_with(b"\"") => (at - 1, 1, true),
            Some(b'v') if before.ends_with(b":{\"") && after.starts_with(b"\":null}") => {
                (at - 2, 7, false)
            }
            _ => {
                out.extend_from_slice(&rest[..at + needle.len()]);
                rest = tail;
                continue;
            }
        };
        let page = take(id?)?;
        out.extend_from_slice(&rest[..start]);
        out.extend_from_slice(match text {
            true => page.text().as_bytes(),
            false => page.json.as_bytes(),
        });
        rest = &after[skip..];
    }
    out.extend_from_slice(rest);
    Some(())
}

/// The SSE `data:` line (or bare JSON body) `line` as an error answer to the same request.
fn gone(line: &[u8]) -> Vec<u8> {
    #[derive(serde::Deserialize)]
    struct Id {
        id: serde_json::Value,
    }
    let (head, json) = match line.strip_prefix(b"data: ") {
        Some(json) => (&b"data: "[..], json),
        None => (&b""[..], line),
    };
    let body = json.trim_ascii_end();
    let id = serde_json::from_slice::<Id>(body).map_or(serde_json::Value::Null, |m| m.id);
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": -32603, "message": "this answer's listing was let go before it was written: call skills_list again" },
    });
    let mut out = head.to_vec();
    out.extend_from_slice(error.to_string().as_bytes());
    out.extend_from_slice(&json[body.len()..]);
    out
}

/// `response` with its placeholders filled: each event of an event stream as it goes out, a
/// JSON body whole.
pub(crate) async fn filling(response: Response) -> Response {
    let kind = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if kind.starts_with("text/event-stream") {
        let (parts, body) = response.into_parts();
        let body = body.map_frame(|frame| frame.map_data(fill));
        return Response::from_parts(parts, Body::new(body));
    }
    if !kind.starts_with("application/json") {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    match body.collect().await {
        Ok(collected) => {
            let bytes = fill(collected.to_bytes());
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(bytes))
        }
        Err(e) => {
            tracing::warn!(error = %e, "an answer's body failed");
            Response::from_parts(parts, Body::empty())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(value: serde_json::Value) -> Arc<ListPage> {
        Arc::new(ListPage::new(value))
    }

    /// What rmcp writes for a result, as an SSE event.
    fn event(id: u64, text: &str, value: &serde_json::Value) -> Bytes {
        let message = serde_json::json!({
            "jsonrpc": "2.0", "id": id,
            "result": { "content": [{ "type": "text", "text": text }], "structuredContent": value, "isError": false },
        });
        Bytes::from(format!("data: {message}\nid: 1/{id}\n\n"))
    }

    #[test]
    fn a_filled_event_is_the_event_of_the_whole_value() {
        let value = serde_json::json!({ "skills": [{ "name": "a \"quoted\" name\n", "path": "/x" }], "count": 1 });
        let page = built(value.clone());
        let (text, marker) = placeholders(&page).unwrap();
        let filled = fill(event(7, &text, &marker));
        assert_eq!(filled, event(7, &page.json, &value));
    }

    #[test]
    fn a_placeholder_written_inside_a_string_is_not_one() {
        let page = built(serde_json::json!({ "count": 2 }));
        let (text, marker) = placeholders(&page).unwrap();
        // The text block's placeholder quoted in another string, and the value's as a string.
        let quoted = serde_json::json!({ "a": format!("\"{text}\""), "b": marker.to_string() });
        let data = Bytes::from(format!("data: {quoted}\n\n"));
        assert_eq!(fill(data.clone()), data);
        // Bytes a page brings in are not looked at again.
        let sneaky = built(serde_json::json!({ "said": text }));
        let (text, marker) = placeholders(&sneaky).unwrap();
        let filled = fill(event(3, &text, &marker));
        assert_eq!(filled, event(3, &sneaky.json, &sneaky.value));
    }

    async fn body_of(response: Response) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn an_event_stream_and_a_json_body_are_filled() {
        let value = serde_json::json!({ "count": 5 });
        let page = built(value.clone());
        let (text, marker) = placeholders(&page).unwrap();
        let events = futures_util::stream::iter([
            Ok::<_, std::convert::Infallible>(Bytes::from_static(b"data: \nid: 0/1\n\n")),
            Ok(event(4, &text, &marker)),
        ]);
        let stream = Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(Body::from_stream(events))
            .unwrap();
        let want = [&b"data: \nid: 0/1\n\n"[..], &event(4, &page.json, &value)].concat();
        assert_eq!(body_of(filling(stream).await).await, want);

        let (text, marker) = placeholders(&page).unwrap(); // the next answer's
        let one = event(5, &text, &marker);
        let json = one
            .strip_prefix(b"data: ")
            .unwrap()
            .split(|&b| b == b'\n')
            .next()
            .unwrap();
        let response = Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, json.len())
            .body(Body::from(Bytes::copy_from_slice(json)))
            .unwrap();
        let response = filling(response).await;
        assert!(
            response.headers().get(header::CONTENT_LENGTH).is_none(),
            "the length changed"
        );
        let filled: serde_json::Value = serde_json::from_slice(&body_of(response).await).unwrap();
        assert_eq!(filled["result"]["structuredContent"], value);
        assert_eq!(filled["result"]["content"][0]["text"], page.json);
    }

    #[test]
    fn bytes_without_placeholders_are_passed_on_as_they_are() {
        let data = Bytes::from_static(b"data: {\"id\":1,\"text\":\"ch-prewritten-0-t1\"}\n\n");
        let out = fill(data.clone());
        assert_eq!(out.as_ptr(), data.as_ptr(), "not even copied");
    }

    #[test]
    fn a_page_let_go_gives_an_error_to_the_same_request() {
        let page = built(serde_json::json!({ "count": 0 }));
        let (text, marker) = placeholders(&page).unwrap();
        let message = event(9, &text, &marker);
        assert!(
            take(page.id).is_some() && take(page.id).is_some(),
            "both placeholders"
        );
        let out = fill(message);
        let out = std::str::from_utf8(&out).unwrap();
        let json = out.strip_prefix("data: ").unwrap().lines().next().unwrap();
        let answer: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(answer["id"], 9);
        assert_eq!(answer["error"]["code"], -32603);
        assert!(out.ends_with("\nid: 1/9\n\n"), "{out}");
    }

    #[test]
    fn a_page_is_held_while_answers_wait_for_it_and_no_longer() {
        let page = built(serde_json::json!({ "count": 3 }));
        let held = || pages().lock().unwrap().waiting.contains_key(&page.id);
        let (text, marker) = placeholders(&page).unwrap();
        let second = placeholders(&page).unwrap();
        fill(event(1, &text, &marker));
        assert!(held(), "the second answer still waits");
        fill(event(2, &second.0, &second.1));
        assert!(!held(), "let go with the last placeholder");
        // When the pages waiting hold as much as they may, an answer carries its page.
        assert!(placeholders_within(&page, 0).is_none());
        assert!(!held());
    }
}

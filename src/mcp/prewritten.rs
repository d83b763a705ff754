//! Listing pages go into HTTP answers as the JSON they were written as, once per page.
//!
//! rmcp takes a tool's result as an owned value, so every `skills_list` call copied its page's
//! value, wrote it out as JSON, and escaped the page's JSON text again for the text block: half
//! the server's CPU under load (`perf`), for bytes that are the same on every call. Over HTTP the
//! result rmcp writes carries two placeholders instead, short strings holding a secret that no
//! client or toolkit can know, and the guard writes the page's own bytes in their place as the
//! event goes out, on the POST's stream or on a GET stream that resumes it. The bytes on the
//! wire are the ones rmcp would have written. stdio gets the whole value, as before.

use crate::workspace::ListPage;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use http_body_util::BodyExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Put on a request by the guard: an answer to it goes out through [`filling`], so it may
/// carry placeholders.
#[derive(Clone, Copy, Debug)]
pub struct Filled;

/// Bytes of page text kept for placeholders not filled yet. A page stays while it is used;
/// the least recently used goes when this is exceeded (an answer resumed after that gets an
/// error to call again).
const BUDGET: usize = 64 << 20;

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

/// A page as answers carry it.
struct Prepared {
    page: Arc<ListPage>,
    /// The page's JSON as a JSON string (the text block's value), escaped once.
    text: String,
}

impl Prepared {
    fn bytes(&self) -> usize {
        self.page.json.len() + self.text.len()
    }
}

#[derive(Default)]
struct Kept {
    /// Pages by id, with when each was last used.
    pages: HashMap<u64, (Arc<Prepared>, u64)>,
    bytes: usize,
    clock: u64,
}

fn kept() -> &'static Mutex<Kept> {
    static KEPT: OnceLock<Mutex<Kept>> = OnceLock::new();
    KEPT.get_or_init(Default::default)
}

/// The text block and the structured value of an answer carrying `page`: placeholders [`fill`]
/// replaces with the page's bytes.
pub fn placeholders(page: &Arc<ListPage>) -> (String, serde_json::Value) {
    let known = {
        let mut kept = kept().lock().expect("kept pages");
        kept.clock += 1;
        let now = kept.clock;
        kept.pages.get_mut(&page.id).map(|e| e.1 = now).is_some()
    };
    if !known {
        // Escaped outside the lock: a page of 1,000 skills takes a while.
        let text = serde_json::to_string(&page.json).expect("strings serialize");
        let prepared = Arc::new(Prepared {
            page: page.clone(),
            text,
        });
        let mut kept = kept().lock().expect("kept pages");
        kept.bytes += prepared.bytes();
        let used = kept.clock;
        if let Some((old, _)) = kept.pages.insert(page.id, (prepared, used)) {
            kept.bytes -= old.bytes();
        }
        while kept.bytes > BUDGET && kept.pages.len() > 1 {
            let oldest = kept
                .pages
                .iter()
                .min_by_key(|(_, e)| e.1)
                .map(|(id, _)| *id);
            if let Some((gone, _)) = oldest.and_then(|id| kept.pages.remove(&id)) {
                kept.bytes -= gone.bytes();
            }
        }
    }
    let (p, id) = (prefix(), page.id);
    (
        format!("{p}t{id}"),
        serde_json::json!({ format!("{p}v{id}"): null }),
    )
}

/// `data` with every placeholder replaced by its page's bytes; a message whose page is no
/// longer kept becomes a JSON-RPC error saying to call again.
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

/// Appends `line` with its placeholders filled to `out`; `None` when a page is not kept. The
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
        let prepared = {
            let kept = kept().lock().expect("kept pages");
            kept.pages.get(&id?)?.0.clone()
        };
        out.extend_from_slice(&rest[..start]);
        out.extend_from_slice(match text {
            true => prepared.text.as_bytes(),
            false => prepared.page.json.as_bytes(),
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
        "error": { "code": -32603, "message": "this answer's listing is no longer kept: call skills_list again" },
    });
    let mut out = head.to_vec();
    out.extend_from_slice(error.to_string().as_bytes());
    out.extend_from_slice(&json[body.len()..]);
    out
}

/// `response` with its placeholders filled: each event of an event stream as it goes out, a
/// JSON body whole.
pub async fn filling(response: Response) -> Response {
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
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 40);
        Arc::new(ListPage {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            json: value.to_string(),
            value,
        })
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
        let (text, marker) = placeholders(&page);
        let filled = fill(event(7, &text, &marker));
        assert_eq!(filled, event(7, &page.json, &value));
    }

    #[test]
    fn a_placeholder_written_inside_a_string_is_not_one() {
        let page = built(serde_json::json!({ "count": 2 }));
        let (text, marker) = placeholders(&page);
        // The text block's placeholder quoted in another string, and the value's as a string.
        let quoted = serde_json::json!({ "a": format!("\"{text}\""), "b": marker.to_string() });
        let data = Bytes::from(format!("data: {quoted}\n\n"));
        assert_eq!(fill(data.clone()), data);
        // Bytes a page brings in are not looked at again.
        let sneaky = built(serde_json::json!({ "said": text }));
        let (text, marker) = placeholders(&sneaky);
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
        let (text, marker) = placeholders(&page);
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
    fn a_page_no_longer_kept_gives_an_error_to_the_same_request() {
        let page = built(serde_json::json!({ "count": 0 }));
        let (text, marker) = placeholders(&page);
        let message = event(9, &text, &marker);
        kept().lock().unwrap().pages.remove(&page.id);
        let out = fill(message);
        let out = std::str::from_utf8(&out).unwrap();
        let json = out.strip_prefix("data: ").unwrap().lines().next().unwrap();
        let answer: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(answer["id"], 9);
        assert_eq!(answer["error"]["code"], -32603);
        assert!(out.ends_with("\nid: 1/9\n\n"), "{out}");
    }

    #[test]
    fn pages_beyond_the_budget_go_least_recently_used_first() {
        let big = |n: u32| built(serde_json::json!({ "n": n, "pad": "x".repeat(BUDGET / 6) }));
        let (first, second) = (big(1), big(2));
        placeholders(&first);
        placeholders(&second);
        placeholders(&first); // used again: the second is now the older
        let third = big(3);
        placeholders(&third);
        let kept = kept().lock().unwrap();
        assert!(kept.pages.contains_key(&first.id));
        assert!(!kept.pages.contains_key(&second.id));
        assert!(kept.pages.contains_key(&third.id));
        assert!(kept.bytes <= BUDGET);
    }
}

//! A quick call's SSE answer in one write. rmcp opens the event stream of a POST with a
//! priming event (an event id a client can resume from) before the answer is ready, and hyper
//! writes whatever the body has whenever it has it: the head and the priming event went out in
//! one TCP write, the answer and the end of the stream in a second, so every call woke its
//! client twice. The response is handed to hyper once its stream has ended, or after [`HOLD`]:
//! a call that takes longer gets what is ready then, and the rest as it comes.

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use std::time::Duration;

/// How long the head and priming event wait for the answer behind them.
pub(crate) const HOLD: Duration = Duration::from_millis(20);

/// Frames waited for at most before the response goes to hyper.
const FRAMES: usize = 8;

type Frame = Result<hyper::body::Frame<Bytes>, axum::Error>;

/// `response`, and when it is an event stream (the only kind whose frames trickle), once its
/// stream has ended (or [`HOLD`] has passed, or [`FRAMES`] came), with the frames read in
/// front of the rest of its body.
pub(crate) async fn coalesce(response: Response) -> Response {
    let is_event_stream = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_event_stream {
        return response;
    }
    let (parts, mut body) = response.into_parts();
    let mut first: Vec<Frame> = Vec::new();
    let mut ended = false;
    let gather = async {
        // The priming event, the answer, the end of the stream (a call that reports
        // progress sends more before its answer: those few are waited for as well).
        for _ in 0..FRAMES {
            match body.frame().await {
                Some(frame) => {
                    let failed = frame.is_err();
                    first.push(frame);
                    if failed {
                        break;
                    }
                }
                None => {
                    ended = true;
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(HOLD, gather).await;
    // Frames ready when hyper first polls are written together with the head (it polls the
    // body until it waits, then writes what it has): no copy needed to join them.
    let head = futures_util::stream::iter(first);
    let body = match ended {
        true => Body::new(StreamBody::new(head)),
        false => Body::new(StreamBody::new(head.chain(BodyStream::new(body)))),
    };
    Response::from_parts(parts, body)
}

//! MCP over stdio with every line answered: the SDK's stdio transport drops a line it cannot
//! decode (and would hold any length in memory). Here each line of standard input is checked
//! first (`malformed`): a good one goes on to the SDK through a pipe, a bad one (or one over
//! 16 MiB, never held whole) is answered with its JSON-RPC error. The SDK's answers and ours
//! go out through one writer, a whole line at a time, so they never interleave.

use super::malformed::{self, MAX_MESSAGE};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The two ends the SDK is given, and the task that writes to `output` (wait for it after
/// the SDK is done, so the last answers are flushed).
pub fn filtered(
    input: impl AsyncRead + Unpin + Send + 'static,
    output: impl AsyncWrite + Unpin + Send + 'static,
) -> (
    tokio::io::DuplexStream,
    tokio::io::DuplexStream,
    tokio::task::JoinHandle<()>,
) {
    let (sdk_in, mut to_sdk) = tokio::io::duplex(1 << 16);
    let (sdk_out, from_sdk) = tokio::io::duplex(1 << 16);
    let (answers, mut ours) = mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(async move {
        let mut input = BufReader::new(input);
        while let Some(line) = next_line(&mut input).await {
            let refused = match &line {
                Line::TooLong => Some(malformed::too_large()),
                Line::Text(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => continue,
                Line::Text(bytes) => malformed::check(bytes),
            };
            match (refused, line) {
                (Some(r), _) => {
                    let mut answer = serde_json::to_vec(&r.answer).expect("errors serialize");
                    answer.push(b'\n');
                    if answers.send(answer).await.is_err() {
                        break;
                    }
                }
                (None, Line::Text(mut bytes)) => {
                    bytes.push(b'\n');
                    if to_sdk.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                (None, Line::TooLong) => unreachable!("a line too long is refused"),
            }
        }
        // End of input: the SDK sees it too.
        let _ = to_sdk.shutdown().await;
    });
    let writer = tokio::spawn(async move {
        let mut output = output;
        let mut from_sdk = BufReader::new(from_sdk);
        let mut line = Vec::new();
        let (mut sdk_open, mut ours_open) = (true, true);
        loop {
            // `read_until` keeps what it read in `line` if the other branch wins.
            tokio::select! {
                read = from_sdk.read_until(b'\n', &mut line), if sdk_open => match read {
                    Ok(0) | Err(_) => sdk_open = false,
                    Ok(_) => {
                        if output.write_all(&line).await.is_err() {
                            return;
                        }
                        line.clear();
                    }
                },
                answer = ours.recv(), if ours_open => match answer {
                    Some(answer) => {
                        if output.write_all(&answer).await.is_err() {
                            return;
                        }
                    }
                    None => ours_open = false,
                },
                else => break,
            }
            let _ = output.flush().await;
        }
        let _ = output.flush().await;
    });
    (sdk_in, sdk_out, writer)
}

enum Line {
    Text(Vec<u8>),
    /// Longer than a message may be; its bytes were read and dropped.
    TooLong,
}

/// The next line of `input` (without its newline), never holding more than `MAX_MESSAGE`.
async fn next_line(input: &mut (impl AsyncBufReadExt + Unpin)) -> Option<Line> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let chunk = match input.fill_buf().await {
            Ok(c) => c,
            Err(_) => return None,
        };
        if chunk.is_empty() {
            // End of input: a last line without a newline still counts.
            return match (too_long, line.is_empty()) {
                (true, _) => Some(Line::TooLong),
                (false, true) => None,
                (false, false) => Some(Line::Text(line)),
            };
        }
        let (part, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        if !too_long && line.len() + part.len() > MAX_MESSAGE {
            too_long = true;
            line = Vec::new();
        }
        if !too_long {
            line.extend_from_slice(part);
        }
        let used = done.unwrap_or(chunk.len());
        input.consume(used);
        if done.is_some() {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Some(if too_long {
                Line::TooLong
            } else {
                Line::Text(line)
            });
        }
    }
}

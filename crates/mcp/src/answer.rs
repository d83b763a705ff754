//! What a call answers: a tool's result (a value, or a listing page already written out), a
//! tool's error (its input echoed back short), and a JSON-RPC error for the protocol's own
//! methods.

use crate::prewritten;
use cloud_harness_error::Error;
use cloud_harness_workspace::ListPage;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};
use std::sync::Arc;

/// A tool's answer: a value, or a listing page whose JSON text is already written.
pub(crate) enum Answer {
    Value(Value),
    Page(Arc<ListPage>),
}

/// The result of a successful call. A page answering a request whose answer goes out through
/// [`prewritten::filling`] carries placeholders for the page's bytes instead of the page.
pub(crate) fn success(answer: Answer, filled: bool) -> CallToolResult {
    let (value, text) = match answer {
        Answer::Value(value) => {
            let text = serde_json::to_string(&value).unwrap_or_default();
            (value, text)
        }
        Answer::Page(page) => match filled.then(|| prewritten::placeholders(&page)).flatten() {
            Some((text, value)) => (value, text),
            None => (page.value.clone(), page.json.clone()),
        },
    };
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

/// Input echoed back in an error stays short: a 1 MiB argument makes a short message.
fn clip(value: &mut Value) {
    const MAX: usize = 1024;
    match value {
        Value::String(s) if s.len() > MAX => {
            let cut = (0..=MAX)
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(0);
            s.truncate(cut);
            s.push('…');
        }
        Value::Array(items) => items.iter_mut().for_each(clip),
        Value::Object(map) => map.values_mut().for_each(clip),
        _ => {}
    }
}

pub(crate) fn failure(error: Error) -> CallToolResult {
    let mut value = json!({
        "code": error.code,
        "status": error.status,
        "message": error.message,
        "details": error.details,
    });
    clip(&mut value);
    let error = Error {
        message: value["message"].as_str().unwrap_or_default().to_owned(),
        ..error
    };
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
        "{}: {}",
        error.code, error.message
    ))]);
    result.structured_content = Some(value);
    result
}

pub(crate) fn rpc_error(e: &Error) -> McpError {
    McpError::new(
        rmcp::model::ErrorCode(-32000),
        e.message.clone(),
        Some(json!({ "code": e.code, "details": e.details })),
    )
}

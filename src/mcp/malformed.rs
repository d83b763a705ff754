//! Messages the MCP SDK would drop or answer wrongly, caught before it sees them and answered
//! with the JSON-RPC error they deserve: bytes that are not JSON (-32700), batches and objects
//! that are not JSON-RPC 2.0 messages (-32600), a message too large (-32600), and a
//! `tools/call` whose `arguments` is not an object (-32602, not "method not found").
//! One check serves both transports: HTTP answers 400 (or 200 with the error, for a request
//! that has an id and was only wrong in its parameters), stdio writes the error as a line.

use serde_json::{json, Value};

/// The largest message either transport takes (a stdio line, an HTTP body).
pub const MAX_MESSAGE: usize = 16 << 20;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;

/// Why a message is refused, and the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// The HTTP status to answer with.
    pub status: u16,
    /// The JSON-RPC error response.
    pub answer: Value,
}

fn refuse(status: u16, id: Value, code: i64, message: &str) -> Refused {
    Refused {
        status,
        answer: json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } }),
    }
}

/// A message too large to take.
pub fn too_large() -> Refused {
    refuse(
        413,
        Value::Null,
        INVALID_REQUEST,
        "the message is larger than 16 MiB",
    )
}

/// `None` when the SDK may have the message; otherwise the answer.
pub fn check(bytes: &[u8]) -> Option<Refused> {
    if bytes.len() > MAX_MESSAGE {
        return Some(too_large());
    }
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            let message = format!("parse error: {e}");
            return Some(refuse(400, Value::Null, PARSE_ERROR, &message));
        }
    };
    let Value::Object(message) = value else {
        let why = match value {
            Value::Array(_) => "batches are not supported: send one message at a time",
            _ => "a JSON-RPC message is an object",
        };
        return Some(refuse(400, Value::Null, INVALID_REQUEST, why));
    };
    // An id of the wrong type is as good as none.
    let id = match message.get("id") {
        Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
        _ => Value::Null,
    };
    if message.get("jsonrpc") != Some(&json!("2.0")) {
        return Some(refuse(
            400,
            id,
            INVALID_REQUEST,
            "\"jsonrpc\" must be \"2.0\"",
        ));
    }
    match message.get("method") {
        Some(Value::String(method)) => {
            let arguments = message.get("params").and_then(|p| p.get("arguments"));
            let bad_arguments =
                method == "tools/call" && arguments.is_some_and(|a| !a.is_object() && !a.is_null());
            if bad_arguments && !id.is_null() {
                return Some(refuse(
                    200,
                    id,
                    INVALID_PARAMS,
                    "tools/call: \"arguments\" must be an object",
                ));
            }
            None
        }
        Some(_) => Some(refuse(
            400,
            id,
            INVALID_REQUEST,
            "\"method\" must be a string",
        )),
        // A response to one of the server's requests.
        None if message.contains_key("result") || message.contains_key("error") => None,
        None => Some(refuse(
            400,
            id,
            INVALID_REQUEST,
            "neither a request, a notification nor a response",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(bytes: &str) -> Option<(u16, i64)> {
        check(bytes.as_bytes()).map(|r| (r.status, r.answer["error"]["code"].as_i64().unwrap()))
    }

    #[test]
    fn each_kind_of_malformed_message_gets_its_code() {
        assert_eq!(code("{"), Some((400, PARSE_ERROR)));
        assert_eq!(code("[]"), Some((400, INVALID_REQUEST)));
        assert_eq!(code("7"), Some((400, INVALID_REQUEST)));
        assert_eq!(
            code(r#"{"id":1,"method":"ping"}"#),
            Some((400, INVALID_REQUEST))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1}"#),
            Some((400, INVALID_REQUEST))
        );
        assert_eq!(
            code(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":"no"}}"#
            ),
            Some((200, INVALID_PARAMS))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), None);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            None
        );
        let refused = check(br#"{"jsonrpc":"2.0","id":"a","method":5}"#).unwrap();
        assert_eq!(refused.answer["id"], "a");
    }
}

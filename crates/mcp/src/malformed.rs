//! Messages the MCP SDK would drop or answer wrongly, caught before it sees them and answered
//! with the JSON-RPC error they deserve: bytes that are not JSON (-32700), batches and objects
//! that are not JSON-RPC 2.0 messages (-32600), a message too large (-32600: more than 16 MiB,
//! or more than [`MAX_VALUES`] JSON values), and a `tools/call` whose `arguments` is not an
//! object (-32602, not "method not found").
//! One check serves both transports: HTTP answers 400 (or 200 with the error, for a request
//! that has an id and was only wrong in its parameters), stdio writes the error as a line.

use serde::de::{self, DeserializeSeed, IgnoredAny, Visitor};
use serde_json::{json, Value};
use std::cell::Cell;

/// The largest message either transport takes (a stdio line, an HTTP body).
pub(crate) const MAX_MESSAGE: usize = 16 << 20;

/// The most JSON values one message may hold. Once parsed, a value costs tens of bytes
/// whatever its length as text (16 MiB of `[0,0,…]` would be 8 million of them, half a GiB),
/// so they are counted, keeping none, before anything is built. The largest real message, a
/// `skills_run` with every argument it may have, holds a few hundred.
pub(crate) const MAX_VALUES: usize = 1 << 16;

pub(crate) const PARSE_ERROR: i64 = -32700;
pub(crate) const INVALID_REQUEST: i64 = -32600;
pub(crate) const INVALID_PARAMS: i64 = -32602;

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

/// A message of more than [`MAX_VALUES`] values.
fn too_many_values() -> Refused {
    refuse(
        413,
        Value::Null,
        INVALID_REQUEST,
        "the message holds more than 65536 JSON values",
    )
}

/// `None` when the SDK may have the message; otherwise the answer.
pub fn check(bytes: &[u8]) -> Option<Refused> {
    if bytes.len() > MAX_MESSAGE {
        return Some(too_large());
    }
    let counted = Cell::new(0);
    let mut counting = serde_json::Deserializer::from_slice(bytes);
    // A parse error is reported below, as the parse meets it.
    if Count(&counted).deserialize(&mut counting).is_err() && counted.get() > MAX_VALUES {
        return Some(too_many_values());
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

/// Counts the values of a JSON text without keeping any; an error past [`MAX_VALUES`].
#[derive(Clone, Copy)]
struct Count<'c>(&'c Cell<usize>);

impl Count<'_> {
    fn one<E: de::Error>(self) -> Result<(), E> {
        self.0.set(self.0.get() + 1);
        match self.0.get() > MAX_VALUES {
            true => Err(E::custom("too many values")),
            false => Ok(()),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.one()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.one()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.one()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.one()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.one()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.one()
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            self.one()?;
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_of_too_many_values_is_refused_before_it_is_built() {
        let values = |n: usize| {
            let zeros = vec!["0"; n].join(",");
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","arguments":{{"a":[{zeros}]}}}}}}"#
            )
        };
        // 15 values besides the zeros (keys count as values).
        assert_eq!(code(&values(MAX_VALUES - 15)), None);
        assert_eq!(code(&values(MAX_VALUES - 14)), Some((413, INVALID_REQUEST)));
        let nested = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(
            code(&nested),
            Some((400, PARSE_ERROR)),
            "past serde_json's recursion limit"
        );
        let flat = format!("[{}0]", "0,".repeat(1 << 20));
        assert_eq!(code(&flat), Some((413, INVALID_REQUEST)));
    }

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

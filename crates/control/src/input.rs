//! JSON input from users (tool arguments, toolkit specs) into typed values, with errors that
//! name the field to fix.

use cloud_harness_error::{Error, Result};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// Deserializes `value`; a problem is an INVALID_ARGUMENT whose message starts with the
/// field's path and whose details carry it. `whole` names the value itself.
pub fn parse<T: DeserializeOwned>(value: Value, whole: &str) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner().to_string();
        // serde names a missing field in its message, not in the path (an unknown one is in
        // the path already).
        let missing = inner
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let field = match (path.as_str(), missing) {
            (".", Some(name)) => name.to_owned(),
            (".", None) => whole.to_owned(),
            (p, Some(name)) => format!("{p}.{name}"),
            (p, None) => p.to_owned(),
        };
        Error::invalid(format!("{field}: {inner}")).with_details(json!({ "field": field }))
    })
}

/// A string field of at most `max` bytes; longer is an INVALID_ARGUMENT naming the field.
pub fn max_len(field: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::invalid(format!(
            "{field}: is {} bytes, more than the {max} allowed",
            value.len()
        ))
        .with_details(json!({ "field": field, "limit": max })));
    }
    Ok(())
}

/// An array field of at most `max` items.
pub fn max_items(field: &str, items: usize, max: usize) -> Result<()> {
    if items > max {
        return Err(Error::invalid(format!(
            "{field}: has {items} items, more than the {max} allowed"
        ))
        .with_details(json!({ "field": field, "limit": max })));
    }
    Ok(())
}

/// How a value from a request is shown back in an error: its first 80 characters.
pub fn shown(text: &str) -> String {
    text.chars().take(80).collect()
}

/// A text field of 1 to `max` bytes without control characters (names, reasons, sources).
pub fn check_text(field: &str, text: &str, max: usize) -> Result<()> {
    if text.is_empty() || text.len() > max || text.chars().any(char::is_control) {
        return Err(Error::field(
            cloud_harness_error::Code::InvalidArgument,
            field,
            format!("must be 1 to {max} bytes without control characters"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Args {
        name: String,
        inner: Option<Inner>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        n: u32,
    }

    #[test]
    fn errors_name_the_field() {
        let field = |v: Value| parse::<Args>(v, "args").unwrap_err().details["field"].clone();
        assert_eq!(field(json!({})), "name");
        assert_eq!(field(json!({"name": 1})), "name");
        assert_eq!(field(json!({"name": "a", "extra": 1})), "extra");
        assert_eq!(field(json!({"name": "a", "inner": {"n": "x"}})), "inner.n");
        assert_eq!(field(json!({"name": "a", "inner": {}})), "inner.n");
        assert_eq!(field(json!(5)), "args");
    }
}

//! Relative paths named in input (a skill root, a subdirectory, a file inside a skill): they
//! name a place inside a tree and must never leave it.

use crate::error::{Code, Error, Result};

/// The segments of `path`, which must be relative and stay inside `within` (named in the
/// error, e.g. "the toolkit"): no leading `/`, no NUL or backslash, no `..`. Empty and `.`
/// segments are dropped. Errors are INVALID_ARGUMENT naming `field`.
pub fn segments<'a>(path: &'a str, field: &str, within: &str) -> Result<Vec<&'a str>> {
    let bad = |why: String| Error::field(Code::InvalidArgument, field, format!("{path:?} {why}"));
    if path.starts_with('/') || path.contains('\0') || path.contains('\\') {
        return Err(bad(format!("must be a relative path inside {within}")));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(bad(format!("must not leave {within}")));
    }
    Ok(parts)
}

/// `name` inside the relative folder `base` (empty for the top).
pub fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_owned()
    } else {
        format!("{base}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::segments;

    #[test]
    fn inside_paths_are_split_and_the_rest_refused() {
        assert_eq!(segments("./a//b/", "f", "x").unwrap(), ["a", "b"]);
        assert!(segments(".", "f", "x").unwrap().is_empty());
        for bad in ["/a", "a/../../b", "..", "a\\b", "a\0b"] {
            let e = segments(bad, "f", "the toolkit").unwrap_err();
            assert_eq!(e.details["field"], "f", "{bad:?}");
            assert!(e.message.contains("the toolkit"), "{bad:?}: {}", e.message);
        }
    }
}

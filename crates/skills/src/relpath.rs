//! Relative paths named in input (a skill root, a subdirectory, a file inside a skill): they
//! name a place inside a tree and must never leave it.

use cloud_harness_error::{Code, Error, Result};

/// The segments of `path`, which must be relative and stay inside `within` (named in the
/// error, e.g. "the toolkit"): no leading `/`, no NUL or backslash, no `..`. Empty and `.`
/// segments are dropped. Errors are INVALID_ARGUMENT naming `field`.
pub fn segments<'a>(path: &'a str, field: &str, within: &str) -> Result<Vec<&'a str>> {
    let bad = |why: String| Error::field(Code::InvalidArgument, field, format!("{path:?} {why}"));
    if path.contains('\0') {
        return Err(bad("holds a NUL byte".into()));
    }
    if path.contains('\\') {
        return Err(bad("holds a backslash: separate folders with `/`".into()));
    }
    if path.starts_with('/') {
        return Err(bad(format!(
            "is absolute: give a path relative to {within}"
        )));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(bad(format!(
            "goes up with `..`, which could leave {within}"
        )));
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
        // Each message names the problem the path has.
        for (bad, says) in [
            ("/a", "is absolute"),
            ("a/../../b", "goes up with `..`"),
            ("..", "goes up with `..`"),
            ("a\\b", "holds a backslash"),
            ("a\0b", "holds a NUL byte"),
            ("/a\0", "holds a NUL byte"),
        ] {
            let e = segments(bad, "f", "the toolkit").unwrap_err();
            assert_eq!(e.details["field"], "f", "{bad:?}");
            assert!(e.message.contains(says), "{bad:?}: {}", e.message);
        }
    }
}

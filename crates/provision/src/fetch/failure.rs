//! What a failed fetch is: this machine's disk, an object past its limit, or the remote's
//! answer (NOT_FOUND for a commit it does not have, else UPSTREAM, retryable).

use super::watch::Ceiling;
use cloud_harness_error::{Code, Error};
use std::path::Path;

/// A fetch into `dir` that failed: one whose local disk failed (full, over quota, failing)
/// names that and `dir`; one that met an object larger than `ceiling.max_object` is
/// TOO_LARGE; anything else [`upstream`].
pub(crate) fn failed(
    url: &str,
    dir: &Path,
    e: &(dyn std::error::Error + 'static),
    ceiling: &Ceiling<'_>,
) -> Error {
    failed_here(url, dir, e, ceiling).unwrap_or_else(|| upstream(url, e))
}

/// Of a fetch's failures, those that are not the remote's answer cut short: this machine's
/// disk, or an object past `ceiling.max_object`.
pub(crate) fn failed_here(
    url: &str,
    dir: &Path,
    e: &(dyn std::error::Error + 'static),
    ceiling: &Ceiling<'_>,
) -> Option<Error> {
    if let Some(local) = local_disk(dir, e) {
        return Some(local);
    }
    past_alloc_limit(e).then(|| {
        object_too_large(
            &format!("fetching {url}"),
            ceiling.max_object,
            ceiling.object_setting,
        )
        .with_details(serde_json::json!({ "url": url, "limit": ceiling.max_object }))
    })
}

/// The failure of this machine's disk among `e` and its sources, as the error of `dir`: the
/// remote is not to blame for a full disk. (Some of gix's errors keep only the text of the
/// I/O error they wrap: the text is read too.)
pub(super) fn local_disk(dir: &Path, e: &(dyn std::error::Error + 'static)) -> Option<Error> {
    use nix::libc::{EDQUOT, EIO, ENOSPC};
    let mut cause = Some(e);
    while let Some(err) = cause {
        let code = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .filter(|c| [ENOSPC, EDQUOT, EIO].contains(c))
            .or_else(|| {
                let text = err.to_string();
                [
                    (ENOSPC, "(os error 28)"),
                    (EDQUOT, "(os error 122)"),
                    (EIO, "(os error 5)"),
                ]
                .into_iter()
                .find(|(_, t)| text.contains(t))
                .map(|(c, _)| c)
            });
        if let Some(code) = code {
            return Some(Error::io(dir, std::io::Error::from_raw_os_error(code)));
        }
        cause = err.source();
    }
    None
}

/// Whether gix refused to unpack an object past its allocation limit
/// (`gitoxide.objects.allocLimit`): it says so only deep in its chain of causes.
pub(crate) fn past_alloc_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.to_string().contains("too large to fit in memory") {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The refusal of an object past `limit` bytes (`setting` says which limit), met while
/// `doing`.
pub(crate) fn object_too_large(doing: &str, limit: u64, setting: &str) -> Error {
    Error::too_large(format!(
        "{doing}: an object is larger than the limit of {limit} bytes {setting}; it was not unpacked"
    ))
    .with_details(serde_json::json!({ "limit": limit }))
}

pub(crate) fn upstream(url: &str, e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    // The server's "not our ref" and friends: the commit is not there.
    let missing = [
        "not our ref",
        "not found",
        "could not find",
        "couldn't find",
    ]
    .iter()
    .any(|m| text.to_lowercase().contains(m));
    let code = if missing {
        Code::NotFound
    } else {
        Code::Upstream
    };
    Error::new(code, format!("fetching {url}: {text}"))
        .with_details(serde_json::json!({ "url": url, "retryable": code == Code::Upstream }))
}

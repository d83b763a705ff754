//! The one error type of Cloud Harness: a stable code with an HTTP-like status, a message for
//! people and structured details for programs (MCP clients read them to correct themselves).

pub mod failpoint;

use serde::Serialize;
use std::fmt;
use std::path::Path;

/// Stable error codes. Their names and statuses are part of the public interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    InvalidArgument,
    /// No credentials, or ones that are unknown, expired or revoked.
    Unauthenticated,
    Forbidden,
    NotFound,
    Conflict,
    TooLarge,
    Internal,
    Upstream,
    Timeout,
    /// Stopped because someone asked (an import job cancelled).
    Cancelled,
    /// A quota of the caller's is used up: the details name the limit, its value and when
    /// to try again.
    ResourceExhausted,
    /// A pinned commit no branch or tag of its repository reaches (one pushed only to a
    /// fork, served by its id all the same): refused unless an operator allowed it.
    CommitNotInRepository,
}

impl Code {
    pub const ALL: [Code; 12] = [
        Code::InvalidArgument,
        Code::Unauthenticated,
        Code::Forbidden,
        Code::NotFound,
        Code::Conflict,
        Code::TooLarge,
        Code::Internal,
        Code::Upstream,
        Code::Timeout,
        Code::Cancelled,
        Code::ResourceExhausted,
        Code::CommitNotInRepository,
    ];

    /// The code named `name` (as [`Code::as_str`] writes it).
    pub fn parse(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::Forbidden => "FORBIDDEN",
            Code::NotFound => "NOT_FOUND",
            Code::Conflict => "CONFLICT",
            Code::TooLarge => "TOO_LARGE",
            Code::Internal => "INTERNAL",
            Code::Upstream => "UPSTREAM",
            Code::Timeout => "TIMEOUT",
            Code::Cancelled => "CANCELLED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::CommitNotInRepository => "COMMIT_NOT_IN_REPOSITORY",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            Code::InvalidArgument => 400,
            Code::Unauthenticated => 401,
            Code::Forbidden => 403,
            Code::NotFound => 404,
            Code::Conflict => 409,
            Code::TooLarge => 413,
            Code::Internal => 500,
            Code::Upstream => 502,
            Code::Timeout => 504,
            // As nginx answers a request its client gave up on.
            Code::Cancelled => 499,
            Code::ResourceExhausted => 429,
            // A refusal by policy, as FORBIDDEN.
            Code::CommitNotInRepository => 403,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, thiserror::Error, Serialize)]
#[error("{code}: {message}")]
pub struct Error {
    pub code: Code,
    pub status: u16,
    pub message: String,
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub details: serde_json::Value,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The HTTP status of a full disk (RESOURCE_EXHAUSTED that is no quota of the caller's).
pub const INSUFFICIENT_STORAGE: u16 = 507;

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            status: code.status(),
            message: message.into(),
            details: serde_json::Value::Null,
        }
    }

    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = details;
        self
    }

    /// The same error, its message led by `what` (where it was met): its code, status (a full
    /// disk's 507) and details kept.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// A full disk or quota (RESOURCE_EXHAUSTED with 507), not a budget or limit of a caller's.
    pub fn is_full_disk(&self) -> bool {
        self.code == Code::ResourceExhausted && self.status == INSUFFICIENT_STORAGE
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(Code::NotFound, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Error::new(Code::Conflict, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Error::new(Code::TooLarge, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(Code::Internal, message)
    }

    /// Bad input in one named field: the message and the details both name it, so a client
    /// can point at what to correct.
    pub fn field(code: Code, field: &str, what: impl fmt::Display) -> Self {
        Error::new(code, format!("{field}: {what}"))
            .with_details(serde_json::json!({ "field": field }))
    }

    /// An I/O failure on `path`, classified: a missing file is NOT_FOUND, a symlink loop or a
    /// name that is too long is INVALID_ARGUMENT (bad input), anything else INTERNAL.
    pub fn io(path: &Path, err: std::io::Error) -> Self {
        // Out of space or quota, or a device that fails: the condition is named, for a caller
        // (and an operator) to tell a full disk from a bug; a full disk is worth retrying once
        // space returns.
        let condition = match err.raw_os_error() {
            Some(e) if e == nix::libc::ENOSPC => Some("ENOSPC"),
            Some(e) if e == nix::libc::EDQUOT => Some("EDQUOT"),
            Some(e) if e == nix::libc::EIO => Some("EIO"),
            _ => None,
        };
        if let Some(condition) = condition {
            let (code, what) = match condition {
                "EIO" => (Code::Internal, "the device failed (EIO)"),
                "EDQUOT" => (Code::ResourceExhausted, "over the disk quota (EDQUOT)"),
                _ => (
                    Code::ResourceExhausted,
                    "no space left on the device (ENOSPC)",
                ),
            };
            let mut e = Error::new(code, format!("{}: {what}", path.display())).with_details(
                serde_json::json!({
                    "path": path.to_string_lossy(),
                    "condition": condition,
                    "retryable": condition != "EIO",
                }),
            );
            if code == Code::ResourceExhausted {
                e.status = INSUFFICIENT_STORAGE;
            }
            return e;
        }
        let code = match err.kind() {
            std::io::ErrorKind::NotFound => Code::NotFound,
            std::io::ErrorKind::PermissionDenied => Code::Forbidden,
            // In use or being changed meanwhile (a mount inside a tree being removed, a writer
            // racing the removal): the state of the thing, not the server, stands in the way.
            std::io::ErrorKind::ResourceBusy => Code::Conflict,
            _ => match err.raw_os_error() {
                Some(libc_eloop) if libc_eloop == nix::libc::ELOOP => Code::InvalidArgument,
                Some(e) if e == nix::libc::ENAMETOOLONG || e == nix::libc::ENOTDIR => {
                    Code::InvalidArgument
                }
                _ => Code::Internal,
            },
        };
        Error::new(code, format!("{}: {err}", path.display()))
            .with_details(serde_json::json!({ "path": path.to_string_lossy() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_keeps_its_507_and_details_through_context() {
        let full = Error::io(
            Path::new("/store/tmp/x"),
            std::io::Error::from_raw_os_error(nix::libc::ENOSPC),
        );
        let e = full.context("skills/a.md");
        assert_eq!((e.code, e.status), (Code::ResourceExhausted, 507));
        assert!(e.is_full_disk());
        assert_eq!(e.details["condition"], "ENOSPC");
        assert!(
            e.message
                .starts_with("skills/a.md: /store/tmp/x: no space left"),
            "{}",
            e.message
        );
        // A caller's own limit is no full disk.
        assert!(!Error::new(Code::ResourceExhausted, "over budget").is_full_disk());
    }
}

//! A workspace that could not be served again after a restart (its restore failed, or is
//! still running): why, in words that name no path of the host, and what calls on it get.

use super::record::Record;
use cloud_harness_error::Error;
use cloud_harness_store::cas::Digest;
use serde_json::{json, Value};
use std::path::Path;

/// A workspace that could not be served again after a restart.
#[derive(Debug, Clone)]
pub struct Failure {
    pub id: String,
    /// Why, naming no path of the host.
    pub reason: String,
    /// Its restore is still running, past the time start-up waited: it is served if that
    /// ends well.
    pub restoring: bool,
    /// It was being closed, and that did not finish (its tree or key could not be removed):
    /// a second close finishes the work.
    pub closing: bool,
    /// Its record, when it could be read.
    pub record: Option<Record>,
}

impl Failure {
    /// The principal that opened it, when its record could be read (else operators only
    /// reach it).
    pub fn owner(&self) -> &str {
        self.record.as_ref().map_or("", |r| r.owner.as_str())
    }

    pub fn state(&self) -> &'static str {
        match self.restoring {
            true => "restoring",
            false => "failed",
        }
    }

    /// What a call on the workspace gets.
    pub fn error(&self) -> Error {
        let message = match self.restoring {
            false if self.closing => format!(
                "workspace {} was being closed and that did not finish: {}; close it again with workspace_close",
                self.id, self.reason
            ),
            true => format!(
                "workspace {} is still being restored after the server restarted ({}); ask again later, or close it with workspace_close",
                self.id, self.reason
            ),
            false => format!(
                "workspace {} could not be restored after the server restarted: {}; close it with workspace_close, which removes it and frees its idempotency key",
                self.id, self.reason
            ),
        };
        Error::conflict(message).with_details(json!({
            "workspace": self.id,
            "state": self.state(),
            "reason": self.reason,
        }))
    }

    /// What an open with its idempotency `key` gets (asking for `digest`).
    pub(super) fn key_taken(&self, key: &str, digest: &Digest) -> Error {
        let details =
            json!({ "field": "idempotencyKey", "workspace": self.id, "state": self.state() });
        if self
            .record
            .as_ref()
            .is_some_and(|r| r.request_digest != *digest)
        {
            return Error::conflict(format!(
                "idempotencyKey {key:?} was used for a different request (workspace {}); use a new key for a new request",
                self.id
            ))
            .with_details(details);
        }
        let message = match self.restoring {
            false if self.closing => format!(
                "workspace {} was being closed and that did not finish: {}; close it again with workspace_close",
                self.id, self.reason
            ),
            true => format!(
                "idempotencyKey {key:?} belongs to workspace {}, which is still being restored after the server restarted; ask again later",
                self.id
            ),
            false => format!(
                "idempotencyKey {key:?} belongs to workspace {}, which could not be served again after a restart ({}); close it with workspace_close to free the key",
                self.id, self.reason
            ),
        };
        Error::conflict(message).with_details(details)
    }

    /// What the API's list of workspaces shows of it.
    pub fn summary(&self) -> Value {
        json!({
            "workspace": self.id,
            "owner": self.owner(),
            "state": self.state(),
            "reason": self.reason,
            "idempotencyKey": self.record.as_ref().map(|r| r.idempotency_key.clone()),
            "createdAt": self.record.as_ref().map(|r| r.created_at),
        })
    }
}

/// Why a restore failed, as callers may read it: the host's paths (the workspace's folder,
/// the home, the store) replaced by what they are, as given and as they really are (a home
/// reached through a link is named by its real path in what the file system says).
pub(super) fn without_host_paths(e: &Error, dir: &Path, home: &Path, store: &Path) -> String {
    let mut said = format!("{}: {}", e.code, e.message);
    let mut places = Vec::new();
    for (path, name) in [
        (dir.join("repo"), "the project"),
        (dir.to_path_buf(), "the workspace's folder"),
        (home.to_path_buf(), "the server's home"),
        (store.to_path_buf(), "the store"),
    ] {
        if let Ok(real) = path.canonicalize() {
            places.push((real, name));
        }
        places.push((path, name));
    }
    // The longest first: a path inside another is named whole.
    places.sort_by_key(|(path, _)| std::cmp::Reverse(path.as_os_str().len()));
    for (path, name) in places {
        let path = path.to_string_lossy().into_owned();
        if !path.is_empty() {
            said = said
                .replace(&format!("{path}/"), &format!("{name}'s "))
                .replace(&path, name);
        }
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_says_why_and_names_no_host_path() {
        let f = Failure {
            id: "ws_0123".into(),
            reason: "FORBIDDEN: the project's .agents/skills is a link".into(),
            restoring: false,
            closing: false,
            record: None,
        };
        let e = f.error();
        assert_eq!(e.code, cloud_harness_error::Code::Conflict);
        assert!(e.message.contains("could not be restored"), "{e}");
        assert!(e.message.contains(".agents/skills is a link"), "{e}");
        assert_eq!(e.details["state"], "failed");
        assert_eq!(f.summary()["reason"], f.reason);
    }

    #[test]
    fn reasons_name_the_project_not_the_host() {
        let home = Path::new("/srv/harness/home");
        let dir = home.join("workspaces/ws_1");
        let e = Error::io(
            &dir.join("repo/.agents/skills/x"),
            std::io::Error::from_raw_os_error(nix::libc::EACCES),
        );
        let said = without_host_paths(&e, &dir, home, Path::new("/srv/store"));
        assert!(
            said.starts_with("FORBIDDEN: the project's .agents/skills/x: "),
            "{said}"
        );
        let e = Error::internal(format!(
            "{}/state.db and /srv/store/objects",
            home.display()
        ));
        let said = without_host_paths(&e, &dir, home, Path::new("/srv/store"));
        assert_eq!(
            said,
            "INTERNAL: the server's home's state.db and the store's objects"
        );
    }

    #[test]
    fn reasons_name_no_real_path_of_a_home_reached_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("disk/harness");
        let dir = real.join("home/workspaces/ws_1");
        std::fs::create_dir_all(dir.join("repo")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("disk"), tmp.path().join("link")).unwrap();
        let home = tmp.path().join("link/harness/home");
        let dir = home.join("workspaces/ws_1");
        // What the file system said: the real path of the project's folder.
        let e = Error::io(
            &real.join("home/workspaces/ws_1/repo/.agents/skills/x"),
            std::io::Error::from_raw_os_error(nix::libc::EACCES),
        );
        let said = without_host_paths(&e, &dir, &home, &tmp.path().join("link/store"));
        assert!(
            said.starts_with("FORBIDDEN: the project's .agents/skills/x: "),
            "{said}"
        );
        assert!(!said.contains(tmp.path().to_str().unwrap()), "{said}");
    }
}

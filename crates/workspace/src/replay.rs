//! A request whose idempotency key is bound already: answered with the workspace it opened,
//! or refused as it stands (another request, another runner, still opening, not served).

use super::{keys, Workspaces};
use cloud_harness_error::{Error, Result};
use cloud_harness_store::cas::Digest;
use serde_json::{json, Value};

impl Workspaces {
    /// The answer to a request whose key is bound already: the workspace it opened, if the
    /// request is the same.
    pub(super) fn replay(&self, key: &str, bound: keys::Bound, digest: Digest) -> Result<Value> {
        let keys::Bound {
            digest: existing_digest,
            workspace,
            opening,
            runner,
        } = bound;
        if existing_digest != digest {
            return Err(Error::conflict(format!(
                "idempotencyKey {key:?} was used for a different request (workspace {workspace}); use a new key for a new request"
            ))
            .with_details(json!({ "field": "idempotencyKey", "workspace": workspace })));
        }
        if runner != self.db.runner() {
            // A fleet shares one database: the workspace is on another runner's disk.
            return Err(Error::conflict(format!(
                "idempotencyKey {key:?} belongs to workspace {workspace} on runner {runner}; send the request to that runner"
            ))
            .with_details(json!({ "field": "idempotencyKey", "workspace": workspace, "runner": runner })));
        }
        if opening {
            return Err(Error::conflict(format!(
                "idempotencyKey {key:?} is opening workspace {workspace} in another process; ask again when it is done"
            ))
            .with_details(json!({ "field": "idempotencyKey", "workspace": workspace })));
        }
        // One key owns at most one workspace: one that could not be served again after a
        // restart keeps its key until it is closed.
        match self.get(&workspace) {
            // The same answer again, mounts and all: a paused workspace resumes first.
            Ok(ws) => self.used(&ws).map(|()| ws.record.result.clone()),
            Err(_) => {
                let why = self
                    .failure(&workspace)
                    .map_or("the server's log says why".to_owned(), |f| f.reason);
                Err(Error::conflict(format!(
                    "idempotencyKey {key:?} belongs to workspace {workspace}, which could not be served again after a restart ({why}); close it with workspace_close to free the key"
                ))
                .with_details(json!({ "field": "idempotencyKey", "workspace": workspace })))
            }
        }
    }
}

//! Removing a workspace that is not served — one whose restore failed or is still running,
//! one whose close did not finish, or a folder left on disk: its executor, mounts, pins, tree
//! and idempotency key, whatever of them is still there.

use super::{keys, mounts, record, roots, Failure, Record, Workspaces};
use cloud_harness_error::{Error, Result};
use cloud_harness_executor::{self as executor, Executor, Kind, Places};
use serde_json::{json, Value};

impl Workspaces {
    /// Closes a workspace that has a record but is not served (its restore failed, or is
    /// still running): its executor, roots, mounts and folder go, and its key is free.
    pub(super) fn discard(&self, id: &str) -> Result<Value> {
        record::check_id(id)?;
        // Taken first: a restore that ends after this finds it closed, and undoes its work.
        let failure = self.failed.lock().expect("failed lock").remove(id);
        let removed = self.remove_unserved(id, failure.as_ref());
        if removed.is_err() {
            if let Some(f) = failure {
                self.failed
                    .lock()
                    .expect("failed lock")
                    .insert(id.to_owned(), f);
            }
        }
        removed
    }

    fn remove_unserved(&self, id: &str, failure: Option<&Failure>) -> Result<Value> {
        let dir = record::workspaces_dir(&self.home).join(id);
        let record = match Record::find(&self.home, id) {
            Ok((_, r)) => Some(r),
            Err(e) if failure.is_none() => return Err(e),
            // Unreadable, or gone: what the failure kept of it, if anything.
            Err(_) => failure.and_then(|f| f.record.clone()),
        };
        let places = Places::of(&dir);
        match record.and_then(|r| r.executor) {
            Some(spec) => Executor::attach(spec, places.clone(), id).remove()?,
            None if self.executor_kind == Some(Kind::Docker) => {
                executor::docker::remove_by_dir(&dir)?
            }
            None => {}
        }
        mounts::clear(&places.mounts);
        mounts::unshare(&places.mounts);
        roots::unpin(self.store(), id)?;
        match cloud_harness_store::removal::remove_tree(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(&dir, e));
            }
            _ => {}
        }
        keys::release(&self.db, id)?;
        Ok(json!({ "workspace": id, "closed": true }))
    }
}

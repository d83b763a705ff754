//! Sessions bound to workspaces: a session that opened or used a workspace is told when what
//! the workspace serves changes (a live tier's new generation), with
//! `notifications/resources/list_changed`, until the workspace closes or the session ends.
//!
//! One task per binding, which ends with whichever goes first: the workspace (its sender
//! goes) or the session's server (the last clone of its `Bound` is dropped). A server made
//! for one stateless request is dropped when it is answered, so a client calling in a loop
//! leaves nothing behind.

use cloud_harness_workspace::Workspace;
use rmcp::{Peer, RoleServer};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The workspaces one session is bound to.
#[derive(Clone, Default)]
pub struct Bound(Arc<Inner>);

#[derive(Default)]
struct Inner {
    ids: Mutex<HashSet<String>>,
    ended: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ended.cancel();
    }
}

impl Bound {
    /// Binds the session of `peer` to `ws` (once; later calls do nothing).
    pub fn bind(&self, ws: &Workspace, peer: &Peer<RoleServer>) {
        if !self.0.ids.lock().expect("bound lock").insert(ws.id.clone()) {
            return;
        }
        let mut changes = ws.changes();
        let peer = peer.clone();
        let ended = self.0.ended.clone();
        // Weak: the task must not keep the session's bindings alive.
        let inner = Arc::downgrade(&self.0);
        let id = ws.id.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = ended.cancelled() => return,
                    changed = changes.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        if peer.notify_resource_list_changed().await.is_err() {
                            break;
                        }
                    }
                }
            }
            // The workspace closed (or the session stopped listening): forget it, so a
            // long session that opens and closes many workspaces keeps no list of them.
            if let Some(inner) = inner.upgrade() {
                inner.ids.lock().expect("bound lock").remove(&id);
            }
        });
    }
}

//! Sessions bound to workspaces: a session that opened or used a workspace is told when what
//! the workspace serves changes (a live tier's new generation), with
//! `notifications/resources/list_changed`, until the workspace closes or the session ends.

use crate::workspace::Workspace;
use rmcp::{Peer, RoleServer};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The workspaces one session is bound to.
#[derive(Clone, Default)]
pub struct Bound(Arc<Mutex<HashSet<String>>>);

impl Bound {
    /// Binds the session of `peer` to `ws` (once; later calls do nothing).
    pub fn bind(&self, ws: &Workspace, peer: &Peer<RoleServer>) {
        if !self.0.lock().expect("bound lock").insert(ws.id.clone()) {
            return;
        }
        let mut changes = ws.changes();
        let peer = peer.clone();
        tokio::spawn(async move {
            // Ends when the workspace closes (its sender goes) or the session does.
            while changes.changed().await.is_ok() {
                if peer.notify_resource_list_changed().await.is_err() {
                    break;
                }
            }
        });
    }
}

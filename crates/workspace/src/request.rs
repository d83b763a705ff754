//! A `workspace_open` request: validated, and digested so that the same key with the same
//! request can be recognized.

use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_control::presets::registry::Registry;
use cloud_harness_control::toolkit::{self, ToolkitSpec};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::Digest;
use serde_json::json;

/// A validated `workspace_open` request.
#[derive(Debug, Clone)]
pub struct OpenRequest {
    pub repository_url: Option<String>,
    pub idempotency_key: String,
    pub toolkits: Vec<ToolkitSpec>,
    pub allow_toolkit_workspace_changes: bool,
    /// Whether the workspace may pause when idle (`pause`); true unless the caller says not
    /// (something uses its executor or mounts directly, where a pause would show empty
    /// skill folders).
    pub idle_pause: bool,
}

impl OpenRequest {
    /// The request as `workspace_open` took it (what a launch-conflict record keeps).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "idempotencyKey": self.idempotency_key,
            "repositoryUrl": self.repository_url,
            "toolkits": self.toolkits,
            "allowToolkitWorkspaceChanges": self.allow_toolkit_workspace_changes,
            "idlePause": self.idle_pause,
        })
    }
}

/// An idempotency key: 1-200 characters, none of them control characters.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.chars().count() > 200 || key.chars().any(char::is_control) {
        return Err(Error::field(
            Code::InvalidArgument,
            "idempotencyKey",
            "must be 1-200 characters, none of them control characters",
        ));
    }
    Ok(())
}

/// How the digest names each of the request's toolkits: a set as asked (its id and the
/// revision or label asked for: its members may change, the request stays the same), a preset
/// named by a label as asked (the label may move), any other toolkit as it resolves (defaults
/// filled in). No label is looked up, so a request is recognized even once its label is gone.
pub fn digest_forms(
    specs: &[ToolkitSpec],
    hosts: &HostPolicy,
    registry: &Registry,
) -> Result<Vec<serde_json::Value>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| match spec {
            ToolkitSpec::Set(s) => Ok(match &s.label {
                Some(label) => json!({ "set": s.id, "label": label }),
                None => json!({ "set": s.id, "revision": s.revision }),
            }),
            ToolkitSpec::Preset(p) if p.label.is_some() => {
                Ok(serde_json::to_value(spec).expect("specs serialize"))
            }
            other => other
                .resolve_in(hosts, registry)
                .map(|t| serde_json::to_value(&t).expect("toolkits serialize"))
                .map_err(|e| toolkit::in_request(e, i)),
        })
        .collect()
}

/// What makes two requests "the same": every field but the key, with the toolkits in their
/// [`digest_forms`].
pub fn request_digest(request: &OpenRequest, toolkits: &[serde_json::Value]) -> Digest {
    let mut canonical = json!({
        "repositoryUrl": request.repository_url,
        "toolkits": toolkits,
        "allowToolkitWorkspaceChanges": request.allow_toolkit_workspace_changes,
    });
    // Only when not the default: requests from before the choice existed keep their digest.
    if !request.idle_pause {
        canonical["idlePause"] = json!(false);
    }
    Digest::of(&serde_json::to_vec(&canonical).expect("requests serialize"))
}

//! The tools' descriptions and input schemas, as `tools/list` returns them. Flat objects
//! without `$ref`, so every client's schema handling accepts them.

use super::call::MAX_PAGE;
use crate::runner;
use rmcp::model::{JsonObject, Tool};
use serde_json::{json, Value};
use std::sync::Arc;

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("schemas are objects"),
    }
}

/// The tools, built once: their schemas never change.
pub fn tools() -> &'static [Tool] {
    static TOOLS: std::sync::LazyLock<Vec<Tool>> = std::sync::LazyLock::new(build_tools);
    &TOOLS
}

fn build_tools() -> Vec<Tool> {
    let workspace =
        json!({ "type": "string", "description": "The handle workspace_open returned." });
    let toolkit = json!({
        "type": "object",
        "description": "A preset {kind: \"preset\", id, scope?, version?} or a git toolkit {kind: \"git\", instanceId, url, ref?, scope?, subdirectory?, layout?, skills?}.",
        "properties": {
            "kind": { "type": "string", "enum": ["preset", "git"] },
            "id": { "type": "string", "description": "preset: its id, e.g. obra/superpowers" },
            "version": { "type": "string", "description": "preset: a commit id or a tag; absent: the default branch head" },
            "instanceId": { "type": "string", "description": "git: 1-80 letters, digits, - and _" },
            "url": { "type": "string", "description": "git: an HTTPS URL on the allowed hosts" },
            "ref": { "type": "string", "description": "git: an exact commit id (40 or 64 hex); absent: the default branch head" },
            "scope": { "type": "string", "enum": ["owner", "workspace"] },
            "subdirectory": { "type": "string" },
            "layout": {
                "type": "object",
                "properties": {
                    "skillRoots": { "type": "array", "items": { "type": "string" } },
                    "recursive": { "type": "boolean" },
                    "pluginManifest": { "type": "boolean", "description": "install only the skills the toolkit's .claude-plugin manifest lists" }
                }
            },
            "skills": {
                "type": "object",
                "properties": {
                    "include": { "type": "array", "items": { "type": "string" } },
                    "exclude": { "type": "array", "items": { "type": "string" } }
                }
            }
        },
        "required": ["kind"]
    });
    vec![
        Tool::new(
            "workspace_open",
            "Open a workspace: fetch the project repository into a new working tree, install the toolkits, mount the resolved skills, and make the workspace's executor, a sandbox where /workspace is the working tree and the skills are read-only at /opt/cloud-harness/skills. Idempotent by idempotencyKey.",
            schema(json!({
                "type": "object",
                "properties": {
                    "repositoryUrl": { "type": "string", "description": "HTTPS URL of the project repository (optional: without it the working tree starts empty)" },
                    "idempotencyKey": { "type": "string", "description": "The same key with the same request returns the same workspace" },
                    "toolkits": { "type": "array", "items": toolkit },
                    "allowToolkitWorkspaceChanges": { "type": "boolean", "description": "Required for toolkits of scope workspace, which write into .cloud-harness/skills/" }
                },
                "required": ["idempotencyKey"],
                "additionalProperties": false
            })),
        ),
        Tool::new(
            "workspace_close",
            "Close a workspace: unmount its skills and release its working tree. The store keeps the toolkits.",
            schema(json!({
                "type": "object",
                "properties": { "workspace": workspace },
                "required": ["workspace"],
                "additionalProperties": false
            })),
        ),
        Tool::new(
            "skills_list",
            "List the skills of a workspace (or of one tier) with their tier, toolkit and digest, and the copies they shadow.",
            schema(json!({
                "type": "object",
                "properties": {
                    "workspace": workspace,
                    "tier": { "type": "string", "enum": ["builtin", "owner", "workspace", "repository"] },
                    "includeShadowed": { "type": "boolean" }
                },
                "required": ["workspace"],
                "additionalProperties": false
            })),
        ),
        Tool::new(
            "skills_read",
            "Read a file of a skill (default SKILL.md), as agents see it on the skills mount. Large files come in pages: pass nextOffset back as offset.",
            schema(json!({
                "type": "object",
                "properties": {
                    "workspace": workspace,
                    "skill": { "type": "string" },
                    "path": { "type": "string", "description": "Relative to the skill folder; default SKILL.md" },
                    "offset": { "type": "integer", "minimum": 0 },
                    "length": { "type": "integer", "minimum": 1, "maximum": MAX_PAGE }
                },
                "required": ["workspace", "skill"],
                "additionalProperties": false
            })),
        ),
        Tool::new(
            "skills_run",
            "Run a script of a skill in the workspace's executor (a sandbox: cwd /workspace, the skill's approved files read-only, interpreter from its shebang or extension, clean environment, timeout, capped output). Only skills an operator approved may run.",
            schema(json!({
                "type": "object",
                "properties": {
                    "workspace": workspace,
                    "skill": { "type": "string" },
                    "script": { "type": "string", "description": "Relative to the skill folder, e.g. scripts/check.sh" },
                    "args": { "type": "array", "items": { "type": "string" } },
                    "timeoutSeconds": { "type": "integer", "minimum": 1, "maximum": runner::MAX_TIMEOUT.as_secs() }
                },
                "required": ["workspace", "skill", "script"],
                "additionalProperties": false
            })),
        ),
    ]
}

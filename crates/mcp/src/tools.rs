//! The tools' descriptions and input schemas, as `tools/list` returns them. Flat objects
//! without `$ref`, so every client's schema handling accepts them.

use super::call::{MAX_ARG, MAX_ARGS, MAX_HANDLE, MAX_LIST, MAX_PAGE, MAX_SKILL};
use cloud_harness_control::toolkit::{
    MAX_NAME, MAX_PATH, MAX_PATTERN, MAX_PATTERNS, MAX_ROOTS, MAX_TOOLKITS, MAX_URL,
};
use cloud_harness_executor::runner;
use cloud_harness_workspace::MAX_SKILL_PATH;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
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
    static TOOLS: std::sync::LazyLock<Vec<Tool>> =
        std::sync::LazyLock::new(|| build_tools().into_iter().map(with_metadata).collect());
    &TOOLS
}

/// A tool's title, its behaviour hints and the shape of its result (`structuredContent` of a
/// success; a failure has `{code, status, message, details}`).
fn with_metadata(tool: Tool) -> Tool {
    let string = json!({ "type": "string" });
    let array = json!({ "type": "array" });
    let object = |required: &[&str], properties: Value| {
        schema(json!({ "type": "object", "required": required, "properties": properties }))
    };
    // (title, read-only, destructive, idempotent, open world, result)
    let (title, read_only, destructive, idempotent, open_world, output) = match &*tool.name {
        "workspace_open" => (
            "Open a workspace",
            false,
            false,
            true, // by idempotencyKey
            true, // fetches repositories
            object(
                &["workspace", "generation", "toolkits", "skills", "warnings"],
                json!({ "workspace": string, "generation": string, "toolkits": array, "skills": array, "shadowed": array, "conflicts": array, "skipped": array, "warnings": array }),
            ),
        ),
        "workspace_close" => (
            "Close a workspace",
            false,
            true, // the working tree goes
            true,
            false,
            object(
                &["workspace", "closed"],
                json!({ "workspace": string, "closed": { "type": "boolean" } }),
            ),
        ),
        "skills_list" => (
            "List skills",
            true,
            false,
            true,
            false,
            object(
                &["workspace", "generation", "count", "skills", "conflicts"],
                json!({ "workspace": string, "generation": string, "count": { "type": "integer" }, "skills": array, "conflicts": array, "skipped": array, "nextCursor": string }),
            ),
        ),
        "skills_read" => (
            "Read a skill's file",
            true,
            false,
            true,
            false,
            object(
                &[
                    "skill", "path", "size", "offset", "length", "encoding", "content", "eof",
                ],
                json!({ "skill": string, "path": string, "size": { "type": "integer" }, "offset": { "type": "integer" }, "length": { "type": "integer" }, "encoding": { "type": "string", "enum": ["utf-8", "base64"] }, "content": string, "eof": { "type": "boolean" }, "nextOffset": { "type": "integer" } }),
            ),
        ),
        _ => (
            "Run a skill's script",
            false,
            true, // a script may change the working tree
            false,
            true, // with executor egress, it reaches allowed hosts
            object(
                &["command", "timedOut", "cancelled", "stdout", "stderr"],
                json!({ "command": array, "exitCode": { "type": "integer" }, "timedOut": { "type": "boolean" }, "cancelled": { "type": "boolean" }, "stdout": string, "stderr": string }),
            ),
        ),
    };
    let mut hints = ToolAnnotations::new();
    hints.read_only_hint = Some(read_only);
    hints.destructive_hint = Some(destructive);
    hints.idempotent_hint = Some(idempotent);
    hints.open_world_hint = Some(open_world);
    tool.with_title(title)
        .with_annotations(hints)
        .with_raw_output_schema(output)
}

fn build_tools() -> Vec<Tool> {
    let workspace = json!({ "type": "string", "maxLength": MAX_HANDLE, "description": "The handle workspace_open returned." });
    let skill = json!({ "type": "string", "minLength": 1, "maxLength": MAX_SKILL, "description": "A skill's name, as skills_list shows it." });
    let patterns = json!({ "type": "array", "maxItems": MAX_PATTERNS, "items": { "type": "string", "maxLength": MAX_PATTERN } });
    let toolkit = json!({
        "type": "object",
        "description": "A preset {kind: \"preset\", id, scope?, version? | label?}, a git toolkit {kind: \"git\", instanceId, url, ref?, scope?, subdirectory?, layout?, skills?}, or a skill set {kind: \"set\", id, revision? | label?} (its members, as an operator defined them).",
        "properties": {
            "kind": { "type": "string", "enum": ["preset", "git", "set"] },
            "id": { "type": "string", "maxLength": MAX_NAME, "description": "preset: its id, e.g. obra/superpowers; set: its id" },
            "revision": { "type": "integer", "minimum": 1, "description": "set: a revision; absent: its latest" },
            "version": { "type": "string", "maxLength": MAX_NAME, "description": "preset: a commit id or a tag; absent: the default branch head" },
            "label": { "type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$", "maxLength": 64, "description": "preset or set: a version label an operator set (e.g. stable), in place of version or revision; the result names the commit or revision it gave" },
            "instanceId": { "type": "string", "pattern": "^[A-Za-z0-9_-]{1,80}$", "maxLength": 80, "description": "git: 1-80 letters, digits, - and _" },
            "url": { "type": "string", "maxLength": MAX_URL, "description": "git: an HTTPS URL on the allowed hosts" },
            "ref": { "type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$", "maxLength": 64, "description": "git: an exact commit id (40 or 64 hex); absent: the default branch head" },
            "scope": { "type": "string", "enum": ["owner", "workspace"] },
            "subdirectory": { "type": "string", "maxLength": MAX_PATH },
            "layout": {
                "type": "object",
                "properties": {
                    "skillRoots": { "type": "array", "maxItems": MAX_ROOTS, "items": { "type": "string", "maxLength": MAX_PATH } },
                    "recursive": { "type": "boolean" },
                    "pluginManifest": { "type": "boolean", "description": "install only the skills the toolkit's .claude-plugin manifest lists" }
                }
            },
            "skills": {
                "type": "object",
                "properties": {
                    "include": patterns,
                    "exclude": patterns,
                    "validation": { "type": "string", "enum": ["warn", "refuse"], "description": "skills that break the Agent Skills specification: served with their problems (warn, the default) or not served (refuse)" }
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
                    "repositoryUrl": { "type": "string", "maxLength": MAX_URL, "description": "HTTPS URL of the project repository (optional: without it the working tree starts empty)" },
                    "idempotencyKey": { "type": "string", "minLength": 1, "maxLength": 200, "description": "The same key with the same request returns the same workspace (1-200 characters, no control characters)" },
                    "toolkits": { "type": "array", "maxItems": MAX_TOOLKITS, "items": toolkit },
                    "allowToolkitWorkspaceChanges": { "type": "boolean", "description": "Required for toolkits of scope workspace, which write into .cloud-harness/skills/" },
                    "idlePause": { "type": "boolean", "default": true, "description": "Whether the workspace may pause when idle (it lets go of its mounts and bubblewrap sandbox, and takes them back at the next call that names it); false for a workspace whose executor or mounts are used directly" }
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
            "List the skills of a workspace (or of one tier) with their tier, toolkit and digest, the rules of the Agent Skills specification each breaks (problems), and the copies they shadow; the first page also lists the skills left out (skipped), each with its reason.",
            schema(json!({
                "type": "object",
                "properties": {
                    "workspace": workspace,
                    "tier": { "type": "string", "enum": ["builtin", "owner", "workspace", "repository"] },
                    "includeShadowed": { "type": "boolean" },
                    "cursor": { "type": "string", "maxLength": 1024, "description": "nextCursor of the previous page" },
                    "limit": { "type": "integer", "minimum": 1, "maximum": MAX_LIST, "description": "Skills per page (default 100, at most 1000)" }
                },
                "required": ["workspace"],
                "additionalProperties": false
            })),
        ),
        Tool::new(
            "skills_read",
            "Read a file of a skill (default SKILL.md), as agents see it on the skills mount; with SKILL.md, what the skill breaks of the Agent Skills specification (problems). Large files come in pages: pass nextOffset back as offset.",
            schema(json!({
                "type": "object",
                "properties": {
                    "workspace": workspace,
                    "skill": skill,
                    "path": { "type": "string", "maxLength": MAX_SKILL_PATH, "description": "Relative to the skill folder; default SKILL.md" },
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
                    "skill": skill,
                    "script": { "type": "string", "maxLength": MAX_SKILL_PATH, "description": "Relative to the skill folder, e.g. scripts/check.sh" },
                    "args": { "type": "array", "maxItems": MAX_ARGS, "items": { "type": "string", "maxLength": MAX_ARG } },
                    "timeoutSeconds": { "type": "integer", "minimum": 1, "maximum": runner::MAX_TIMEOUT.as_secs() }
                },
                "required": ["workspace", "skill", "script"],
                "additionalProperties": false
            })),
        ),
    ]
}

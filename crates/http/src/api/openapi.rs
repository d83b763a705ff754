//! `GET /api/v1/openapi.json`: the API described (OpenAPI 3.1).

use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

fn error_responses() -> Value {
    let e = json!({ "description": "an error", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } });
    // 413: a body past 64 KiB; 429: a quota of the caller's (with `Retry-After`); 503: the
    // server is stopping; 507: a disk of the server's is full.
    json!({ "400": e, "401": e, "403": e, "404": e, "409": e, "413": e, "429": e, "500": e, "503": e, "507": e })
}

fn op(summary: &str, body: Option<&str>, ok: &str, query: &[(&str, &str)]) -> Value {
    let mut responses = error_responses();
    responses[ok] = json!({ "description": "done", "content": { "application/json": { "schema": { "type": "object" } } } });
    let mut v = json!({ "summary": summary, "responses": responses });
    if let Some(schema) = body {
        v["requestBody"] = json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } });
    }
    let parameters: Vec<Value> = query
        .iter()
        .map(|(name, ty)| json!({ "name": name, "in": "query", "required": false, "schema": { "type": ty } }))
        .collect();
    v["parameters"] = json!(parameters);
    v
}

/// Declares every `{segment}` of each path as a path parameter of its operations.
fn with_path_parameters(mut spec: Value) -> Value {
    let Some(paths) = spec["paths"].as_object_mut() else {
        return spec;
    };
    for (path, ops) in paths.iter_mut() {
        let names: Vec<&str> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .collect();
        for op in ops.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
            let params = op["parameters"]
                .as_array_mut()
                .expect("every operation has parameters");
            for name in &names {
                params.push(json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }));
            }
        }
    }
    spec
}

pub fn spec() -> Value {
    let mut doc = the_rest();
    let paths = doc["paths"]
        .as_object_mut()
        .expect("the paths are an object");
    for (path, item) in usage_paths()
        .as_object()
        .expect("an object")
        .iter()
        .chain(label_paths().as_object().expect("an object"))
    {
        paths.insert(path.clone(), item.clone());
    }
    let commit = json!({ "type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$" });
    let percent = json!({ "type": "integer", "minimum": 1, "maximum": 99, "description": "of the new workspaces, about this many in a hundred get the canary" });
    let reason = json!({ "type": "string", "minLength": 1, "maxLength": 1000 });
    let from = json!({ "type": "integer", "minimum": 0, "description": "the label's revision this move replaces, as seen (0: a new label): CONFLICT if it moved since" });
    doc["components"]["schemas"]["MoveEntryLabel"] = json!({
        "type": "object", "additionalProperties": false, "required": ["commit"],
        "properties": {
            "commit": commit,
            "canary": { "type": "object", "additionalProperties": false, "required": ["commit", "percent"], "properties": { "commit": commit, "percent": percent } },
            "reason": reason, "from": from
        }
    });
    doc["components"]["schemas"]["MoveSetLabel"] = json!({
        "type": "object", "additionalProperties": false, "required": ["revision"],
        "properties": {
            "revision": { "type": "integer", "minimum": 1 },
            "canary": { "type": "object", "additionalProperties": false, "required": ["revision", "percent"], "properties": { "revision": { "type": "integer", "minimum": 1 }, "percent": percent } },
            "reason": reason, "from": from
        }
    });
    doc["components"]["schemas"]["CompareRevisions"] = json!({
        "type": "object", "additionalProperties": false,
        "properties": { "from": { "type": "integer", "minimum": 1 }, "to": { "type": "integer", "minimum": 1 } }
    });
    doc["components"]["schemas"]["Compare"] = json!({
        "type": "object", "additionalProperties": false, "required": ["to"],
        "properties": {
            "to": { "type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$" },
            "from": { "type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$" }
        }
    });
    doc
}

/// The usage of skills (one `json!` for the whole document would pass the macro's
/// recursion limit).
fn usage_paths() -> Value {
    json!({
        "/api/v1/usage/skills": { "get": op("(operators) the skills used over the last `days` (1 to 400, default 30), of one `toolkit` if named: uses by source (read, resource, run, mount), run failures, last used, distinct principals and workspaces, uses per day; a page of `limit` (1 to 500, default 100; at most 10,000 skill-days, so fewer over a long period), continued `after` the cursor `next`", None, "200", &[("days", "integer"), ("toolkit", "string"), ("after", "string"), ("limit", "integer")]) },
        "/api/v1/usage/totals": { "get": op("(operators) each day of the last `days` (1 to 400, default 30), of one `toolkit` if named: uses by source and run failures, days without a use included", None, "200", &[("days", "integer"), ("toolkit", "string")]) },
        "/api/v1/usage/unused": { "get": op("(operators) the library's skills not used in the last `days` (1 to 400, default 30), of one `toolkit` if named, with their last use if one is still kept; a page of `limit` (1 to 500, default 100), continued `after` the cursor `next`", None, "200", &[("days", "integer"), ("toolkit", "string"), ("after", "string"), ("limit", "integer")]) },
    })
}

/// Version labels of entries and sets.
fn label_paths() -> Value {
    json!({
        "/api/v1/registry/{owner}/{name}/labels": { "get": op("the entry's version labels, each with the commit it points at (and its canary's, with its share)", None, "200", &[]) },
        "/api/v1/registry/{owner}/{name}/labels/{label}": {
            "get": op("every revision of the label, newest first (at most 200)", None, "200", &[]),
            "put": op("point the label at a commit (made if new), with an optional canary commit for a share of new workspaces; both acquired first; a new revision, audited", Some("MoveEntryLabel"), "200", &[]),
            "delete": op("remove the label (a revision pointing nowhere: a rollback brings it back)", None, "200", &[]),
        },
        "/api/v1/registry/{owner}/{name}/labels/{label}/rollback": { "post": op("point the label where it pointed before it last moved elsewhere (a new revision); `from`, the revision undone as seen, else CONFLICT", None, "200", &[("from", "integer")]) },
        "/api/v1/sets/{id}/labels": { "get": op("the set's version labels, each with the revision it points at (and its canary's)", None, "200", &[]) },
        "/api/v1/sets/{id}/labels/{label}": {
            "get": op("every revision of the label, newest first (at most 200)", None, "200", &[]),
            "put": op("point the label at a revision of the set (made if new), with an optional canary revision for a share of new workspaces; a new revision, audited", Some("MoveSetLabel"), "200", &[]),
            "delete": op("remove the label", None, "200", &[]),
        },
        "/api/v1/sets/{id}/labels/{label}/rollback": { "post": op("point the label where it pointed before it last moved elsewhere (a new revision); `from`, the revision undone as seen, else CONFLICT", None, "200", &[("from", "integer")]) },
    })
}

fn the_rest() -> Value {
    let text = |max: u64| json!({ "type": "string", "minLength": 1, "maxLength": max });
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Cloud Harness control plane",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Operator decisions, tokens and the audit log. Authenticate with `Authorization: Bearer <token>`; a browser session's writes also send `X-CSRF-Token`. Reads need the `client` role (tokens, the audit log, imports, acquisitions, inventories and usage: `operator`), writes `operator`."
        },
        "servers": [{ "url": "/" }],
        "security": [{ "bearer": [] }],
        "paths": {
            "/api/v1/whoami": { "get": op("who the caller is (and a browser session's CSRF token), and what they use of each limit", None, "200", &[]) },
            "/api/v1/tokens": {
                "get": op("every token (never a secret)", None, "200", &[]),
                "post": op("make a token; its secret is in this answer only", Some("NewToken"), "201", &[]),
            },
            "/api/v1/tokens/{name}": { "delete": op("revoke the active token {name}", None, "200", &[]) },
            "/api/v1/approvals": {
                "get": op("approvals of skill digests for skills_run (managed ones from operator.json too)", None, "200", &[("revoked", "boolean")]),
                "post": op("approve a skill digest", Some("NewApproval"), "201", &[]),
            },
            "/api/v1/approvals/pending": { "get": op("skills_run calls refused for want of an approval", None, "200", &[]) },
            "/api/v1/approvals/{id}": { "delete": op("revoke the approval {id}", None, "200", &[("reason", "string")]) },
            "/api/v1/overrides": {
                "get": op("overrides of same-tier conflicts", None, "200", &[("revoked", "boolean")]),
                "post": op("serve a skill from a source (supersedes an override of the same skill)", Some("NewOverride"), "201", &[]),
            },
            "/api/v1/overrides/{id}": { "delete": op("revoke the override {id}", None, "200", &[("reason", "string")]) },
            "/api/v1/conflicts": { "get": op("launch conflicts: opens refused because two sources of a tier define a skill differently", None, "200", &[("settled", "boolean")]) },
            "/api/v1/conflicts/{id}": { "get": op("the launch conflict {id}: its request and candidates (source, commit, digest, SKILL.md)", None, "200", &[]) },
            "/api/v1/conflicts/{id}/settle": { "post": op("settle the conflict {id}: the chosen candidate's source serves the skill (an override)", Some("Settle"), "200", &[]) },
            "/api/v1/sets": {
                "get": op("every skill set at its latest revision", None, "200", &[]),
                "post": op("make a set (revision 1)", Some("NewSet"), "201", &[]),
            },
            "/api/v1/sets/{id}": {
                "get": op("the set {id} (its latest revision, or ?revision=N)", None, "200", &[("revision", "integer")]),
                "put": op("edit the set {id}: names the revision it changes; a stale one is CONFLICT", Some("EditSet"), "200", &[]),
            },
            "/api/v1/sets/{id}/revisions": { "get": op("the revisions of the set {id}, newest first, each with what changed", None, "200", &[]) },
            "/api/v1/registry": {
                "get": op("every registry entry (the shipped presets and the operator's) with its pin", None, "200", &[]),
                "post": op("add an entry, pinned at a commit acquired first", Some("NewEntry"), "201", &[]),
            },
            "/api/v1/registry/{owner}/{name}": { "get": op("one entry and every pin it had", None, "200", &[]) },
            "/api/v1/registry/{owner}/{name}/pin": { "post": op("move the pin (the commit is acquired first)", Some("MovePin"), "200", &[]) },
            "/api/v1/registry/{owner}/{name}/validation": { "put": op("set what opens of the entry do with skills that break the Agent Skills specification: warn (served, problems said) or refuse (not served)", Some("SetValidation"), "200", &[]) },
            "/api/v1/registry/{owner}/{name}/reachability": { "put": op("allow the one commit opens of the entry may serve though no branch or tag of its repository reaches it (commit null: none); audited", Some("AllowUnreachable"), "200", &[]) },
            "/api/v1/sets/{id}/diff": { "post": op("what a workspace of revision `to` (the latest if not named) serves that one of revision `from` (the one before `to`) does not: both previewed (members acquired, tiers resolved, the set's overrides and validation applied), the skills compared as a pin's move is, and the open workspaces of `from`", Some("CompareRevisions"), "200", &[]) },
            "/api/v1/registry/{owner}/{name}/diff": { "post": op("what moving the pin from `from` (the pin if not named) to `to` would change: the skills added, removed, renamed and changed (each changed file with its sizes and kind, a unified diff of SKILL.md, scripts changed), the specification's problems before and after, and the open workspaces serving the bundle it would move from; both commits are acquired first, nothing is pinned", Some("Compare"), "200", &[]) },
            "/api/v1/registry/{owner}/{name}/rollback": { "post": op("move the pin back to the one before", None, "200", &[]) },
            "/api/v1/registry/{owner}/{name}/updates": { "post": op("ask the remote for its default branch head (refs only) and compare it with the pin", None, "200", &[]) },
            "/api/v1/imports": {
                "get": op("import jobs, newest first, with live progress", None, "200", &[("limit", "integer")]),
                "post": op("queue the import of one toolkit into the store", Some("NewImport"), "202", &[]),
            },
            "/api/v1/imports/{id}": { "get": op("one import job: state, phase, bytes, result or error", None, "200", &[]) },
            "/api/v1/imports/{id}/cancel": { "post": op("cancel a queued or running import", None, "200", &[]) },
            "/api/v1/inventory": { "get": op("(operators) which bundles of this runner's store hold a file (by SHA-256) or a skill (by name), and the acquisitions that served them: workspaces and imports, by whom, which tier, when; `truncated` when cut short", None, "200", &[("file", "string"), ("skill", "string")]) },
            "/api/v1/inventory/{bundle}": { "get": op("(operators) a bundle's inventory, CycloneDX 1.5 JSON: toolkit, commit, reachability, each skill and file with its SHA-256, size and mode", None, "200", &[]) },
            "/api/v1/acquisitions": { "get": op("every acquisition (workspace_open's and imports'), newest first, paged", None, "200", &[("cursor", "string"), ("limit", "integer")]) },
            "/api/v1/skills": { "get": op("the library: every skill of the store and the built-in tier, searched (every word of q in the name, description or toolkit) and filtered, with where each is used", None, "200", &[("q", "string"), ("tier", "string"), ("toolkit", "string"), ("warnings", "boolean"), ("problems", "boolean"), ("cursor", "string"), ("limit", "integer")]) },
            "/api/v1/skills/{digest}": { "get": op("one skill folder: every copy of it, its files, where it is used", None, "200", &[]) },
            "/api/v1/audit": { "get": op("the audit log, newest first, paged", None, "200", &[("actor", "string"), ("action", "string"), ("subject", "string"), ("cursor", "string"), ("limit", "integer")]) },
            "/api/v1/workspaces": { "get": op("the open workspaces the caller reaches: a client's own, every one for an operator", None, "200", &[]) },
            "/api/v1/usage": { "get": op("what each principal uses of each limit (operators)", None, "200", &[]) },
            "/api/v1/openapi.json": { "get": op("this document", None, "200", &[]) },
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["code", "status", "message"],
                    "properties": {
                        "code": { "type": "string", "enum": cloud_harness_error::Code::ALL.iter().map(|c| c.as_str()).collect::<Vec<_>>() },
                        "status": { "type": "integer" },
                        "message": { "type": "string" },
                        "details": {}
                    }
                },
                "NewToken": {
                    "type": "object", "additionalProperties": false, "required": ["name", "role"],
                    "properties": { "name": { "type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$" }, "role": { "enum": ["client", "operator"] } }
                },
                "NewApproval": {
                    "type": "object", "additionalProperties": false, "required": ["digest"],
                    "properties": { "digest": { "type": "string", "pattern": "^(sha256:)?[0-9a-f]{64}$" }, "skill": text(64), "reason": text(1000) }
                },
                "NewSet": {
                    "type": "object", "additionalProperties": false, "required": ["id", "members"],
                    "properties": {
                        "id": { "type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,63}$" },
                        "description": { "type": "string", "maxLength": 1000 },
                        "validation": { "enum": ["warn", "refuse"], "description": "skills that break the Agent Skills specification: served with their problems (warn) or not served (refuse)" },
                        "members": { "type": "array", "minItems": 1, "maxItems": cloud_harness_control::toolkit::MAX_TOOLKITS, "items": { "type": "object", "description": "a preset {kind: preset, id, version? or label?, scope?} or a git toolkit pinned to a commit {kind: git, instanceId, url, ref, scope?, subdirectory?, layout?, skills?}" } }
                    }
                },
                "EditSet": {
                    "type": "object", "additionalProperties": false, "required": ["revision"],
                    "properties": {
                        "revision": { "type": "integer", "minimum": 1 },
                        "description": { "type": "string", "maxLength": 1000 },
                        "validation": { "enum": ["warn", "refuse"], "description": "skills that break the Agent Skills specification: served with their problems (warn) or not served (refuse)" },
                        "members": { "type": "array", "minItems": 1, "maxItems": cloud_harness_control::toolkit::MAX_TOOLKITS, "items": { "type": "object" } }
                    }
                },
                "NewEntry": {
                    "type": "object", "additionalProperties": false, "required": ["id", "name", "description", "url", "commit"],
                    "properties": {
                        "id": { "type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}/[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$" },
                        "name": text(200), "description": text(1024),
                        "url": { "type": "string", "maxLength": cloud_harness_control::toolkit::MAX_URL },
                        "layout": { "type": "object", "properties": { "skillRoots": { "type": "array", "items": { "type": "string" } }, "recursive": { "type": "boolean" } } },
                        "defaultScope": { "enum": ["owner", "workspace"] },
                        "sessionStartSkill": text(64),
                        "commit": { "type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$" },
                        "validation": { "enum": ["warn", "refuse"], "description": "skills that break the Agent Skills specification: served with their problems (warn) or not served (refuse)" },
                        "allowUnreachable": { "type": "boolean", "description": "serve the commit though no branch or tag of the repository reaches it (audited)" }
                    }
                },
                "SetValidation": {
                    "type": "object", "additionalProperties": false, "required": ["validation"],
                    "properties": { "validation": { "enum": ["warn", "refuse"], "description": "skills that break the Agent Skills specification: served with their problems (warn) or not served (refuse)" } }
                },
                "AllowUnreachable": {
                    "type": "object", "additionalProperties": false, "required": ["commit"],
                    "properties": { "commit": { "type": ["string", "null"], "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$" }, "reason": text(1000) }
                },
                "MovePin": {
                    "type": "object", "additionalProperties": false, "required": ["commit"],
                    "properties": { "commit": { "type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$" }, "reason": text(1000), "from": { "type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$" } }
                },
                "NewImport": {
                    "type": "object", "additionalProperties": false, "required": ["toolkit"],
                    "properties": { "toolkit": { "type": "object", "description": "a preset or a git toolkit, as workspace_open takes it" } }
                },
                "Settle": {
                    "type": "object", "additionalProperties": false, "required": ["source"],
                    "properties": { "source": text(255), "set": text(64), "reason": text(1000) }
                },
                "NewOverride": {
                    "type": "object", "additionalProperties": false, "required": ["skill", "source"],
                    "properties": { "skill": text(64), "source": text(255), "set": text(64), "reason": text(1000) }
                }
            }
        }
    })
}

/// The bounds the handlers check, on the parameters that have them: what a generated request
/// must keep to for an answer other than 400.
fn with_parameter_bounds(mut spec: Value) -> Value {
    let Some(paths) = spec["paths"].as_object_mut() else {
        return spec;
    };
    for (path, ops) in paths.iter_mut() {
        for op in ops.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
            for p in op["parameters"].as_array_mut().into_iter().flatten() {
                let bounds = match (p["name"].as_str(), p["in"].as_str()) {
                    (Some("limit"), _) => {
                        let max = if path == "/api/v1/skills" { 500 } else { 1000 };
                        json!({ "type": "integer", "minimum": 1, "maximum": max })
                    }
                    (Some("reason"), Some("query")) => {
                        json!({ "type": "string", "minLength": 1, "maxLength": 1000 })
                    }
                    (Some("q"), _) => json!({ "type": "string", "maxLength": 256 }),
                    (Some("tier"), _) => json!({ "type": "string", "enum": ["builtin", "store"] }),
                    (Some("digest"), Some("path")) => {
                        json!({ "type": "string", "pattern": "^(sha256:)?[0-9a-f]{64}$" })
                    }
                    (Some("from"), Some("query")) => json!({ "type": "integer", "minimum": 0 }),
                    (Some("label"), Some("path")) => {
                        json!({ "type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$" })
                    }
                    (Some("id"), Some("path")) if path.starts_with("/api/v1/sets/") => {
                        json!({ "type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,63}$" })
                    }
                    _ => continue,
                };
                p["schema"] = bounds;
            }
        }
    }
    spec
}

pub async fn document() -> Response {
    axum::Json(with_parameter_bounds(with_path_parameters(spec()))).into_response()
}

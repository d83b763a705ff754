//! The MCP Skills extension (SEP-2640, `io.modelcontextprotocol/skills`) and skills as
//! resources. Every file of every skill a workspace serves is the resource
//! `skill://<workspace>/<skill>/<file>`: the workspace handle is the URI's first segment (the
//! extension's organizational prefix), so a URI names its skill on its own, over stdio and
//! HTTP, with or without a session, and after a restart. `skills/list` and `skills/get` give
//! each skill's front matter as written and the manifest of its files (SHA-256 digests and
//! sizes, which the store names blobs by), from the same resolution the tools and the mount
//! use. A skill the extension cannot describe faithfully is left out: a folder name that breaks
//! the Agent Skills rule or differs from its front matter's `name`, or one past the extension's
//! limits (512 files, 16 MiB). `resources/directory/read` lists a skill folder's children.

use cloud_harness_control::principal::Principal;
use cloud_harness_control::skill_usage::Source;
use cloud_harness_workspace::{Workspace, Workspaces};
use rmcp::model::{
    CacheScope, GetSkillResult, ListSkillsResult, Resource, ResourceContents, ResourceTemplate,
    Skill,
};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};
use std::sync::Arc;

const SCHEME: &str = "skill://";
/// The extension's per-skill limits.
const MAX_FILES: usize = 512;
const MAX_BYTES: u64 = 16 << 20;
/// Entries per page of `skills/list`, resources per page of `resources/list`.
const PAGE: usize = 100;
const RESOURCE_PAGE: usize = 1000;

/// Characters kept as they are in a URI path segment; the rest are percent-encoded.
fn keep(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b)
}

fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for &b in segment.as_bytes() {
        if keep(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The URI of `path` in `skill` of `workspace`.
pub fn uri(workspace: &str, skill: &str, path: &str) -> String {
    let path: Vec<String> = path.split('/').map(encode).collect();
    format!(
        "{SCHEME}{}/{}/{}",
        encode(workspace),
        encode(skill),
        path.join("/")
    )
}

/// A `skill://` URI's workspace, skill and file path.
pub fn parse(uri: &str) -> Option<(String, String, String)> {
    let rest = uri.strip_prefix(SCHEME)?;
    let mut parts = rest.splitn(3, '/');
    let workspace = decode(parts.next()?)?;
    let skill = decode(parts.next()?)?;
    let path: Vec<String> = parts
        .next()?
        .split('/')
        .map(decode)
        .collect::<Option<_>>()?;
    let path = path.join("/");
    (!workspace.is_empty() && !skill.is_empty() && !path.is_empty())
        .then_some((workspace, skill, path))
}

/// A resource this server does not have: the URI asked for in the error's data, whole (as
/// SEP-2164 asks; a request is bounded in size already), and shortened in its message.
fn unknown(uri: &str) -> McpError {
    let shown: String = uri.chars().take(200).collect();
    McpError::invalid_params(
        format!("no skill resource {shown:?}"),
        Some(serde_json::json!({ "uri": uri })),
    )
}

/// The extension's entry for `skill` of `ws`, if the extension can describe it.
fn entry(ws: &Workspace, skill: &str) -> Option<Value> {
    if !cloud_harness_skills::skill::is_spec_name(skill) {
        return None;
    }
    let frontmatter = ws.frontmatter(skill)?;
    let named = frontmatter.get("name").and_then(Value::as_str) == Some(skill);
    let described = frontmatter.get("description").is_some_and(Value::is_string);
    if !named || !described {
        return None;
    }
    let files = ws.skill_files(skill).ok()?;
    let total: u64 = files.iter().map(|f| f.size).sum();
    if files.len() > MAX_FILES || total > MAX_BYTES {
        return None;
    }
    let resources: Vec<Value> = files
        .iter()
        .map(|f| json!({ "uri": uri(&ws.id, skill, &f.path), "digest": f.digest.to_string(), "size": f.size }))
        .collect();
    Some(json!({
        "uri": uri(&ws.id, skill, "SKILL.md"),
        "frontmatter": frontmatter,
        "resources": resources,
    }))
}

/// A cursor that continues after `(workspace, skill)`.
fn cursor(workspace: &str, skill: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{workspace}/{skill}"))
}

fn after(cursor: &str) -> Option<(String, String)> {
    use base64::Engine;
    let text = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()?;
    let text = String::from_utf8(text).ok()?;
    let (w, s) = text.split_once('/')?;
    Some((w.to_owned(), s.to_owned()))
}

/// Every served skill of every open workspace `who` reaches, in (workspace, skill) order,
/// after `from` (or from it, when `inclusive`).
fn skills_after(
    workspaces: &Workspaces,
    who: &Principal,
    from: Option<&(String, String)>,
    inclusive: bool,
) -> impl Iterator<Item = (Arc<Workspace>, String)> {
    let from = from.cloned();
    let first = from.as_ref().map(|(w, _)| w.clone());
    workspaces
        .open_workspaces_of(who)
        .into_iter()
        .filter(move |ws| first.as_ref().is_none_or(|w| ws.id >= *w))
        .flat_map(move |ws| {
            let later = |name: &String| {
                from.as_ref().is_none_or(|(w, s)| {
                    let here = (ws.id.as_str(), name.as_str());
                    let there = (w.as_str(), s.as_str());
                    here > there || (inclusive && here == there)
                })
            };
            let names: Vec<String> = ws.served_names().into_iter().filter(later).collect();
            names.into_iter().map(move |name| (ws.clone(), name))
        })
}

/// The entry of `skill` of `ws` in the SDK's type, checked as the SDK checks entries.
fn typed_entry(ws: &Workspace, skill: &str) -> Option<Skill> {
    let skill: Skill = serde_json::from_value(entry(ws, skill)?).ok()?;
    skill.validate().is_ok().then_some(skill)
}

/// `skills/list`: the entries of the skills of every open workspace `who` reaches, a page at
/// a time.
pub fn list(
    workspaces: &Workspaces,
    who: &Principal,
    cursor_in: Option<&str>,
) -> Result<ListSkillsResult, McpError> {
    let from = match cursor_in {
        None => None,
        Some(c) => Some(after(c).ok_or_else(|| McpError::invalid_params("unknown cursor", None))?),
    };
    let mut skills = Vec::new();
    let mut more = false;
    let mut last = None;
    for (ws, name) in skills_after(workspaces, who, from.as_ref(), false) {
        if skills.len() == PAGE {
            more = true;
            break;
        }
        if let Some(e) = typed_entry(&ws, &name) {
            skills.push(e);
            last = Some((ws.id.clone(), name));
        }
    }
    let mut result = ListSkillsResult::with_all_items(skills)
        .with_ttl_ms(0)
        .with_cache_scope(CacheScope::Private);
    // The cursor continues after the last entry given.
    result.next_cursor = more.then(|| last.map(|(w, s)| cursor(&w, &s))).flatten();
    Ok(result)
}

/// `skills/get`: the entry of the skill whose SKILL.md `uri` names.
pub fn get(
    workspaces: &Workspaces,
    who: &Principal,
    uri: &str,
) -> Result<GetSkillResult, McpError> {
    let (workspace, skill, path) = parse(uri).ok_or_else(|| unknown(uri))?;
    if path != "SKILL.md" {
        return Err(McpError::invalid_params(
            format!("{uri:?} is not a skill's SKILL.md"),
            None,
        ));
    }
    let ws = workspaces
        .get_as(who, &workspace, "skills/get")
        .map_err(|_| unknown(uri))?;
    let entry = typed_entry(&ws, &skill).ok_or_else(|| unknown(uri))?;
    // Live tiers change what a workspace serves at any moment: nothing stays fresh.
    Ok(GetSkillResult::new(entry)
        .with_ttl_ms(0)
        .with_cache_scope(CacheScope::Private))
}

fn mime_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "md" => "text/markdown",
        "py" => "text/x-python",
        "sh" => "text/x-shellscript",
        "json" => "application/json",
        "js" | "mjs" => "text/javascript",
        "ts" => "text/x-typescript",
        "yaml" | "yml" => "application/yaml",
        "html" => "text/html",
        "txt" => "text/plain",
        _ => "application/octet-stream",
    }
}

/// `resources/list`: every file of every listed skill of the workspaces `who` reaches, a
/// page at a time. The cursor names the next resource (its workspace, skill and place in the
/// skill's files), so a page costs the same however far into the list it is.
pub fn resources(
    workspaces: &Workspaces,
    who: &Principal,
    cursor_in: Option<&str>,
) -> Result<(Vec<Resource>, Option<String>), McpError> {
    let bad = || McpError::invalid_params("unknown cursor", None);
    let (from, skip) = match cursor_in {
        None => (None, 0),
        Some(c) => {
            let (at, index) = c
                .strip_prefix("r")
                .and_then(|c| c.split_once('.'))
                .ok_or_else(bad)?;
            (
                Some(after(at).ok_or_else(bad)?),
                index.parse().map_err(|_| bad())?,
            )
        }
    };
    let mut out = Vec::new();
    for (ws, name) in skills_after(workspaces, who, from.as_ref(), true) {
        let Some(e) = entry(&ws, &name) else { continue };
        let description = e["frontmatter"]["description"].as_str().unwrap_or("");
        let first = match &from {
            Some((w, s)) if *w == ws.id && *s == name => skip,
            _ => 0,
        };
        for (i, file) in e["resources"].as_array().into_iter().flatten().enumerate() {
            if i < first {
                continue;
            }
            if out.len() == RESOURCE_PAGE {
                return Ok((out, Some(format!("r{}.{i}", cursor(&ws.id, &name)))));
            }
            let uri = file["uri"].as_str().unwrap_or_default().to_owned();
            let is_skill_md = uri.ends_with("/SKILL.md");
            let label = match is_skill_md {
                true => name.clone(),
                false => uri.rsplit('/').next().unwrap_or_default().to_owned(),
            };
            let mut resource = Resource::new(uri.clone(), label)
                .with_mime_type(mime_type(&uri))
                .with_size(file["size"].as_u64().unwrap_or(0));
            if is_skill_md {
                resource = resource.with_description(description);
            }
            out.push(resource);
        }
    }
    Ok((out, None))
}

/// The folder a directory URI names: `skill://<workspace>/<skill>` (the skill's own folder)
/// or `skill://<workspace>/<skill>/<path>`, written without a trailing slash.
fn parse_folder(uri: &str) -> Option<(String, String, String)> {
    let rest = uri.strip_prefix(SCHEME)?;
    let mut parts = rest.splitn(3, '/');
    let workspace = decode(parts.next()?)?;
    let skill = decode(parts.next()?)?;
    let path = match parts.next() {
        None => String::new(),
        Some(p) => {
            let segments: Vec<String> = p.split('/').map(decode).collect::<Option<_>>()?;
            // `%2F` decoded is a `/` inside a name: no folder is named so.
            if segments
                .iter()
                .any(|s| s.is_empty() || s == "." || s == ".." || s.contains('/'))
            {
                return None;
            }
            segments.join("/")
        }
    };
    (!workspace.is_empty() && !skill.is_empty()).then_some((workspace, skill, path))
}

/// The MIME type of a directory resource.
const DIRECTORY: &str = "inode/directory";

/// `resources/directory/read`: the direct children of a folder of a served skill, files with
/// their resource metadata and folders as directory resources, a page at a time in the
/// folder's own order (a page costs the same wherever it is). Anything else (no such
/// workspace, skill or folder; a file) is -32602.
pub fn directory(
    workspaces: &Workspaces,
    who: &Principal,
    uri: &str,
    cursor_in: Option<&str>,
) -> Result<(Vec<Resource>, Option<String>), McpError> {
    let not_a_directory = || {
        let shown: String = uri.chars().take(200).collect();
        McpError::invalid_params(
            format!("{shown:?} is not a directory resource of a served skill"),
            Some(json!({ "uri": uri })),
        )
    };
    let skip: usize = match cursor_in {
        None => 0,
        Some(c) => c
            .strip_prefix('d')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| McpError::invalid_params("unknown cursor", None))?,
    };
    let (workspace, skill, path) = parse_folder(uri).ok_or_else(not_a_directory)?;
    let ws = workspaces
        .get_as(who, &workspace, "resources/directory/read")
        .map_err(|_| not_a_directory())?;
    let (children, next) = match ws.skill_folder(&skill, &path, skip, RESOURCE_PAGE) {
        Ok(Some(page)) => page,
        Err(e) if e.code == cloud_harness_error::Code::Internal => {
            return Err(McpError::internal_error(e.message, None))
        }
        Ok(None) | Err(_) => return Err(not_a_directory()),
    };
    let out = children
        .iter()
        .map(|child| {
            let child_path = match path.is_empty() {
                true => child.name.clone(),
                false => format!("{path}/{}", child.name),
            };
            let full = self::uri(&workspace, &skill, &child_path);
            match child.size {
                Some(size) => Resource::new(full, child.name.clone())
                    .with_mime_type(mime_type(&child.name))
                    .with_size(size),
                None => Resource::new(full, child.name.clone()).with_mime_type(DIRECTORY),
            }
        })
        .collect();
    Ok((out, next.map(|n| format!("d{n}"))))
}

/// The template every skill resource fits.
pub fn templates() -> Vec<ResourceTemplate> {
    vec![ResourceTemplate::new("skill://{workspace}/{skill}/{+path}", "skill file")
        .with_description("A file of a skill a workspace serves: {workspace} is the handle workspace_open returned, {skill} the skill's name, {+path} the file inside the skill folder (SKILL.md first).")]
}

/// `resources/read` of a skill file: text when it is UTF-8, else base64.
pub fn read(
    workspaces: &Workspaces,
    who: &Principal,
    uri: &str,
) -> Result<ResourceContents, McpError> {
    let (workspace, skill, path) = parse(uri).ok_or_else(|| unknown(uri))?;
    let ws = workspaces
        .get_as(who, &workspace, "resources/read")
        .map_err(|_| unknown(uri))?;
    ws.skill(&skill).map_err(|_| unknown(uri))?;
    let started = std::time::Instant::now();
    let read = ws.file_bytes(&skill, &path);
    let failed = !matches!(read, Ok(Some(_)));
    let took = started.elapsed();
    // The file as the skill names it (`./SKILL.md` is `SKILL.md`); a failed read names none:
    // a client's made-up names are not kept.
    let file = match failed {
        true => String::new(),
        false => cloud_harness_workspace::check_skill_path(&path, "path")
            .map(|p| p.join("/"))
            .unwrap_or_default(),
    };
    ws.used(Source::Resource, &who.name, &skill, &file, failed, took);
    let bytes = match read {
        Ok(Some(bytes)) => bytes,
        Err(e) if e.code == cloud_harness_error::Code::Internal => {
            return Err(McpError::internal_error(e.message, None))
        }
        Ok(None) | Err(_) => return Err(unknown(uri)),
    };
    let mime = Some(mime_type(&path).to_owned());
    Ok(match String::from_utf8(bytes) {
        Ok(text) => ResourceContents::TextResourceContents {
            uri: uri.to_owned(),
            mime_type: mime,
            text,
            meta: None,
        },
        Err(e) => {
            use base64::Engine;
            ResourceContents::BlobResourceContents {
                uri: uri.to_owned(),
                mime_type: mime,
                blob: base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
                meta: None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_with_awkward_names() {
        for path in ["SKILL.md", "references/a b.md", "scripts/ü%.py", "x/y/z"] {
            let u = uri("ws_1", "review", path);
            assert_eq!(
                parse(&u),
                Some(("ws_1".into(), "review".into(), path.into())),
                "{u}"
            );
        }
        assert_eq!(parse("skill://ws_1/review"), None);
        assert_eq!(parse("file://ws_1/review/SKILL.md"), None);
        assert_eq!(parse("skill://ws_1/review/%zz"), None);
    }
}

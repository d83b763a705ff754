//! The MCP server: `workspace_open`, `workspace_close`, `skills_list`, `skills_read`,
//! `skills_run`, and the `session-start` prompt.
//!
//! Business errors are tool results with `isError: true` and `{code, status, message, details}`
//! in `structuredContent`, so a model can correct itself; an unknown tool or a request that is
//! not a tool call at all is a JSON-RPC error. Argument objects are flat and their schemas have
//! no `$ref`.

use crate::runner;
use crate::session_start;
use crate::toolkit;
use crate::workspace::{check_skill_path, OpenRequest, RunRequest, Workspaces};
use cloud_harness_fs::resolver::Tier;
use cloud_harness_fs::{Code, Error};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, InitializeResult, JsonObject,
    ListPromptsResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, Prompt,
    PromptArgument, PromptMessage, Role, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

pub const SESSION_START_PROMPT: &str = "session-start";
/// Default and largest page of `skills_read`.
const PAGE: u64 = 64 << 10;
const MAX_PAGE: u64 = 1 << 20;

#[derive(Clone)]
pub struct HarnessServer {
    workspaces: Arc<Workspaces>,
}

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("schemas are objects"),
    }
}

/// The tools, built once: their schemas never change.
fn tools() -> &'static [Tool] {
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

/// Tool arguments into `T`; a problem is an INVALID_ARGUMENT naming the field.
fn parse<T: serde::de::DeserializeOwned>(arguments: Option<JsonObject>) -> Result<T, Error> {
    crate::input::parse(Value::Object(arguments.unwrap_or_default()), "arguments")
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OpenArgs {
    #[serde(default)]
    repository_url: Option<String>,
    idempotency_key: String,
    #[serde(default)]
    toolkits: Vec<Value>,
    #[serde(default)]
    allow_toolkit_workspace_changes: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseArgs {
    workspace: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListArgs {
    workspace: String,
    #[serde(default)]
    tier: Option<Tier>,
    #[serde(default)]
    include_shadowed: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    workspace: String,
    skill: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    length: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RunArgs {
    workspace: String,
    skill: String,
    script: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

fn success(value: Value) -> CallToolResult {
    let text = serde_json::to_string(&value).unwrap_or_default();
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

/// Input echoed back in an error stays short: a 1 MiB argument makes a short message.
fn clip(value: &mut Value) {
    const MAX: usize = 1024;
    match value {
        Value::String(s) if s.len() > MAX => {
            let cut = (0..=MAX)
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(0);
            s.truncate(cut);
            s.push('…');
        }
        Value::Array(items) => items.iter_mut().for_each(clip),
        Value::Object(map) => map.values_mut().for_each(clip),
        _ => {}
    }
}

fn failure(error: Error) -> CallToolResult {
    let mut value = json!({
        "code": error.code,
        "status": error.status,
        "message": error.message,
        "details": error.details,
    });
    clip(&mut value);
    let error = Error {
        message: value["message"].as_str().unwrap_or_default().to_owned(),
        ..error
    };
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
        "{}: {}",
        error.code, error.message
    ))]);
    result.structured_content = Some(value);
    result
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Error::internal(format!("the task failed: {e}"))))
}

impl HarnessServer {
    pub fn new(workspaces: Arc<Workspaces>) -> HarnessServer {
        HarnessServer { workspaces }
    }

    async fn dispatch(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<Value, Error> {
        let ws = self.workspaces.clone();
        match request.name.as_ref() {
            "workspace_open" => {
                let args: OpenArgs = parse(request.arguments)?;
                let mut toolkits = Vec::with_capacity(args.toolkits.len());
                for (i, value) in args.toolkits.into_iter().enumerate() {
                    let spec =
                        toolkit::spec_from_value(value).map_err(|e| toolkit::in_request(e, i))?;
                    toolkits.push(spec);
                }
                let request = OpenRequest {
                    repository_url: args.repository_url,
                    idempotency_key: args.idempotency_key,
                    toolkits,
                    allow_toolkit_workspace_changes: args.allow_toolkit_workspace_changes,
                };
                blocking(move || ws.open(request)).await
            }
            "workspace_close" => {
                let args: CloseArgs = parse(request.arguments)?;
                blocking(move || ws.close(&args.workspace)).await
            }
            "skills_list" => {
                let args: ListArgs = parse(request.arguments)?;
                blocking(move || {
                    Ok(ws
                        .get(&args.workspace)?
                        .list(args.tier, args.include_shadowed))
                })
                .await
            }
            "skills_read" => {
                let args: ReadArgs = parse(request.arguments)?;
                let length = args.length.unwrap_or(PAGE);
                if length == 0 || length > MAX_PAGE {
                    return Err(
                        Error::invalid(format!("length: must be 1 to {MAX_PAGE} bytes"))
                            .with_details(json!({ "field": "length" })),
                    );
                }
                blocking(move || {
                    let page = ws.get(&args.workspace)?.read(
                        &args.skill,
                        args.path.as_deref().unwrap_or("SKILL.md"),
                        args.offset.unwrap_or(0),
                        length,
                    )?;
                    Ok(serde_json::to_value(page).expect("pages serialize"))
                })
                .await
            }
            "skills_run" => self.run(parse(request.arguments)?, context).await,
            other => Err(Error::new(
                Code::NotFound,
                format!("unknown tool {other:?}"),
            )),
        }
    }

    async fn run(
        &self,
        args: RunArgs,
        context: RequestContext<RoleServer>,
    ) -> Result<Value, Error> {
        check_skill_path(&args.script, "script")?;
        for (i, a) in args.args.iter().enumerate() {
            if a.contains('\0') || a.len() > 32 << 10 {
                return Err(Error::invalid(format!(
                    "args[{i}]: must be under 32 KiB without NUL bytes"
                ))
                .with_details(json!({ "field": format!("args[{i}]") })));
            }
        }
        let timeout = match args.timeout_seconds {
            None => runner::DEFAULT_TIMEOUT,
            Some(s) if (1..=runner::MAX_TIMEOUT.as_secs()).contains(&s) => Duration::from_secs(s),
            Some(_) => {
                return Err(Error::invalid(format!(
                    "timeoutSeconds: must be 1 to {}",
                    runner::MAX_TIMEOUT.as_secs()
                ))
                .with_details(json!({ "field": "timeoutSeconds" })))
            }
        };
        let ws = self.workspaces.get(&args.workspace)?;
        let progress_token = context.meta.get_progress_token();
        let peer = context.peer.clone();
        let request = RunRequest {
            skill: args.skill,
            script: args.script,
            args: args.args,
            timeout,
        };
        ws.run(
            self.workspaces.home(),
            request,
            context.ct.clone(),
            move |elapsed, bytes| {
                if let Some(token) = progress_token.clone() {
                    let peer = peer.clone();
                    let mut param = ProgressNotificationParam::new(token, elapsed.as_secs_f64());
                    param.message = Some(format!(
                        "running for {} s, {bytes} bytes of output",
                        elapsed.as_secs()
                    ));
                    tokio::spawn(async move {
                        let _ = peer.notify_progress(param).await;
                    });
                }
            },
        )
        .await
    }
}

impl ServerHandler for HarnessServer {
    fn get_info(&self) -> ServerConfig {
        let mut server = Implementation::from_build_env();
        server.name = "cloud-harness".into();
        server.version = env!("CARGO_PKG_VERSION").into();
        server.title = Some("Cloud Harness".into());
        InitializeResult::new(ServerCapabilities::builder().enable_tools().enable_prompts().build())
            .with_server_info(server)
            .with_instructions(
                "Cloud Harness serves agent skills. Call workspace_open (with toolkits) first; it returns a workspace handle \
                 and the paths inside its executor: the working tree (/workspace) and the skills (/opt/cloud-harness/skills). \
                 Then skills_list, skills_read (SKILL.md first) and skills_run, which runs a script in the executor. \
                 Errors come back as tool results with a code (INVALID_ARGUMENT, FORBIDDEN, NOT_FOUND, CONFLICT, ...) and the field to fix. \
                 The session-start prompt gives the instructions toolkits want at the start of a session.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools().to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if !tools().iter().any(|t| t.name == request.name) {
            return Err(McpError::invalid_params(
                format!("unknown tool {:?}", request.name),
                None,
            ));
        }
        let result = match self.dispatch(request, context).await {
            Ok(value) => success(value),
            Err(error) => failure(error),
        };
        Ok(result.into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let prompt = Prompt::new(
            SESSION_START_PROMPT,
            Some("The instructions the workspace's toolkits want at the start of a session, with their tool names mapped to this server's tools."),
            Some(vec![PromptArgument::new("workspace").with_description("The workspace handle").with_required(true)]),
        );
        Ok(ListPromptsResult::with_all_items(vec![prompt]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != SESSION_START_PROMPT {
            return Err(McpError::invalid_params(
                format!("unknown prompt {:?}", request.name),
                None,
            ));
        }
        let id = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("workspace"))
            .and_then(|v| v.as_str())
            .ok_or_else(|| McpError::invalid_params("the workspace argument is required", None))?;
        let ws = self
            .workspaces
            .get(id)
            .map_err(|e| McpError::invalid_params(e.message, None))?;
        let text = if ws.session_start().is_empty() {
            "No toolkit of this workspace defines session-start instructions.".to_owned()
        } else {
            session_start::prompt_text(ws.session_start(), id)
        };
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
                .with_description("Session-start instructions")
                .into(),
        )
    }
}

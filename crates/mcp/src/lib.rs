//! The MCP server: `workspace_open`, `workspace_close`, `skills_list`, `skills_read`,
//! `skills_run`, and the `session-start` prompt.
//!
//! Business errors are tool results with `isError: true` and `{code, status, message, details}`
//! in `structuredContent`, so a model can correct itself; an unknown tool or a request that is
//! not a tool call at all is a JSON-RPC error. Argument objects are flat and their schemas have
//! no `$ref`.
//!
//! The crate owns the protocol: what a tool does is `cloud-harness-workspace`'s, who may call
//! is `cloud-harness-auth`'s. Nothing below it depends on rmcp or speaks JSON-RPC (but the
//! auth guard's refusal of `/mcp`).

mod answer;
mod bound;
pub mod call;
pub mod http;
pub mod malformed;
mod one_write;
mod prewritten;
mod progress;
pub mod sessions;
mod skills;
pub mod stdio;
mod tools;

use answer::{failure, rpc_error, success, Answer};
use call::Call;
use cloud_harness_control::principal::Principal;
use cloud_harness_control::skill_usage::Source;
use cloud_harness_error::Error;
use cloud_harness_skills::namespace::Reach;
use cloud_harness_workspace::progress::OpenProgress;
use cloud_harness_workspace::session_start;
use cloud_harness_workspace::{blocking, RunRequest, Workspaces};
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, GetSkillRequestParams, GetSkillResult, Implementation, InitializeResult,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListSkillsResult,
    ListToolsResult, PaginatedRequestParams, Prompt, PromptArgument, PromptMessage,
    ReadResourceDirectoryRequestParams, ReadResourceDirectoryResult, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Role, ServerCapabilities, ServerConfig,
    SubscriptionFilter, Tool,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use std::sync::Arc;
use tools::tools;

pub(crate) const SESSION_START_PROMPT: &str = "session-start";

#[derive(Clone)]
pub struct HarnessServer {
    workspaces: Arc<Workspaces>,
    /// The workspaces this session opened or used (one server value per session).
    bound: bound::Bound,
    /// Served over HTTP (each caller named by the guard), not stdio (the local user).
    over_http: bool,
}

/// These lists come whole, in one page: a cursor is one this server never gave.
fn no_cursor(request: Option<PaginatedRequestParams>) -> Result<(), McpError> {
    match request.and_then(|r| r.cursor) {
        Some(cursor) => Err(McpError::invalid_params(
            format!(
                "unknown cursor {:?}: this list comes in one page",
                cursor.chars().take(64).collect::<String>()
            ),
            None,
        )),
        None => Ok(()),
    }
}

/// A slot of `who`'s calls, or the quota's refusal as a JSON-RPC error (its `data` as a tool's
/// error carries it: the code and the details, with `retryAfter`).
fn call_slot(who: &Principal) -> Result<cloud_harness_control::limits::Held, McpError> {
    cloud_harness_control::limits::quotas()
        .call(&who.name)
        .map_err(|e| rpc_error(&e))
}

/// `work` off the async threads, for the protocol's own methods (their errors are JSON-RPC
/// errors); one that fails to finish is an internal error.
async fn blocking_rpc<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, McpError> + Send + 'static,
) -> Result<T, McpError> {
    blocking(move || Ok(work()))
        .await
        .map_err(|e| McpError::internal_error(e.message, None))?
}

impl HarnessServer {
    pub fn new(workspaces: Arc<Workspaces>) -> HarnessServer {
        HarnessServer {
            workspaces,
            bound: bound::Bound::default(),
            over_http: false,
        }
    }

    /// The server for a new HTTP session (or session-less request): the same workspaces, no
    /// bindings yet.
    pub fn for_session(&self) -> HarnessServer {
        HarnessServer {
            over_http: true,
            ..HarnessServer::new(self.workspaces.clone())
        }
    }

    /// Who made a request: over stdio, the local user who started the process; over HTTP,
    /// the principal of the token the guard authenticated (one it did not name reaches
    /// nothing: a request that reached here some other way is nobody's, never an operator's).
    fn principal(&self, context: &RequestContext<RoleServer>) -> Principal {
        if !self.over_http {
            return Principal::local();
        }
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<cloud_harness_auth::Identity>())
            .map_or_else(Principal::nobody, Principal::of)
    }

    /// Binds this session to the workspace `id`, if it is open and `who` reaches it.
    fn bind(&self, who: &Principal, id: &str, context: &RequestContext<RoleServer>) {
        if let Ok(ws) = self.workspaces.get(id) {
            if who.reaches(ws.owner()) {
                self.bound.bind(&ws, &context.peer);
            }
        }
    }

    async fn dispatch(
        &self,
        who: &Principal,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<Answer, Error> {
        let ws = self.workspaces.clone();
        let call = call::decode(&request.name, request.arguments)?;
        match &call {
            Call::List { workspace, .. }
            | Call::Read { workspace, .. }
            | Call::Run { workspace, .. } => self.bind(who, workspace, &context),
            Call::Open(_) | Call::Close { .. } => {}
        }
        match call {
            Call::Open(request) => {
                let opener = who.clone();
                let progress = Arc::new(OpenProgress::default());
                let watching =
                    tokio::spawn(progress::watch_open(progress.clone(), context.clone()));
                let watched = progress.clone();
                let opened = blocking(move || {
                    let (who, actor) = (&opener, &opener.name);
                    let asked = request.to_json();
                    let opened = ws.open_watched(request, who, &watched);
                    if let Err(e) = &opened {
                        if let Err(not) = cloud_harness_curation::conflicts::record(
                            ws.db(),
                            ws.store(),
                            &asked,
                            e,
                            actor,
                        ) {
                            tracing::error!(error = %not, "cannot record a launch conflict");
                        }
                        cloud_harness_control::audit::refusal(ws.db(), actor, "workspace_open", e);
                    }
                    opened
                })
                .await;
                // Stopped and waited for: no progress is told after the answer.
                watching.abort();
                let _ = watching.await;
                let opened = opened?;
                if let Some(id) = opened["workspace"].as_str() {
                    self.bind(who, id, &context);
                }
                Ok(Answer::Value(opened))
            }
            Call::Close { workspace } => {
                let who = who.clone();
                blocking(move || ws.close_as(&who, &workspace))
                    .await
                    .map(Answer::Value)
            }
            Call::List {
                workspace,
                tier,
                include_shadowed,
                after,
                limit,
            } => {
                // In memory and bounded (a page of at most MAX_LIST skills): done here, not
                // queued behind the blocking pool's threads, which would take the CPU from
                // the threads serving every connection.
                let ws = ws.get_as(who, &workspace, "skills_list")?;
                let page = ws.shared_page(tier, include_shadowed, after.as_deref(), limit);
                Ok(Answer::Page(page))
            }
            Call::Read {
                workspace,
                skill,
                path,
                offset,
                length,
            } => {
                // A page of at most the default length of a file read lately is served here
                // from what the namespace holds (agents read the same SKILL.md files again and
                // again): the hand-over to the blocking pool and back was about 40% of such a
                // call's time. Anything else may wait on the disk, or encode up to a MiB, so it
                // goes to the pool.
                let ws = ws.get_as(who, &workspace, "skills_read")?;
                let started = std::time::Instant::now();
                let held = match length <= call::PAGE {
                    true => ws.read_reaching(&skill, &path, offset, length, Reach::Held),
                    false => Ok(None),
                };
                let page = match held {
                    Ok(Some(page)) => Ok(page),
                    Ok(None) => {
                        let (ws, skill, path) = (ws.clone(), skill.clone(), path.clone());
                        blocking(move || ws.read(&skill, &path, offset, length)).await
                    }
                    Err(e) => Err(e),
                };
                // A failed read names no file: a client's made-up names are not kept.
                let file = page.as_ref().map_or("", |p| p.path.as_str());
                let took = started.elapsed();
                ws.used(Source::Read, &who.name, &skill, file, page.is_err(), took);
                Ok(Answer::Value(
                    serde_json::to_value(page?).expect("pages serialize"),
                ))
            }
            Call::Run { workspace, request } => self
                .run(who, &workspace, request, context)
                .await
                .map(Answer::Value),
        }
    }

    async fn run(
        &self,
        who: &Principal,
        workspace: &str,
        request: RunRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<Value, Error> {
        let ws = self.workspaces.get_as(who, workspace, "skills_run")?;
        // A slot of the caller's runs, waiting in their queue when all are taken (a client
        // that gives up leaves it).
        let _slot = tokio::select! {
            slot = cloud_harness_control::limits::quotas().run(&who.name) => slot?,
            _ = context.ct.cancelled() => return Err(Error::new(
                cloud_harness_error::Code::Cancelled,
                "the run was cancelled while it waited for a slot",
            )),
        };
        ws.run(
            self.workspaces.home(),
            &who.name,
            request,
            context.ct.clone(),
            progress::of_run(&context),
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
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_skills_with_directory_read()
                .build(),
        )
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
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        no_cursor(request)?;
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
        let (tool, started) = (request.name.clone(), std::time::Instant::now());
        let filled = context
            .extensions
            .get::<axum::http::request::Parts>()
            .is_some_and(|p| p.extensions.get::<prewritten::Filled>().is_some());
        // One id per call, on every line logged while it is served (acquisitions, fetches,
        // executors): `--log-format json` shows it as `span.request_id`.
        let span = tracing::info_span!("mcp_call", request_id = %cloud_harness_control::state::new_id("req"), tool = %tool);
        let who = self.principal(&context);
        // Held for the whole call, which outlives its HTTP request.
        let done = match cloud_harness_control::limits::quotas().call(&who.name) {
            Ok(_call) => {
                let call = cloud_harness_control::limits::acting_as(
                    &who.name,
                    self.dispatch(&who, request, context),
                );
                tracing::Instrument::instrument(call, span.clone()).await
            }
            Err(e) => Err(e),
        };
        let code = done.as_ref().map_or_else(|e| e.code.as_str(), |_| "OK");
        let took = started.elapsed();
        cloud_harness_control::metrics::call(&tool, code, took);
        span.in_scope(|| tracing::info!(code, millis = took.as_millis() as u64, "tool call"));
        let result = match done {
            Ok(value) => success(value, filled),
            Err(error) => failure(error),
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let ws = self.workspaces.clone();
        let cursor = request.and_then(|r| r.cursor);
        let who = self.principal(&context);
        let _call = call_slot(&who)?;
        let name = who.name.clone();
        let listed = blocking_rpc(move || skills::resources(&ws, &who, cursor.as_deref()));
        let (items, next) = cloud_harness_control::limits::acting_as(&name, listed).await?;
        let mut result = ListResourcesResult::with_all_items(items)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private);
        result.next_cursor = next;
        Ok(result)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        no_cursor(request)?;
        Ok(
            ListResourceTemplatesResult::with_all_items(skills::templates())
                .with_ttl_ms(0)
                .with_cache_scope(CacheScope::Public),
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let who = self.principal(&context);
        let _call = call_slot(&who)?;
        if let Some((workspace, _, _)) = skills::parse(&request.uri) {
            self.bind(&who, &workspace, &context);
        }
        let ws = self.workspaces.clone();
        let uri = request.uri;
        let name = who.name.clone();
        let read = blocking_rpc(move || skills::read(&ws, &who, &uri));
        let contents = cloud_harness_control::limits::acting_as(&name, read).await?;
        let mut result = ReadResourceResult::new(vec![contents]);
        result.ttl_ms = Some(0);
        result.cache_scope = Some(CacheScope::Private);
        Ok(result.into())
    }

    async fn list_skills(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListSkillsResult, McpError> {
        let ws = self.workspaces.clone();
        let cursor = request.and_then(|r| r.cursor);
        let who = self.principal(&context);
        let _call = call_slot(&who)?;
        let name = who.name.clone();
        let listed = blocking_rpc(move || skills::list(&ws, &who, cursor.as_deref()));
        cloud_harness_control::limits::acting_as(&name, listed).await
    }

    async fn get_skill(
        &self,
        request: GetSkillRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetSkillResult, McpError> {
        let ws = self.workspaces.clone();
        let who = self.principal(&context);
        let _call = call_slot(&who)?;
        let name = who.name.clone();
        let got = blocking_rpc(move || skills::get(&ws, &who, &request.uri));
        cloud_harness_control::limits::acting_as(&name, got).await
    }

    async fn read_resource_directory(
        &self,
        request: ReadResourceDirectoryRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceDirectoryResult, McpError> {
        let who = self.principal(&context);
        let _call = call_slot(&who)?;
        let ws = self.workspaces.clone();
        let name = who.name.clone();
        let read = blocking_rpc(move || {
            skills::directory(&ws, &who, &request.uri, request.cursor.as_deref())
        });
        let (resources, next) = cloud_harness_control::limits::acting_as(&name, read).await?;
        let mut result = ListResourcesResult::with_all_items(resources);
        result.next_cursor = next;
        Ok(result)
    }

    /// `subscriptions/listen` (2026-07-28): resource-list changes are offered; the listing
    /// spans every open workspace, so any change of theirs is one.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let offered = SubscriptionFilter::builder()
            .resources_list_changed()
            .build();
        Some(requested.intersection(&offered))
    }

    /// Told of a change only when it is of a workspace the listener reaches (or when the
    /// listener fell behind and cannot know).
    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        use tokio::sync::broadcast::error::RecvError;
        let who = self.principal(context.request_context());
        // A listener lives as long as its client keeps it: it counts as a call the while.
        let _call = call_slot(&who)?;
        let mut changes = self.workspaces.catalogue_changes();
        loop {
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                changed = changes.recv() => {
                    let news = match changed {
                        Ok(owner) => who.reaches(&owner),
                        Err(RecvError::Lagged(_)) => true,
                        Err(RecvError::Closed) => return Ok(()),
                    };
                    if news && context.accepted().resources_list_changed == Some(true)
                        && context.sink().notify_resource_list_changed().await.is_err()
                    {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        no_cursor(request)?;
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
        context: RequestContext<RoleServer>,
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
            .get_as(&self.principal(&context), id, "prompts/get")
            .map_err(|e| McpError::invalid_params(e.message, None))?;
        let served = ws.session_start();
        let text = if served.is_empty() {
            "No toolkit of this workspace defines session-start instructions.".to_owned()
        } else {
            session_start::prompt_text(&served, id)
        };
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
                .with_description("Session-start instructions")
                .into(),
        )
    }
}

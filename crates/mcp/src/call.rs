//! A tool call's arguments, decoded and checked before anything runs: a problem is an
//! INVALID_ARGUMENT naming the field, and nothing has been touched yet.

use cloud_harness_control::input::{max_items, max_len};
use cloud_harness_control::toolkit::{self, MAX_TOOLKITS, MAX_URL};
use cloud_harness_error::{Code, Error};
use cloud_harness_executor::runner;
use cloud_harness_skills::resolver::Tier;
use cloud_harness_workspace::{check_skill_path, cursor_name, OpenRequest, RunRequest};
use rmcp::model::JsonObject;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;

/// Default and largest page of `skills_read`.
pub(crate) const PAGE: u64 = 64 << 10;
pub(crate) const MAX_PAGE: u64 = 1 << 20;
/// A workspace handle, a skill name.
pub(crate) const MAX_HANDLE: usize = 64;
pub(crate) const MAX_SKILL: usize = 255;
/// `skills_run` arguments: how many, and the bytes of each.
pub(crate) const MAX_ARGS: usize = 256;
pub(crate) const MAX_ARG: usize = 32 << 10;
/// Skills in one page of `skills_list`: the default, and the most a page may ask for.
pub(crate) const LIST_PAGE: usize = 100;
pub(crate) const MAX_LIST: usize = 1000;

/// A decoded tool call.
#[derive(Debug)]
pub enum Call {
    Open(OpenRequest),
    Close {
        workspace: String,
    },
    List {
        workspace: String,
        tier: Option<Tier>,
        include_shadowed: bool,
        /// The page: skills named after this one, at most `limit`.
        after: Option<String>,
        limit: usize,
    },
    Read {
        workspace: String,
        skill: String,
        path: String,
        offset: u64,
        length: u64,
    },
    Run {
        workspace: String,
        request: RunRequest,
    },
}

/// Decodes the arguments of a call of `tool`.
pub fn decode(tool: &str, arguments: Option<JsonObject>) -> Result<Call, Error> {
    Ok(match tool {
        "workspace_open" => {
            let args: OpenArgs = parse(arguments)?;
            max_len(
                "repositoryUrl",
                args.repository_url.as_deref().unwrap_or(""),
                MAX_URL,
            )?;
            max_items("toolkits", args.toolkits.len(), MAX_TOOLKITS)?;
            let mut toolkits = Vec::with_capacity(args.toolkits.len());
            for (i, value) in args.toolkits.into_iter().enumerate() {
                let spec =
                    toolkit::spec_from_value(value).map_err(|e| toolkit::in_request(e, i))?;
                toolkits.push(spec);
            }
            Call::Open(OpenRequest {
                repository_url: args.repository_url,
                idempotency_key: args.idempotency_key,
                toolkits,
                allow_toolkit_workspace_changes: args.allow_toolkit_workspace_changes,
                idle_pause: args.idle_pause,
            })
        }
        "workspace_close" => {
            let args: CloseArgs = parse(arguments)?;
            max_len("workspace", &args.workspace, MAX_HANDLE)?;
            Call::Close {
                workspace: args.workspace,
            }
        }
        "skills_list" => {
            let args: ListArgs = parse(arguments)?;
            max_len("workspace", &args.workspace, MAX_HANDLE)?;
            max_len("cursor", args.cursor.as_deref().unwrap_or(""), 1024)?;
            let after = match &args.cursor {
                None => None,
                Some(c) => Some(cursor_name(c).ok_or_else(|| {
                    Error::invalid("cursor: not a cursor this server gave")
                        .with_details(json!({ "field": "cursor" }))
                })?),
            };
            let limit = args.limit.unwrap_or(LIST_PAGE as u64);
            if limit == 0 || limit > MAX_LIST as u64 {
                return Err(Error::invalid(format!("limit: must be 1 to {MAX_LIST}"))
                    .with_details(json!({ "field": "limit" })));
            }
            Call::List {
                workspace: args.workspace,
                tier: args.tier,
                include_shadowed: args.include_shadowed,
                after,
                limit: limit as usize,
            }
        }
        "skills_read" => {
            let args: ReadArgs = parse(arguments)?;
            max_len("workspace", &args.workspace, MAX_HANDLE)?;
            max_len("skill", &args.skill, MAX_SKILL)?;
            let length = args.length.unwrap_or(PAGE);
            if length == 0 || length > MAX_PAGE {
                return Err(
                    Error::invalid(format!("length: must be 1 to {MAX_PAGE} bytes"))
                        .with_details(json!({ "field": "length" })),
                );
            }
            Call::Read {
                workspace: args.workspace,
                skill: args.skill,
                path: args.path.unwrap_or_else(|| "SKILL.md".into()),
                offset: args.offset.unwrap_or(0),
                length,
            }
        }
        "skills_run" => run(parse(arguments)?)?,
        other => {
            return Err(Error::new(
                Code::NotFound,
                format!("unknown tool {other:?}"),
            ))
        }
    })
}

fn run(args: RunArgs) -> Result<Call, Error> {
    max_len("workspace", &args.workspace, MAX_HANDLE)?;
    max_len("skill", &args.skill, MAX_SKILL)?;
    check_skill_path(&args.script, "script")?;
    max_items("args", args.args.len(), MAX_ARGS)?;
    for (i, a) in args.args.iter().enumerate() {
        if a.contains('\0') || a.len() > MAX_ARG {
            return Err(Error::invalid(format!(
                "args[{i}]: must be at most {MAX_ARG} bytes, without NUL bytes"
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
    Ok(Call::Run {
        workspace: args.workspace,
        request: RunRequest {
            skill: args.skill,
            script: args.script,
            args: args.args,
            timeout,
        },
    })
}

/// Tool arguments into `T`; a problem is an INVALID_ARGUMENT naming the field.
fn parse<T: serde::de::DeserializeOwned>(arguments: Option<JsonObject>) -> Result<T, Error> {
    cloud_harness_control::input::parse(Value::Object(arguments.unwrap_or_default()), "arguments")
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
    #[serde(default = "yes")]
    idle_pause: bool,
}

fn yes() -> bool {
    true
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
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<u64>,
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

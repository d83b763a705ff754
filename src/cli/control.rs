//! The control plane from the command line: `token`, `approve`, `override`, `audit`. Each
//! writes the same database `serve` uses (`<home>/state.db`), as `cli:<user>` in the audit log.

use clap::{Args, Subcommand};
use cloud_harness_auth::{self as auth, Role};
use cloud_harness_control::state::Db;
use cloud_harness_curation::decisions::{self, Kind, What};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::Digest;
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct HomeArg {
    /// Where the server keeps its state.
    #[arg(long, env = "CLOUD_HARNESS_HOME", value_name = "DIR", global = true)]
    pub home: Option<PathBuf>,
}

impl HomeArg {
    pub fn dir(&self) -> PathBuf {
        self.home
            .clone()
            .unwrap_or_else(cloud_harness_control::home::default_home)
    }

    pub fn db(&self) -> Result<Db> {
        Db::open(&self.dir())
    }
}

/// Who runs this command, as the audit log names them.
pub fn actor() -> String {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| nix::unistd::getuid().to_string());
    format!("cli:{user}")
}

pub fn print(value: serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(&value).expect("values serialize")
    );
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token and print its secret (shown only now).
    Create {
        /// 1-64 letters, digits, '.', '_' or '-'.
        #[arg(long)]
        name: String,
        /// `client` (the MCP tools, the API's reads) or `operator` (everything).
        #[arg(long, default_value = "client")]
        role: String,
    },
    /// Every token (never a secret).
    List,
    /// Revoke the active token NAME: it stops working, its browser sessions end.
    Revoke { name: String },
    /// A one-time browser login link for the operator token NAME, valid for a day.
    LoginUrl {
        #[arg(long, default_value = "operator")]
        name: String,
        /// Where the server listens, as a browser reaches it.
        #[arg(long, default_value = "http://127.0.0.1:8765")]
        url: String,
    },
}

pub fn token(home: &HomeArg, cmd: TokenCommand) -> Result<u8> {
    let db = home.db()?;
    match cmd {
        TokenCommand::Create { name, role } => {
            let made = auth::create(&db, &name, Role::parse(&role)?, &actor())?;
            print(json!(made));
        }
        TokenCommand::List => print(json!({ "tokens": auth::list(&db, true)? })),
        TokenCommand::Revoke { name } => print(json!(auth::revoke(&db, &name, &actor())?)),
        TokenCommand::LoginUrl { name, url } => {
            let code = auth::login_code(&db, &name, &actor())?;
            println!("{}/login?code={code}", url.trim_end_matches('/'));
        }
    }
    Ok(0)
}

#[derive(Debug, Subcommand)]
pub enum ApproveCommand {
    /// Let the scripts of the skill folder DIGEST run (skills_run).
    Add {
        digest: String,
        #[arg(long)]
        skill: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// The approvals in force (with --revoked, also those revoked).
    List {
        #[arg(long)]
        revoked: bool,
    },
    /// Runs refused for want of an approval.
    Pending,
    /// Revoke the approval ID.
    Revoke {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

fn kept(all: Vec<decisions::Decision>, approvals: bool) -> Vec<decisions::Decision> {
    all.into_iter()
        .filter(|d| matches!(d.what, What::Approval { .. }) == approvals)
        .collect()
}

pub fn approve(home: &HomeArg, cmd: ApproveCommand) -> Result<u8> {
    let db = home.db()?;
    match cmd {
        ApproveCommand::Add {
            digest,
            skill,
            reason,
        } => {
            let digest = Digest::parse(&digest).map_err(|_| {
                Error::field(
                    Code::InvalidArgument,
                    "digest",
                    "must be sha256:<64 lowercase hex digits>",
                )
            })?;
            print(json!(decisions::approve(
                &db,
                &digest,
                skill.as_deref(),
                reason.as_deref(),
                &actor()
            )?));
        }
        ApproveCommand::List { revoked } => {
            print(json!({ "approvals": kept(decisions::list(&db, &home.dir(), revoked)?, true) }))
        }
        ApproveCommand::Pending => {
            print(json!({ "pending": decisions::pending(&db, &home.dir())? }))
        }
        ApproveCommand::Revoke { id, reason } => {
            decisions::revoke(&db, Kind::Approval, &id, reason.as_deref(), &actor())?;
            print(json!({ "id": id, "revoked": true }));
        }
    }
    Ok(0)
}

#[derive(Debug, Subcommand)]
pub enum OverrideCommand {
    /// Serve SKILL from SOURCE (a source id or toolkit instance id) in workspaces opened from
    /// now on; supersedes an override of the same skill.
    Add {
        skill: String,
        source: String,
        /// Only in the workspaces of this set.
        #[arg(long)]
        set: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// The overrides in force (with --revoked, also those revoked).
    List {
        #[arg(long)]
        revoked: bool,
    },
    /// Revoke the override ID.
    Revoke {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Launch conflicts: opens refused because two sources of a tier define a skill
    /// differently (with --settled, also those settled).
    Conflicts {
        #[arg(long)]
        settled: bool,
    },
    /// Settle the launch conflict ID: SOURCE (one of its candidates) serves the skill.
    Settle {
        id: String,
        source: String,
        /// Only in the workspaces of this set.
        #[arg(long)]
        set: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
}

pub fn override_(home: &HomeArg, cmd: OverrideCommand) -> Result<u8> {
    let db = home.db()?;
    match cmd {
        OverrideCommand::Add {
            skill,
            source,
            set,
            reason,
        } => {
            let new = decisions::NewOverride {
                skill: &skill,
                source: &source,
                set: set.as_deref(),
                reason: reason.as_deref(),
            };
            print(json!(decisions::set_override(
                &db,
                &home.dir(),
                &new,
                &actor()
            )?))
        }
        OverrideCommand::List { revoked } => {
            print(json!({ "overrides": kept(decisions::list(&db, &home.dir(), revoked)?, false) }))
        }
        OverrideCommand::Revoke { id, reason } => {
            decisions::revoke(&db, Kind::Override, &id, reason.as_deref(), &actor())?;
            print(json!({ "id": id, "revoked": true }));
        }
        OverrideCommand::Conflicts { settled } => {
            print(json!({ "conflicts": cloud_harness_curation::conflicts::list(&db, settled)? }))
        }
        OverrideCommand::Settle {
            id,
            source,
            set,
            reason,
        } => {
            let made = cloud_harness_curation::conflicts::settle(
                &db,
                &home.dir(),
                &id,
                &source,
                set.as_deref(),
                reason.as_deref(),
                &actor(),
            )?;
            print(json!({ "conflict": id, "override": made }));
        }
    }
    Ok(0)
}

/// `cloud-harness acquisitions`: the acquisition history, newest first.
pub fn acquisitions(home: &HomeArg, limit: usize) -> Result<u8> {
    if limit == 0 || limit > 10_000 {
        return Err(Error::field(
            Code::InvalidArgument,
            "limit",
            "must be 1 to 10000",
        ));
    }
    let (all, _) = cloud_harness_provision::acquisitions::list(&home.db()?, None, limit)?;
    print(json!({ "acquisitions": all }));
    Ok(0)
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[arg(long)]
    actor: Option<String>,
    #[arg(long)]
    action: Option<String>,
    #[arg(long)]
    subject: Option<String>,
    /// The newest N entries.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

pub fn audit(home: &HomeArg, args: AuditArgs) -> Result<u8> {
    if args.limit == 0 || args.limit > 10_000 {
        return Err(Error::field(
            Code::InvalidArgument,
            "limit",
            "must be 1 to 10000",
        ));
    }
    let filter = cloud_harness_control::audit::Filter {
        actor: args.actor,
        action: args.action,
        subject: args.subject,
    };
    let (entries, _) = cloud_harness_control::audit::list(&home.db()?, &filter, None, args.limit)?;
    print(json!({ "entries": entries }));
    Ok(0)
}

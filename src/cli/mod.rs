//! The `cloud-harness` command line.

mod cas;
mod check;
mod control;
mod exec;
mod fetch_pack;
pub mod guard;
mod labels;
mod library;
pub mod mount;
mod prewarm;
mod progress;
mod proxy;
mod registry;
mod sets;
mod signature;
mod skills;
pub mod tiers;
mod toolkit;
mod usage;

use clap::{Parser, Subcommand};
use cloud_harness_error::Result;
use cloud_harness_store::cas::Store;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "cloud-harness",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CLOUD_HARNESS_COMMIT"), ")"),
    about = "Agent skill toolkits, installed and served"
)]
pub struct Cli {
    /// The content-addressed store.
    #[arg(long, global = true, env = "TOOLKIT_CACHE_ROOT", value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// The configuration file (else CLOUD_HARNESS_CONFIG, else /etc/cloud-harness/config.toml
    /// when it exists); the environment beats it.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// How log lines on stderr are written.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Skills: resolve the tiers into the view agents get.
    #[command(subcommand)]
    Skills(skills::SkillsCommand),
    /// The content-addressed store.
    #[command(subcommand)]
    Cas(cas::CasCommand),
    /// The MCP server (the main job): stdio by default, Streamable HTTP with --http.
    Serve(crate::serve::ServeArgs),
    /// What a helper container runs: fetch one commit, write its pack to stdout.
    #[command(hide = true)]
    FetchPack(fetch_pack::FetchPackArgs),
    /// The egress proxy: CONNECT to allowed hosts only, special-purpose addresses refused.
    Proxy(proxy::ProxyArgs),
    /// Serve the resolved tiers as a read-only file system until SIGTERM or SIGINT.
    Mount(mount::MountArgs),
    /// What a mounting process runs right after mounting: walk the mount once, so the
    /// kernel's caches answer the first reads.
    #[command(hide = true)]
    Prewarm(prewarm::PrewarmArgs),
    /// What `mount` and `serve` start beside themselves: detach their mounts if they die
    /// without unmounting. With `--sweep DIR` (the service's `ExecStopPost=`), detach every
    /// mount of ours left under DIR.
    #[command(hide = true)]
    MountGuard(guard::GuardArgs),
    /// Run a command in a workspace's executor (cwd /workspace; exit status passed back).
    Exec(exec::ExecArgs),
    /// Toolkits: acquire presets and git toolkits into the store, list what is there.
    #[command(subcommand)]
    Toolkit(toolkit::ToolkitCommand),
    /// Bearer tokens for the HTTP listener (MCP and the API) and browser login links.
    Token {
        #[command(flatten)]
        home: control::HomeArg,
        #[command(subcommand)]
        command: control::TokenCommand,
    },
    /// Approvals of skill digests for skills_run.
    Approve {
        #[command(flatten)]
        home: control::HomeArg,
        #[command(subcommand)]
        command: control::ApproveCommand,
    },
    /// Overrides of same-tier conflicts: which source serves a skill.
    Override {
        #[command(flatten)]
        home: control::HomeArg,
        #[command(subcommand)]
        command: control::OverrideCommand,
    },
    /// Skill sets: named lists of toolkits that workspace_open takes as one.
    Set {
        #[command(flatten)]
        home: control::HomeArg,
        #[command(subcommand)]
        command: sets::SetCommand,
    },
    /// The registry: presets and the commits they are pinned to.
    Registry {
        #[command(flatten)]
        home: control::HomeArg,
        #[command(subcommand)]
        command: registry::RegistryCommand,
    },
    /// Signatures over bundles served in a tier, and the trust policy's verdict on them.
    Signature {
        #[command(flatten)]
        home: control::HomeArg,
        #[command(subcommand)]
        command: signature::SignatureCommand,
    },
    /// The library: every skill of the store and the built-in tier, searched.
    Library(library::LibraryArgs),
    /// The usage of skills: which were used, from where, by how many; which never were.
    Usage {
        #[command(flatten)]
        home: control::HomeArg,
        #[command(subcommand)]
        command: usage::UsageCommand,
    },
    /// The audit log, newest first.
    Audit {
        #[command(flatten)]
        home: control::HomeArg,
        #[command(flatten)]
        args: control::AuditArgs,
    },
    /// The configuration file: `config check` validates one and prints every setting's value
    /// and where it came from.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The acquisition history (workspace_open's and import jobs'), newest first.
    Acquisitions {
        #[command(flatten)]
        home: control::HomeArg,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check FILE (else --config, CLOUD_HARNESS_CONFIG or the default path) and print the
    /// effective configuration.
    Check { file: Option<PathBuf> },
}

/// Runs a command; the exit code on success.
pub fn run(cli: Cli) -> Result<u8> {
    // The commands helper containers run need no store (their root is read-only).
    match &cli.command {
        Command::Proxy(args) => return proxy::run(args),
        Command::FetchPack(args) => return fetch_pack::run(args),
        Command::Exec(args) => return exec::run(args),
        Command::Prewarm(args) => return prewarm::run(args),
        Command::MountGuard(args) => return guard::run(args),
        _ => {}
    }
    // The control plane's commands need the database, not the store.
    let command = match cli.command {
        Command::Token { home, command } => return control::token(&home, command),
        Command::Approve { home, command } => return control::approve(&home, command),
        Command::Override { home, command } => return control::override_(&home, command),
        Command::Audit { home, args } => return control::audit(&home, args),
        Command::Set { home, command } => return sets::run(&home, command),
        Command::Acquisitions { home, limit } => return control::acquisitions(&home, limit),
        // A check needs no store but a scratch one of its own.
        Command::Skills(skills::SkillsCommand::Check(args)) => return check::run(&args),
        Command::Config(ConfigCommand::Check { file }) => {
            print!(
                "{}",
                cloud_harness_control::config::check(file.or(cli.config))?
            );
            return Ok(0);
        }
        other => other,
    };
    let store = Store::open(cli.store.clone().unwrap_or_else(Store::default_root))?;
    match command {
        Command::Skills(cmd) => skills::run(&store, cmd),
        Command::Cas(cmd) => cas::run(&store, cmd),
        Command::Mount(args) => mount::run(&store, &args),
        Command::Toolkit(cmd) => toolkit::run(&store, cmd),
        Command::Serve(args) => crate::serve::run(&store, &args),
        Command::Registry { home, command } => registry::run(&store, &home, command),
        Command::Signature { home, command } => signature::run(&store, &home, command),
        Command::Library(args) => library::run(&store, args),
        Command::Usage { home, command } => usage::run(&store, &home, command),
        Command::Proxy(_)
        | Command::Prewarm(_)
        | Command::MountGuard(_)
        | Command::FetchPack(_)
        | Command::Exec(_)
        | Command::Token { .. }
        | Command::Approve { .. }
        | Command::Override { .. }
        | Command::Audit { .. }
        | Command::Set { .. }
        | Command::Acquisitions { .. }
        | Command::Config(_) => unreachable!("handled above"),
    }
}

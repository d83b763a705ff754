//! The `cloud-harness` command line.

use crate::builtin;
use clap::{Args, Parser, Subcommand};
use cloud_harness_fs::cas::{self, Digest, Limits, Store};
use cloud_harness_fs::discovery::{Layout, SkillCache};
use cloud_harness_fs::resolver::{Candidate, Index, Override, Provenance, Tier};
use cloud_harness_fs::stack::{self, StackSpec};
use cloud_harness_fs::{Error, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "cloud-harness",
    version,
    about = "Agent skill toolkits, installed and served"
)]
pub struct Cli {
    /// The content-addressed store.
    #[arg(long, global = true, env = "TOOLKIT_CACHE_ROOT", value_name = "DIR")]
    pub store: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Skills: resolve the tiers into the view agents get.
    #[command(subcommand)]
    Skills(SkillsCommand),
    /// The content-addressed store.
    #[command(subcommand)]
    Cas(CasCommand),
    /// Serve the resolved tiers as a read-only file system until SIGTERM or SIGINT.
    Mount(crate::mount::MountArgs),
}

#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// Print the resolved view of the tiers: winners, shadowed copies, conflicts, skipped
    /// skills and warnings. Exits 1 when a same-tier conflict is unsettled.
    Resolve(ResolveArgs),
}

#[derive(Debug, Args)]
pub struct ResolveArgs {
    #[command(flatten)]
    pub tiers: TierArgs,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The inputs of a tier stack, shared by every command that resolves one.
#[derive(Debug, Args, Clone)]
pub struct TierArgs {
    /// Leave out the built-in tier.
    #[arg(long)]
    pub no_builtin: bool,
    /// A folder of owner-tier skills, searched recursively (repeatable: one source each).
    #[arg(long, value_name = "DIR")]
    pub owner: Vec<PathBuf>,
    /// A folder of workspace-tier skills, searched recursively (repeatable).
    #[arg(long, value_name = "DIR")]
    pub workspace: Vec<PathBuf>,
    /// A project root whose .agents/skills and .claude/skills form the repository tier.
    #[arg(long, value_name = "PROJECT_ROOT")]
    pub repository: Option<PathBuf>,
    /// Settle a same-tier conflict: serve SKILL from SOURCE (a source id or toolkit name).
    #[arg(long = "override", value_name = "SKILL=SOURCE", value_parser = parse_override)]
    pub overrides: Vec<Override>,
}

fn parse_override(text: &str) -> std::result::Result<Override, String> {
    match text.split_once('=') {
        Some((skill, source)) if !skill.is_empty() && !source.is_empty() => Ok(Override {
            skill: skill.to_owned(),
            source: source.to_owned(),
        }),
        _ => Err(format!("{text:?} is not SKILL=SOURCE")),
    }
}

#[derive(Debug, Subcommand)]
pub enum CasCommand {
    /// Import a directory as a tree; prints its digest.
    Import {
        dir: PathBuf,
        /// Also record a garbage-collection root of this name for the tree.
        #[arg(long, value_name = "NAME")]
        root: Option<String>,
    },
    /// Write a tree out into a new directory.
    Materialize { digest: Digest, dest: PathBuf },
    /// Re-hash every object and check every reference; exits 1 on any problem.
    Verify {
        #[arg(long)]
        json: bool,
    },
    /// Remove objects no root reaches, older than the grace period.
    Gc {
        /// Seconds an unreferenced object is kept after it was written or last reused.
        #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
        grace: u64,
    },
}

/// Runs a command; the exit code on success.
pub fn run(cli: Cli) -> Result<u8> {
    let store = Store::open(cli.store.clone().unwrap_or_else(Store::default_root))?;
    match cli.command {
        Command::Skills(SkillsCommand::Resolve(args)) => resolve_cmd(&store, &args),
        Command::Cas(cmd) => cas_cmd(&store, cmd),
        Command::Mount(args) => crate::mount::run(&store, &args),
    }
}

impl TierArgs {
    /// The tier stack these arguments describe (the built-in tier is put into the store).
    pub fn stack(&self, store: &Store, cache: &SkillCache) -> Result<StackSpec> {
        let mut spec = StackSpec {
            overrides: self.overrides.clone(),
            repository: self.repository.clone(),
            ..StackSpec::default()
        };
        if !self.no_builtin {
            let tree = builtin::store_builtin(store)?;
            spec.trees.push(stack::tree_source(
                store,
                cache,
                "builtin".into(),
                Tier::Builtin,
                Provenance {
                    toolkit: Some("cloud-harness".into()),
                    ..Provenance::default()
                },
                tree,
                &Layout::folder(),
            )?);
        }
        spec.dirs
            .extend(self.owner.iter().map(|d| (Tier::Owner, d.clone())));
        spec.dirs
            .extend(self.workspace.iter().map(|d| (Tier::Workspace, d.clone())));
        Ok(spec)
    }
}

/// Builds the tier stack the arguments describe and resolves it.
pub fn resolve_tiers(store: &Store, args: &TierArgs) -> Result<Index> {
    let cache = SkillCache::default();
    args.stack(store, &cache)?.resolve(store, &cache)
}

fn resolve_cmd(store: &Store, args: &ResolveArgs) -> Result<u8> {
    let index = resolve_tiers(store, &args.tiers)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &index.to_json())
            .map_err(|e| Error::internal(e.to_string()))?;
        writeln!(out).ok();
    } else {
        print_index(&mut out, &index).map_err(|e| Error::internal(e.to_string()))?;
    }
    match index.conflict_error() {
        Some(err) => {
            eprintln!("error: {err}");
            Ok(1)
        }
        None => Ok(0),
    }
}

fn short(d: &Digest) -> String {
    format!("sha256:{}", &d.hex()[..12])
}

fn print_index(out: &mut impl Write, index: &Index) -> std::io::Result<()> {
    let describe = |c: &Candidate| {
        format!(
            "{:<10} {} ({}, {})",
            c.tier.as_str(),
            index.source(c).id,
            c.path,
            short(&c.digest())
        )
    };
    writeln!(out, "generation {}", index.generation)?;
    let winners: Vec<_> = index
        .resolutions()
        .iter()
        .filter(|r| r.winner.is_some())
        .collect();
    writeln!(out, "\n{} skills", winners.len())?;
    let width = winners
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    for r in winners {
        let w = r.winner.as_ref().expect("filtered on winners");
        writeln!(
            out,
            "  {:<width$}  {:<10} {:<15} {}{}",
            r.name,
            w.tier.as_str(),
            short(&w.digest()),
            index.source(w).id,
            if r.settled_by_override {
                "  (override)"
            } else {
                ""
            }
        )?;
        for s in &r.shadowed {
            writeln!(out, "  {:<width$}    shadows {}", "", describe(s))?;
        }
    }
    let conflicts: Vec<_> = index.conflicts().collect();
    if !conflicts.is_empty() {
        writeln!(out, "\n{} conflicts (CONFLICT, 409)", conflicts.len())?;
        for r in conflicts {
            writeln!(out, "  {}", r.name)?;
            for c in &r.conflict {
                writeln!(out, "    candidate {}", describe(c))?;
            }
            for s in &r.shadowed {
                writeln!(out, "    shadows   {}", describe(s))?;
            }
        }
    }
    if !index.skipped.is_empty() {
        writeln!(out, "\n{} skipped", index.skipped.len())?;
        for s in &index.skipped {
            writeln!(
                out,
                "  {} {}: {}: {}",
                s.source, s.skipped.path, s.skipped.code, s.skipped.reason
            )?;
        }
    }
    if !index.warnings.is_empty() {
        writeln!(out, "\n{} warnings", index.warnings.len())?;
        for w in &index.warnings {
            let source = w.source.as_deref().unwrap_or("-");
            match &w.skill {
                Some(skill) => writeln!(out, "  {source} {skill}: {}", w.message)?,
                None => writeln!(out, "  {source}: {}", w.message)?,
            }
        }
    }
    Ok(())
}

fn cas_cmd(store: &Store, cmd: CasCommand) -> Result<u8> {
    match cmd {
        CasCommand::Import { dir, root } => {
            let imported = store.import_dir(&dir, &Limits::default())?;
            if let Some(name) = root {
                store.set_root(&name, &imported.digest)?;
            }
            println!(
                "{} {} files {} bytes",
                imported.digest, imported.files, imported.bytes
            );
            Ok(0)
        }
        CasCommand::Materialize { digest, dest } => {
            cas::materialize(store, &digest, &dest)?;
            println!("{}", dest.display());
            Ok(0)
        }
        CasCommand::Verify { json } => {
            let report = store.verify()?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report)
                        .map_err(|e| Error::internal(e.to_string()))?
                );
            } else {
                println!(
                    "{} blobs ({} bytes), {} trees, {} problems",
                    report.blobs,
                    report.bytes,
                    report.trees,
                    report.problems.len()
                );
                for p in &report.problems {
                    println!("{:?} {}: {}", p.problem, p.object, p.detail);
                }
            }
            Ok(if report.problems.is_empty() { 0 } else { 1 })
        }
        CasCommand::Gc { grace } => {
            let report = store.gc(Duration::from_secs(grace))?;
            println!(
                "kept {} objects, removed {} objects ({} bytes) and {} temp files",
                report.kept, report.removed, report.removed_bytes, report.removed_temp
            );
            Ok(0)
        }
    }
}

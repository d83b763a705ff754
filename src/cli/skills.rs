//! `cloud-harness skills …`

use super::tiers::{resolve_tiers, TierArgs};
use clap::{Args, Subcommand};
use cloud_harness_error::{Error, Result};
use cloud_harness_skills::resolver::{Candidate, Index};
use cloud_harness_store::cas::{Digest, Store};
use std::io::Write;

#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// Print the resolved view of the tiers: winners, shadowed copies, conflicts, skipped
    /// skills and warnings. Exits 1 when a same-tier conflict is unsettled.
    Resolve(ResolveArgs),
    /// Check the skills of a folder against the Agent Skills specification, as the harness
    /// checks every skill it serves. Exits 0 when all follow it, 1 when one does not, 2 when
    /// the folder is missing.
    Check(super::check::CheckArgs),
}

#[derive(Debug, Args)]
pub struct ResolveArgs {
    #[command(flatten)]
    pub tiers: TierArgs,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(store: &Store, cmd: SkillsCommand) -> Result<u8> {
    match cmd {
        SkillsCommand::Resolve(args) => resolve_cmd(store, &args),
        SkillsCommand::Check(args) => super::check::run(&args),
    }
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

pub(super) fn short(d: &Digest) -> String {
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

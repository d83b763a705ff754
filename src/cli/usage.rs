//! `cloud-harness usage`: the usage of skills from the command line, as
//! `GET /api/v1/usage/…` reports it (read from the same database `serve` writes).

use super::control::{print, HomeArg};
use clap::{Args, Subcommand};
use cloud_harness_control::skill_usage::report::{self, Period};
use cloud_harness_error::Result;
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::library::Library;
use cloud_harness_workspace::unused_skills;
use serde_json::json;

#[derive(Debug, Args)]
pub struct PeriodArgs {
    /// The last this many days, today included (1 to 400).
    #[arg(long, default_value_t = 30)]
    days: u64,
    /// One toolkit alone: its repository's URL (else its name, `cloud-harness` for the
    /// built-in tier, `project` for a project's own skills).
    #[arg(long)]
    toolkit: Option<String>,
}

#[derive(Debug, Args)]
pub struct PageArgs {
    /// At most this many skills (1 to 500).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Where the page starts: the `next` of the page before.
    #[arg(long)]
    after: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum UsageCommand {
    /// The skills used in the period: uses by source, run failures, last used, how many
    /// principals and workspaces, uses per day.
    Skills {
        #[command(flatten)]
        period: PeriodArgs,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Each day of the period: uses by source, run failures.
    Totals {
        #[command(flatten)]
        period: PeriodArgs,
    },
    /// The library's skills not used in the period (with their last use if one is kept).
    Unused {
        #[command(flatten)]
        period: PeriodArgs,
        #[command(flatten)]
        page: PageArgs,
    },
}

pub fn run(store: &Store, home: &HomeArg, command: UsageCommand) -> Result<u8> {
    let db = home.db()?;
    let now = cloud_harness_control::state::now_ms();
    match command {
        UsageCommand::Skills { period, page } => {
            let p = Period::last(period.days, now)?;
            let (toolkit, after) = (period.toolkit.as_deref(), page.after.as_deref());
            let (skills, next) = report::skills_page(&db, &p, toolkit, after, Some(page.limit))?;
            print(json!({ "since": p.since, "until": p.until, "skills": skills, "next": next }));
        }
        UsageCommand::Totals { period } => {
            let p = Period::last(period.days, now)?;
            let days = report::totals(&db, &p.since, &p.until, period.toolkit.as_deref())?;
            print(json!({ "since": p.since, "until": p.until, "days": days }));
        }
        UsageCommand::Unused { period, page } => {
            let p = Period::last(period.days, now)?;
            let (skills, next) = unused_skills::page(
                &Library::default(),
                store,
                &db,
                &p,
                period.toolkit.as_deref(),
                page.after.as_deref(),
                Some(page.limit),
            )?;
            print(json!({ "since": p.since, "until": p.until, "skills": skills, "next": next }));
        }
    }
    Ok(0)
}

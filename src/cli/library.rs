//! `cloud-harness library [Q]`: the library from the command line (the store's skills and the
//! built-in tier's, searched as `GET /api/v1/skills` searches them).

use super::control::print;
use clap::Args;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::library::{Library, Search};
use serde_json::json;

#[derive(Debug, Args)]
pub struct LibraryArgs {
    /// Words that must all appear in a skill's name, description or toolkit (any case).
    query: Vec<String>,
    /// `builtin` or `store`.
    #[arg(long)]
    tier: Option<String>,
    #[arg(long)]
    toolkit: Option<String>,
    /// Only skills with warnings.
    #[arg(long)]
    warnings: bool,
    /// Only skills that break the Agent Skills specification.
    #[arg(long)]
    problems: bool,
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

pub fn run(store: &Store, args: LibraryArgs) -> Result<u8> {
    if args
        .tier
        .as_deref()
        .is_some_and(|t| t != "builtin" && t != "store")
    {
        return Err(Error::field(
            Code::InvalidArgument,
            "tier",
            "`builtin` or `store`",
        ));
    }
    if args.limit == 0 || args.limit > 10_000 {
        return Err(Error::field(
            Code::InvalidArgument,
            "limit",
            "must be 1 to 10000",
        ));
    }
    let search = Search {
        text: Some(args.query.join(" ")),
        tier: args.tier,
        toolkit: args.toolkit,
        warnings: args.warnings,
        problems: args.problems,
        offset: 0,
        limit: args.limit,
    };
    let (skills, total) = Library::default().search(store, &search)?;
    print(json!({ "skills": skills, "total": total }));
    Ok(0)
}

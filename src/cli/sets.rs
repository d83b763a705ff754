//! `cloud-harness set …`: skill sets from the command line (the database `serve` uses).

use super::control::{actor, print, HomeArg};
use clap::Subcommand;
use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_curation::sets;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_skills::spec::Validation;
use serde_json::{json, Value};

#[derive(Debug, Subcommand)]
pub enum SetCommand {
    /// Make the set ID (revision 1).
    Create {
        id: String,
        #[arg(long, default_value = "")]
        description: String,
        /// A member as JSON, as workspace_open takes a toolkit (repeatable; git members with `ref`).
        #[arg(long = "member", value_name = "JSON", required = true)]
        members: Vec<String>,
        /// Skills that break the Agent Skills specification: `warn` (served, with their
        /// problems) or `refuse` (not served).
        #[arg(long, default_value = "warn")]
        validation: Validation,
    },
    /// Every set at its latest revision.
    List,
    /// The set ID (its latest revision, or --revision N).
    Show {
        id: String,
        #[arg(long)]
        revision: Option<i64>,
    },
    /// A new revision of the set ID, made from --revision (which must be its latest).
    Edit {
        id: String,
        #[arg(long)]
        revision: i64,
        #[arg(long)]
        description: Option<String>,
        /// The members of the new revision, replacing all of them (repeatable).
        #[arg(long = "member", value_name = "JSON")]
        members: Vec<String>,
        /// `warn` or `refuse` (default: as the revision was).
        #[arg(long)]
        validation: Option<Validation>,
    },
    /// The revisions of the set ID, newest first, with what changed.
    Revisions { id: String },
    /// Version labels of a set: names (`stable`) pointing at its revisions, which opens may
    /// name in place of a revision; each move audited, with rollback and canaries.
    #[command(subcommand)]
    Label(super::labels::LabelCommand),
}

fn members(texts: &[String]) -> Result<Vec<Value>> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::from_str(t).map_err(|e| {
                Error::field(
                    Code::InvalidArgument,
                    &format!("members[{i}]"),
                    format!("not JSON: {e}"),
                )
            })
        })
        .collect()
}

pub fn run(home: &HomeArg, cmd: SetCommand) -> Result<u8> {
    let db = home.db()?;
    match cmd {
        SetCommand::Create {
            id,
            description,
            members: m,
            validation,
        } => {
            let made = sets::create(
                &db,
                &HostPolicy::from_env()?,
                &id,
                &description,
                &members(&m)?,
                validation,
                &actor(),
            )?;
            print(json!(made));
        }
        SetCommand::List => print(json!({ "sets": sets::list(&db)? })),
        SetCommand::Show { id, revision } => print(json!(sets::get(&db, &id, revision)?)),
        SetCommand::Edit {
            id,
            revision,
            description,
            members: m,
            validation,
        } => {
            let m = members(&m)?;
            let given = (!m.is_empty()).then_some(m.as_slice());
            let made = sets::edit(
                &db,
                &HostPolicy::from_env()?,
                &id,
                revision,
                description.as_deref(),
                given,
                validation,
                &actor(),
            )?;
            print(json!(made));
        }
        SetCommand::Label(cmd) => super::labels::run(&db, None, false, cmd)?,
        SetCommand::Revisions { id } => {
            print(json!({ "set": id, "revisions": sets::revisions(&db, &id)? }))
        }
    }
    Ok(0)
}

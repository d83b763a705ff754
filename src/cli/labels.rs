//! `cloud-harness registry label …` and `cloud-harness set label …`: version labels on the
//! server's database (an entry's commits acquired into the store first).

use super::control::{actor, print};
use clap::Subcommand;
use cloud_harness_control::state::Db;
use cloud_harness_curation::labels::{self, Move, Target};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::Provisioner;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum LabelCommand {
    /// The labels and where each points.
    List { id: String },
    /// Every revision of the label NAME, newest first.
    History { id: String, name: String },
    /// Point the label NAME at TO (a commit of an entry, a revision of a set); made if new.
    Move {
        id: String,
        name: String,
        to: String,
        /// Serve CANARY instead to --percent of new workspaces.
        #[arg(long, requires = "percent")]
        canary: Option<String>,
        /// 1-99: the canary's share of new workspaces.
        #[arg(long, requires = "canary")]
        percent: Option<u8>,
        #[arg(long)]
        reason: Option<String>,
        /// The label's revision this move replaces, as seen (0: new): refused if it moved.
        #[arg(long)]
        from: Option<i64>,
    },
    /// Point NAME where it pointed before it last moved elsewhere.
    Rollback {
        id: String,
        name: String,
        /// The revision undone, as seen: refused if the label moved since.
        #[arg(long)]
        from: Option<i64>,
    },
    /// Remove NAME (a rollback brings it back).
    Remove { id: String, name: String },
}

/// Runs `cmd` on the labels of the entries (`entries`) or of the sets.
pub fn run(
    db: &Db,
    provisioner: Option<&Provisioner>,
    entries: bool,
    cmd: LabelCommand,
) -> Result<()> {
    let target = |id: String| {
        if entries {
            Target::Entry(id)
        } else {
            Target::Set(id)
        }
    };
    match cmd {
        LabelCommand::List { id } => {
            print(json!({ "id": id, "labels": labels::list(db, &target(id.clone()))? }))
        }
        LabelCommand::History { id, name } => print(json!({
            "id": id,
            "label": name,
            "revisions": labels::history(db, &target(id.clone()), &name)?
        })),
        LabelCommand::Move {
            id,
            name,
            to,
            canary,
            percent,
            reason,
            from,
        } => {
            let canary = match (canary, percent) {
                (Some(c), Some(p)) => Some((c, p)),
                (None, None) => None,
                _ => {
                    return Err(Error::field(
                        Code::InvalidArgument,
                        "canary",
                        "give --canary and --percent together",
                    ))
                }
            };
            let mv = Move {
                value: Some(to),
                canary,
                reason,
                from,
            };
            print(json!(labels::move_to(
                db,
                provisioner,
                &target(id),
                &name,
                &mv,
                &actor()
            )?))
        }
        LabelCommand::Rollback { id, name, from } => print(json!(labels::rollback(
            db,
            provisioner,
            &target(id),
            &name,
            from,
            &actor()
        )?)),
        LabelCommand::Remove { id, name } => print(json!(labels::move_to(
            db,
            provisioner,
            &target(id),
            &name,
            &Move::default(),
            &actor()
        )?)),
    }
    Ok(())
}

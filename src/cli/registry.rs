//! `cloud-harness registry …`: the registry's entries and pins (the database `serve` uses;
//! moving a pin acquires into the store first).

use super::control::{actor, print, HomeArg};
use clap::Subcommand;
use cloud_harness_control::toolkit::Scope;
use cloud_harness_curation::pin_diff;
use cloud_harness_curation::registry::{self, NewEntry};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::Provisioner;
use cloud_harness_skills::discovery::Layout;
use cloud_harness_skills::spec::Validation;
use cloud_harness_store::cas::Store;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum RegistryCommand {
    /// Every entry with its pin.
    List,
    /// One entry and every pin it had.
    Show { id: String },
    /// Add an entry, pinned at COMMIT (acquired first).
    Add {
        /// `owner/name`.
        id: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        description: String,
        #[arg(long)]
        url: String,
        #[arg(long)]
        commit: String,
        /// Folders holding skills (repeatable; default `skills`).
        #[arg(long = "skill-root", value_name = "DIR")]
        skill_roots: Vec<String>,
        #[arg(long)]
        not_recursive: bool,
        #[arg(long, default_value = "owner")]
        scope: String,
        #[arg(long)]
        session_start_skill: Option<String>,
        /// Skills that break the Agent Skills specification: `warn` (served, with their
        /// problems) or `refuse` (not served).
        #[arg(long, default_value = "warn")]
        validation: Validation,
        /// Serve COMMIT though no branch or tag of URL reaches it (audited).
        #[arg(long)]
        allow_unreachable: bool,
    },
    /// Set what opens of ID do with skills that break the Agent Skills specification:
    /// `warn` or `refuse` (audited).
    Validation { id: String, validation: Validation },
    /// Let ID serve COMMIT though no branch or tag of its repository reaches it (one commit
    /// per entry, in place of the one before; audited); `--clear` takes the override away.
    AllowUnreachable {
        id: String,
        #[arg(required_unless_present = "clear")]
        commit: Option<String>,
        /// Why (required when allowing): the audit log shows it.
        #[arg(long)]
        reason: Option<String>,
        #[arg(long, conflicts_with = "commit")]
        clear: bool,
    },
    /// Move the pin of ID to COMMIT (acquired first; the old pin stays in the history).
    Pin {
        id: String,
        commit: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// What moving the pin of ID to COMMIT would change, skill by skill (both commits
    /// acquired first; nothing is pinned). The CLI sees no open workspace: the server's
    /// `POST /api/v1/registry/{id}/diff` also names those serving the old bundle.
    Diff {
        id: String,
        /// The commit the pin would move to.
        commit: String,
        /// Compare with this commit, not the pin.
        #[arg(long)]
        from: Option<String>,
    },
    /// Move the pin of ID back to the one before.
    Rollback { id: String },
    /// Ask the remote of ID for its default branch head and compare it with the pin.
    Check { id: String },
    /// Version labels of an entry: names (`stable`) pointing at its commits, which opens
    /// may name in place of a version; each move audited, with rollback and canaries.
    #[command(subcommand)]
    Label(super::labels::LabelCommand),
}

pub fn run(store: &Store, home: &HomeArg, cmd: RegistryCommand) -> Result<u8> {
    let db = home.db()?;
    registry::sync_shipped(&db)?;
    let provisioner = || Provisioner::from_env(store.clone());
    match cmd {
        RegistryCommand::List => {
            let r = registry::load(&db)?;
            print(json!({ "entries": r.entries().collect::<Vec<_>>() }));
        }
        RegistryCommand::Show { id } => {
            let r = registry::load(&db)?;
            let entry = r.find(&id).ok_or_else(|| {
                Error::field(Code::NotFound, "id", format!("no registry entry {id:?}"))
            })?;
            print(json!({ "entry": entry, "pins": registry::history(&db, &id)? }));
        }
        RegistryCommand::Add {
            id,
            name,
            description,
            url,
            commit,
            skill_roots,
            not_recursive,
            scope,
            session_start_skill,
            validation,
            allow_unreachable,
        } => {
            let defaults = Layout::default();
            let layout = Layout {
                skill_roots: if skill_roots.is_empty() {
                    defaults.skill_roots
                } else {
                    skill_roots
                },
                recursive: !not_recursive,
                ..defaults
            };
            let default_scope = match scope.as_str() {
                "owner" => Scope::Owner,
                "workspace" => Scope::Workspace,
                _ => {
                    return Err(Error::field(
                        Code::InvalidArgument,
                        "scope",
                        "`owner` or `workspace`",
                    ))
                }
            };
            let new = NewEntry {
                id,
                name,
                description,
                url,
                layout,
                default_scope,
                session_start_skill,
                commit,
                validation,
                allow_unreachable,
            };
            print(json!(registry::add(&db, &provisioner()?, new, &actor())?));
        }
        RegistryCommand::AllowUnreachable {
            id, commit, reason, ..
        } => print(json!(registry::allow_unreachable(
            &db,
            &id,
            commit.as_deref(),
            reason.as_deref(),
            &actor()
        )?)),
        RegistryCommand::Validation { id, validation } => print(json!(registry::set_validation(
            &db,
            &id,
            validation,
            &actor()
        )?)),
        RegistryCommand::Pin { id, commit, reason } => print(json!(registry::pin(
            &db,
            &provisioner()?,
            &id,
            &commit,
            reason.as_deref(),
            None,
            &actor()
        )?)),
        RegistryCommand::Diff { id, commit, from } => print(json!(pin_diff::diff(
            &db,
            &provisioner()?,
            &id,
            from.as_deref(),
            &commit,
            &actor()
        )?)),
        RegistryCommand::Rollback { id } => print(json!(registry::rollback(
            &db,
            &provisioner()?,
            &id,
            &actor()
        )?)),
        RegistryCommand::Label(cmd) => {
            // Only a move acquires (a removal too goes through it, and needs none).
            let acquires = matches!(
                cmd,
                super::labels::LabelCommand::Move { .. }
                    | super::labels::LabelCommand::Rollback { .. }
            );
            let provisioner = acquires.then(provisioner).transpose()?;
            super::labels::run(&db, provisioner.as_ref(), true, cmd)?
        }
        RegistryCommand::Check { id } => print(registry::check_updates(
            &db,
            &provisioner()?,
            &id,
            &actor(),
        )?),
    }
    Ok(0)
}

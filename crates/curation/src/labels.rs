//! Version labels: names (`stable`, `canary`, any) on a registry entry, pointing at one of its
//! commits, or on a set, pointing at one of its revisions; `{"kind": "preset", "id": …,
//! "label": "stable"}` and `{"kind": "set", "id": …, "label": "stable"}` open what the label
//! points at. Each move is a new revision of the label with its audit row, so a rollback is
//! a move back; an entry's commits are acquired before the label moves (nothing changes if
//! that fails), so an open on the label is warm. A label may also serve another value to a
//! stated share of new workspaces (its canary, chosen by `control::labels::in_share`).

use crate::registry::{self, Registry};
use crate::sets;
use cloud_harness_control::audit;
use cloud_harness_control::input::shown;
use cloud_harness_control::labels::{self as values, Canary};
use cloud_harness_control::params;
use cloud_harness_control::state::{self, Db};
use cloud_harness_control::toolkit::is_hex_commit;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_provision::Provisioner;
use serde::Serialize;
use serde_json::json;

/// Labels one entry or set may have: far more than a rollout uses, few enough to list.
pub const MAX_LABELS: usize = 32;
/// Revisions of a label a history lists, the newest.
pub const MAX_HISTORY: usize = 200;
const MAX_REASON: usize = 1000;

/// What carries labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A registry entry, by id (`owner/name`): its labels point at commits.
    Entry(String),
    /// A set, by id: its labels point at revisions.
    Set(String),
}

impl Target {
    fn key(&self) -> String {
        match self {
            Target::Entry(id) => values::entry_target(id),
            Target::Set(id) => values::set_target(id),
        }
    }
}

/// One revision of a label: where it pointed from `createdAt` until `supersededAt`. A removed
/// label's last revision points nowhere (`value` absent).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Label {
    pub name: String,
    pub revision: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
    pub actor: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_at: Option<i64>,
}

fn label_row(r: &state::Row) -> state::DbResult<Label> {
    let point = values::point_of(r)?;
    Ok(Label {
        name: r.get("name")?,
        revision: r.get("revision")?,
        value: point.as_ref().map(|p| p.value.clone()),
        canary: point.and_then(|p| p.canary),
        actor: r.get("actor")?,
        reason: r.get("reason")?,
        created_at: r.get("created_at")?,
        superseded_at: r.get("superseded_at")?,
    })
}

/// A move: where the label is to point, and what the operator saw before.
#[derive(Debug, Clone, Default)]
pub struct Move {
    /// A commit of the entry, or a revision of the set; none: the label is removed.
    pub value: Option<String>,
    /// A value for `percent` in a hundred of new workspaces.
    pub canary: Option<(String, u8)>,
    pub reason: Option<String>,
    /// The label's revision the move replaces (0: none yet): CONFLICT if it moved since.
    pub from: Option<i64>,
}

/// The labels `target` has now (removed ones left out), by name.
pub fn list(db: &Db, target: &Target) -> Result<Vec<Label>> {
    exists(db, target)?;
    let rows: Vec<Label> = db.with(|c| {
        c.prepare_cached(
            "SELECT name, revision, value, canary_value, canary_percent, actor, reason, created_at, superseded_at
             FROM labels WHERE target = $1 AND superseded_at IS NULL AND value IS NOT NULL ORDER BY name",
        )?
        .query_map(params![target.key()], label_row)?
        .collect()
    })?;
    Ok(rows)
}

/// Every revision of the label `name` of `target`, newest first (at most [`MAX_HISTORY`]).
pub fn history(db: &Db, target: &Target, name: &str) -> Result<Vec<Label>> {
    exists(db, target)?;
    values::check_name("label", name)?;
    let limit = MAX_HISTORY as i64;
    let rows: Vec<Label> = db.with(|c| {
        c.prepare_cached(
            "SELECT name, revision, value, canary_value, canary_percent, actor, reason, created_at, superseded_at
             FROM labels WHERE target = $1 AND name = $2 ORDER BY revision DESC LIMIT $3",
        )?
        .query_map(params![target.key(), name, limit], label_row)?
        .collect()
    })?;
    if rows.is_empty() {
        return Err(no_label(target, name));
    }
    Ok(rows)
}

/// Points the label `name` of `target` where `mv` says (a label not there yet is made): the
/// entry's commits acquired first, a set's revisions checked; one transaction with its audit
/// row (`label.move`, or `label.remove`). The new revision.
/// `provisioner` is needed for an entry's label (a set's needs none).
pub fn move_to(
    db: &Db,
    provisioner: Option<&Provisioner>,
    target: &Target,
    name: &str,
    mv: &Move,
    actor: &str,
) -> Result<Label> {
    values::check_name("label", name)?;
    let registry = exists(db, target)?;
    if mv
        .reason
        .as_deref()
        .is_some_and(|r| r.is_empty() || r.len() > MAX_REASON || r.chars().any(char::is_control))
    {
        return Err(Error::field(
            Code::InvalidArgument,
            "reason",
            format!("1 to {MAX_REASON} bytes without control characters"),
        ));
    }
    if mv.from.is_some_and(|f| f < 0) {
        return Err(Error::field(
            Code::InvalidArgument,
            "from",
            "a label's revision is 0 (none yet) or more",
        ));
    }
    if let Some((_, percent)) = &mv.canary {
        if mv.value.is_none() {
            return Err(Error::field(
                Code::InvalidArgument,
                "canary",
                "a canary needs the label's own value beside it",
            ));
        }
        if !(1..=99).contains(percent) {
            return Err(Error::field(
                Code::InvalidArgument,
                "canary.percent",
                "a canary's share is 1 to 99 percent",
            ));
        }
    }
    // Checked before any fetch, and again in the write (another move may come between).
    let before = values::current_revision(db, &target.key(), name)?;
    if let Some(from) = mv.from.filter(|f| *f != before) {
        return Err(moved_since(name, from, before));
    }
    let current = values::current(db, &target.key(), name)?;
    if mv.value.is_none() {
        if current.is_none() {
            return Err(no_label(target, name));
        }
        if let Target::Entry(id) = target {
            refuse_if_named_by_sets(db, id, name)?;
        }
    }
    // Named as the API names them.
    let (field, canary_field) = match target {
        Target::Entry(_) => ("commit", "canary.commit"),
        Target::Set(_) => ("revision", "canary.revision"),
    };
    let value = mv
        .value
        .as_deref()
        .map(|v| checked_value(db, provisioner, registry.as_ref(), target, field, v))
        .transpose()?;
    let canary = match &mv.canary {
        Some((v, percent)) => {
            let v = checked_value(db, provisioner, registry.as_ref(), target, canary_field, v)?;
            if Some(&v) == value.as_ref() {
                return Err(Error::field(
                    Code::InvalidArgument,
                    canary_field,
                    "the canary is the label's own value",
                ));
            }
            Some(Canary {
                value: v,
                percent: *percent,
            })
        }
        None => None,
    };
    // The same place again is no move: a retried request writes no revision (which would
    // make the next rollback a no-op).
    let in_force = current.is_some();
    if let Some(now) = current.filter(|c| Some(&c.value) == value.as_ref() && c.canary == canary) {
        return history(db, target, name)?
            .into_iter()
            .find(|l| l.revision == now.revision && l.superseded_at.is_none())
            .ok_or_else(|| moved_since(name, now.revision, now.revision + 1));
    }
    let label = Label {
        name: name.to_owned(),
        revision: before + 1,
        value,
        canary,
        actor: actor.to_owned(),
        reason: mv.reason.clone(),
        created_at: state::now_ms(),
        superseded_at: None,
    };
    write(db, target, &label, before, in_force, mv.from.is_some())?;
    Ok(label)
}

/// Points the label back where it pointed before it last moved elsewhere (as a new
/// revision, audited like any move).
/// With `from`, CONFLICT if the label is no longer at that revision (a second click on a
/// page shown before the first rollback).
pub fn rollback(
    db: &Db,
    provisioner: Option<&Provisioner>,
    target: &Target,
    name: &str,
    from: Option<i64>,
    actor: &str,
) -> Result<Label> {
    let revisions = history(db, target, name)?;
    let (current, earlier) = revisions.split_first().expect("a history is never empty");
    if let Some(from) = from.filter(|f| *f != current.revision) {
        return Err(moved_since(name, from, current.revision));
    }
    // The newest revision that pointed elsewhere: one that pointed at the same place (a
    // move back and forth) is no rollback.
    let elsewhere = |l: &&Label| l.value != current.value || l.canary != current.canary;
    let Some(previous) = earlier.iter().find(elsewhere) else {
        return Err(Error::field(
            Code::Conflict,
            "label",
            format!("{name:?} has no earlier revision to roll back to"),
        ));
    };
    let mv = Move {
        value: previous.value.clone(),
        canary: previous.canary.clone().map(|c| (c.value, c.percent)),
        reason: Some(format!("rollback to revision {}", previous.revision)),
        from: Some(current.revision),
    };
    move_to(db, provisioner, target, name, &mv, actor)
}

/// The new revision written, the current one superseded; CONFLICT if another move came
/// first (the label's revision no longer `before`, or the same new revision written). While
/// the revision is still `before`, the label is in force as it was read (`in_force`).
fn write(
    db: &Db,
    target: &Target,
    label: &Label,
    before: i64,
    in_force: bool,
    asked_from: bool,
) -> Result<()> {
    // Named as the caller would look for it: `from` if it gave one, else the label.
    let moved = |now: i64| {
        let mut e = moved_since(&label.name, before, now);
        if !asked_from {
            e.details["field"] = "label".into();
        }
        e
    };
    let key = target.key();
    db.write(|tx| {
        let now: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(revision), 0) FROM labels WHERE target = $1 AND name = $2",
                params![key, label.name],
                |r| r.get(0),
            )
            .map_err(state::internal)?;
        if now != before {
            return Err(moved(now));
        }
        // A label coming into force (new, or back after a removal) needs room.
        if !in_force && label.value.is_some() {
            let names: i64 = tx
                .query_row(
                    "SELECT COUNT(*) FROM labels WHERE target = $1 AND superseded_at IS NULL AND value IS NOT NULL",
                    params![key],
                    |r| r.get(0),
                )
                .map_err(state::internal)?;
            if names >= MAX_LABELS as i64 {
                return Err(Error::field(
                    Code::ResourceExhausted,
                    "label",
                    format!("at most {MAX_LABELS} labels on one entry or set"),
                ));
            }
        }
        tx.execute(
            "UPDATE labels SET superseded_at = $1 WHERE target = $2 AND name = $3 AND superseded_at IS NULL",
            params![label.created_at, key, label.name],
        )
        .map_err(state::internal)?;
        let (canary_value, canary_percent) = match &label.canary {
            Some(c) => (Some(c.value.clone()), Some(i64::from(c.percent))),
            None => (None, None),
        };
        tx.execute(
            "INSERT INTO labels (id, target, name, revision, value, canary_value, canary_percent, actor, reason, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            params![
                state::new_id("label"), key, label.name, label.revision, label.value,
                canary_value, canary_percent, label.actor, label.reason, label.created_at
            ],
        )
        .map_err(|e| {
            if state::is_constraint(&e) {
                moved(before + 1)
            } else {
                state::internal(e)
            }
        })?;
        let action = if label.value.is_some() { "label.move" } else { "label.remove" };
        audit::record(
            tx,
            &label.actor,
            action,
            &key,
            &json!({ "label": label.name, "revision": label.revision, "value": label.value, "canary": label.canary, "reason": label.reason }),
        )
    })
}

/// A value the label may point at, as stored: an entry's commit acquired (warm when its
/// bundle is stored), a set's revision that exists.
fn checked_value(
    db: &Db,
    provisioner: Option<&Provisioner>,
    registry: Option<&Registry>,
    target: &Target,
    field: &str,
    value: &str,
) -> Result<String> {
    match target {
        Target::Entry(id) => {
            if !is_hex_commit(value) {
                return Err(Error::field(
                    Code::InvalidArgument,
                    field,
                    "must be an exact commit id (40 or 64 lowercase hex digits)",
                ));
            }
            let (Some(provisioner), Some(registry)) = (provisioner, registry) else {
                return Err(Error::internal(
                    "moving an entry's label needs a provisioner and the registry",
                ));
            };
            let acquired =
                registry::acquire(provisioner, registry, id, value).map_err(|mut e| {
                    // An error of the commit itself names it as the move does.
                    if matches!(e.details["field"].as_str(), Some("commit" | "version")) {
                        e.details["field"] = field.into();
                    }
                    e
                })?;
            Ok(acquired.record.key.commit.clone())
        }
        Target::Set(id) => {
            let revision = value
                .parse::<i64>()
                .ok()
                .filter(|r| *r >= 1)
                .ok_or_else(|| {
                    Error::field(
                        Code::InvalidArgument,
                        field,
                        format!(
                            "{:?} is not a revision of the set (1 or more)",
                            shown(value)
                        ),
                    )
                })?;
            sets::get(db, id, Some(revision)).map_err(|mut e| {
                if e.code == Code::NotFound {
                    e.details["field"] = field.into();
                }
                e
            })?;
            Ok(revision.to_string())
        }
    }
}

/// The entry or set exists; for an entry, the registry it was found in.
fn exists(db: &Db, target: &Target) -> Result<Option<Registry>> {
    match target {
        Target::Entry(id) => {
            let registry = registry::load(db)?;
            registry.find(id).ok_or_else(|| registry::unknown(id))?;
            Ok(Some(registry))
        }
        Target::Set(id) => sets::get(db, id, None).map(|_| None),
    }
}

fn no_label(target: &Target, name: &str) -> Error {
    let on = match target {
        Target::Entry(id) | Target::Set(id) => id,
    };
    Error::field(
        Code::NotFound,
        "label",
        format!("{on} has no label {:?}", shown(name)),
    )
}

fn moved_since(name: &str, from: i64, now: i64) -> Error {
    Error::field(
        Code::Conflict,
        "from",
        format!("the label {name:?} moved since revision {from}: it is at revision {now}"),
    )
}

/// CONFLICT if the latest revision of a set names the entry's label `name` (its opens would
/// be refused once the label is gone).
fn refuse_if_named_by_sets(db: &Db, id: &str, name: &str) -> Result<()> {
    use cloud_harness_control::toolkit::ToolkitSpec;
    let naming: Vec<String> = sets::list(db)?
        .into_iter()
        .filter(|s| {
            s.members.iter().any(
                |m| matches!(m, ToolkitSpec::Preset(p) if p.id == id && p.label.as_deref() == Some(name)),
            )
        })
        .map(|s| s.id)
        .collect();
    if naming.is_empty() {
        return Ok(());
    }
    Err(Error::field(
        Code::Conflict,
        "label",
        format!(
            "the sets {} name {id}'s label {name:?}: edit them before removing it",
            naming.join(", ")
        ),
    ))
}

//! Skill sets: a named, described list of toolkits (presets, or git toolkits pinned to a
//! commit, each with its own include/exclude and scope) that `workspace_open` takes as one
//! toolkit, `{"kind": "set", "id": …, "revision"?: N}`. Every edit makes a new revision and
//! names the revision it changes: a stale one is CONFLICT, so two operators never overwrite
//! each other unknowingly.

use crate::registry::{validation_from, validation_str, Registry};
use cloud_harness_control::audit;
use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_control::params;
use cloud_harness_control::state::Optional;
use cloud_harness_control::state::{self, Db};
use cloud_harness_control::toolkit::{self, ToolkitSpec};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_skills::spec::Validation;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

const MAX_DESCRIPTION: usize = 1000;

/// One revision of a set.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    pub id: String,
    pub revision: i64,
    pub description: String,
    pub members: Vec<ToolkitSpec>,
    /// What opens do with its members' skills that break the Agent Skills specification
    /// (`refuse` wins over a member's own `warn`).
    pub validation: Validation,
    pub actor: String,
    pub created_at: i64,
}

/// A set id: 1-64 lowercase letters, digits and hyphens, starting with a letter or digit.
pub fn check_id(id: &str) -> Result<()> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::field(
            Code::InvalidArgument,
            "id",
            format!(
                "{:?} is not a set id: 1-64 lowercase letters, digits and hyphens",
                cloud_harness_control::input::shown(id)
            ),
        ))
    }
}

/// Members as an edit gives them: each a preset or a git toolkit pinned to a commit, valid on
/// this server's hosts, instance ids unique.
pub fn check_members(
    members: &[Value],
    hosts: &HostPolicy,
    registry: &Registry,
) -> Result<Vec<ToolkitSpec>> {
    if members.is_empty() {
        return Err(Error::field(
            Code::InvalidArgument,
            "members",
            "a set has at least one member",
        ));
    }
    let mut specs = Vec::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        let spec = toolkit::spec_from_value(m.clone()).map_err(|e| in_members(e, i))?;
        match &spec {
            ToolkitSpec::Set(_) => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    &format!("members[{i}].kind"),
                    "a set's members are presets and git toolkits, not sets",
                ));
            }
            ToolkitSpec::Git(g) if g.git_ref.is_none() => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    &format!("members[{i}].ref"),
                    "a git member is pinned to an exact commit",
                ));
            }
            _ => {}
        }
        specs.push(spec);
    }
    toolkit::resolve_request_in(&specs, hosts, registry).map_err(|mut e| {
        if let Some(f) = e.details["field"].as_str() {
            let f = f.replacen("toolkits", "members", 1);
            e.message = e.message.replacen("toolkits", "members", 1);
            e.details["field"] = f.into();
        }
        e
    })?;
    Ok(specs)
}

fn in_members(mut e: Error, i: usize) -> Error {
    e = toolkit::in_request(e, i);
    let f = e.details["field"]
        .as_str()
        .unwrap_or("members")
        .replacen("toolkits", "members", 1);
    e.message = e.message.replacen("toolkits", "members", 1);
    e.details["field"] = f.into();
    e
}

fn check_description(d: &str) -> Result<()> {
    if d.len() > MAX_DESCRIPTION || d.chars().any(|c| c.is_control() && c != '\n') {
        return Err(Error::field(
            Code::InvalidArgument,
            "description",
            format!("at most {MAX_DESCRIPTION} bytes, no control characters but newlines"),
        ));
    }
    Ok(())
}

fn row(r: &state::Row) -> state::DbResult<Revision> {
    let members: String = r.get("members")?;
    Ok(Revision {
        id: r.get("set_id")?,
        revision: r.get("revision")?,
        description: r.get("description")?,
        members: serde_json::from_str(&members).unwrap_or_default(),
        validation: validation_from(&r.get::<String>("validation")?),
        actor: r.get("actor")?,
        created_at: r.get("created_at")?,
    })
}

/// Makes the set `id` at revision 1; CONFLICT if it exists.
pub fn create(
    db: &Db,
    hosts: &HostPolicy,
    id: &str,
    description: &str,
    members: &[Value],
    validation: Validation,
    actor: &str,
) -> Result<Revision> {
    check_id(id)?;
    check_description(description)?;
    let members = check_members(members, hosts, &crate::registry::load(db)?)?;
    let now = state::now_ms();
    db.write(|tx| {
        tx.execute(
            "INSERT INTO sets (id, created_at, created_by) VALUES ($1, $2, $3)",
            params![id, now, actor],
        )
        .map_err(|e| {
            if state::is_constraint(&e) {
                Error::field(
                    Code::Conflict,
                    "id",
                    format!("a set {id:?} exists; edit it instead"),
                )
            } else {
                state::internal(e)
            }
        })?;
        insert(tx, id, 1, description, &members, validation, actor, now)
    })
}

#[allow(clippy::too_many_arguments)]
fn insert(
    tx: &state::Conn,
    id: &str,
    revision: i64,
    description: &str,
    members: &[ToolkitSpec],
    validation: Validation,
    actor: &str,
    now: i64,
) -> Result<Revision> {
    tx.execute(
        "INSERT INTO set_revisions (set_id, revision, description, members, validation, actor, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        params![id, revision, description, serde_json::to_string(members).expect("specs serialize"), validation_str(validation), actor, now],
    )
    .map_err(|e| {
        if state::is_constraint(&e) {
            stale(id, revision - 1)
        } else {
            state::internal(e)
        }
    })?;
    cloud_harness_error::failpoint::point("sets.revision_written");
    audit::record(
        tx,
        actor,
        if revision == 1 {
            "set.create"
        } else {
            "set.edit"
        },
        &format!("set:{id}"),
        &json!({ "revision": revision, "validation": validation }),
    )?;
    Ok(Revision {
        id: id.to_owned(),
        revision,
        description: description.to_owned(),
        members: members.to_vec(),
        validation,
        actor: actor.to_owned(),
        created_at: now,
    })
}

fn stale(id: &str, revision: i64) -> Error {
    Error::field(
        Code::Conflict,
        "revision",
        format!(
            "set {id:?} changed after revision {revision}: read its latest revision and edit that"
        ),
    )
    .with_details(json!({ "field": "revision", "set": id }))
}

/// A new revision of `id`, made from `revision` (which must be the latest); what is not given
/// stays as it was.
#[allow(clippy::too_many_arguments)]
pub fn edit(
    db: &Db,
    hosts: &HostPolicy,
    id: &str,
    revision: i64,
    description: Option<&str>,
    members: Option<&[Value]>,
    validation: Option<Validation>,
    actor: &str,
) -> Result<Revision> {
    let current = get(db, id, None)?;
    let validation = validation.unwrap_or(current.validation);
    if let Some(d) = description {
        check_description(d)?;
    }
    let members = match members {
        Some(m) => check_members(m, hosts, &crate::registry::load(db)?)?,
        None => current.members.clone(),
    };
    let description = description.unwrap_or(&current.description);
    db.write(|tx| {
        let latest: i64 = tx
            .query_row(
                "SELECT MAX(revision) FROM set_revisions WHERE set_id = $1",
                params![id],
                |r| r.get(0),
            )
            .map_err(state::internal)?;
        if latest != revision {
            return Err(stale(id, revision)
                .with_details(json!({ "field": "revision", "set": id, "latest": latest })));
        }
        insert(
            tx,
            id,
            revision + 1,
            description,
            &members,
            validation,
            actor,
            state::now_ms(),
        )
    })
}

/// The set `id` at `revision` (default: its latest).
pub fn get(db: &Db, id: &str, revision: Option<i64>) -> Result<Revision> {
    check_id(id)?;
    db.with(|c| {
        c.prepare_cached(
            "SELECT set_id, revision, description, members, validation, actor, created_at FROM set_revisions
             WHERE set_id = $1 AND (CAST($2 AS BIGINT) IS NULL OR revision = $2) ORDER BY revision DESC LIMIT 1",
        )?
        .query_row(params![id, revision], row)
        .optional()
    })?
    .ok_or_else(|| match revision {
        Some(n) => Error::field(
            Code::NotFound,
            "revision",
            format!("set {id:?} has no revision {n}"),
        ),
        None => Error::field(Code::NotFound, "id", format!("no set {id:?}")),
    })
}

/// Every set at its latest revision, by id.
pub fn list(db: &Db) -> Result<Vec<Revision>> {
    db.with(|c| {
        c.prepare_cached(
            "SELECT r.set_id, r.revision, r.description, r.members, r.validation, r.actor, r.created_at FROM set_revisions r
             WHERE r.revision = (SELECT MAX(revision) FROM set_revisions WHERE set_id = r.set_id) ORDER BY r.set_id",
        )?
        .query_map(params![], row)?
        .collect()
    })
}

/// A member's name within its set: its instance id.
fn member_key(spec: &ToolkitSpec) -> String {
    match spec {
        ToolkitSpec::Preset(p) => p.id.replace('/', "-"),
        ToolkitSpec::Git(g) => g.instance_id.clone(),
        ToolkitSpec::Set(s) => s.id.clone(),
    }
}

/// Every revision of the set `id`, oldest first; NOT_FOUND for a set that does not exist.
pub fn every_revision(db: &Db, id: &str) -> Result<Vec<Revision>> {
    check_id(id)?;
    let all: Vec<Revision> = db.with(|c| {
        c.prepare_cached(
            "SELECT set_id, revision, description, members, validation, actor, created_at FROM set_revisions WHERE set_id = $1 ORDER BY revision",
        )?
        .query_map(params![id], row)?
        .collect()
    })?;
    if all.is_empty() {
        return Err(Error::field(Code::NotFound, "id", format!("no set {id:?}")));
    }
    Ok(all)
}

/// Every revision, newest first, each with what changed from the one before.
pub fn revisions(db: &Db, id: &str) -> Result<Vec<Value>> {
    let all = every_revision(db, id)?;
    let mut out = Vec::new();
    let mut before: BTreeMap<String, &ToolkitSpec> = BTreeMap::new();
    let mut description: Option<&str> = None;
    for r in &all {
        let now: BTreeMap<String, &ToolkitSpec> =
            r.members.iter().map(|m| (member_key(m), m)).collect();
        let added: Vec<&String> = now.keys().filter(|k| !before.contains_key(*k)).collect();
        let removed: Vec<&String> = before.keys().filter(|k| !now.contains_key(*k)).collect();
        let changed: Vec<&String> = now
            .keys()
            .filter(|k| before.get(*k).is_some_and(|b| b != &now[*k]))
            .collect();
        out.push(json!({
            "revision": r.revision,
            "actor": r.actor,
            "createdAt": r.created_at,
            "changes": {
                "added": added,
                "removed": removed,
                "changed": changed,
                "description": description.is_some_and(|d| d != r.description),
            },
        }));
        before = now;
        description = Some(&r.description);
    }
    out.reverse();
    Ok(out)
}

/// A request's toolkits with its sets expanded into their members.
pub struct Expanded {
    /// Every toolkit, members of a set in its place.
    pub specs: Vec<ToolkitSpec>,
    /// For each of `specs`, the set and revision it came from.
    pub origins: Vec<Option<Value>>,
    /// For each of `specs`, the validation its set asks for (`warn` outside a set).
    pub validation: Vec<Validation>,
}

impl Expanded {
    /// Resolved toolkits with their sets' validation applied: the stricter of a member's own
    /// and its set's.
    pub fn apply_validation(&self, toolkits: &mut [toolkit::Toolkit]) {
        for (t, v) in toolkits.iter_mut().zip(&self.validation) {
            t.layout.validation = t.layout.validation.stricter(*v);
        }
    }
}

/// A request's toolkits with its sets expanded; a set named by its label takes the label's
/// revision, its canary's when `seed` (the open's owner and idempotency key) falls in its
/// share.
pub fn expand(db: &Db, specs: &[ToolkitSpec], seed: Option<&str>) -> Result<Expanded> {
    let mut out = Expanded {
        specs: Vec::new(),
        origins: Vec::new(),
        validation: Vec::new(),
    };
    for (i, spec) in specs.iter().enumerate() {
        match spec {
            ToolkitSpec::Set(s) => {
                s.check().map_err(|e| toolkit::in_request(e, i))?;
                let (revision, label) = match &s.label {
                    Some(name) => {
                        let (revision, taken) = label_revision(db, &s.id, name, seed)
                            .map_err(|e| toolkit::in_request(e, i))?;
                        (Some(revision), Some(taken))
                    }
                    None => (s.revision, None),
                };
                let set = get(db, &s.id, revision).map_err(|e| toolkit::in_request(e, i))?;
                let mut origin = json!({ "id": set.id, "revision": set.revision });
                if let Some(taken) = label {
                    origin["label"] = json!(taken);
                }
                for m in set.members {
                    out.specs.push(m);
                    out.validation.push(set.validation);
                    out.origins.push(Some(origin.clone()));
                }
            }
            other => {
                out.specs.push(other.clone());
                out.origins.push(None);
                out.validation.push(Validation::Warn);
            }
        }
    }
    Ok(out)
}

/// The revision the label `name` (checked) of the set `id` gives an open with `seed`.
fn label_revision(
    db: &Db,
    id: &str,
    name: &str,
    seed: Option<&str>,
) -> Result<(i64, cloud_harness_control::labels::Taken)> {
    use cloud_harness_control::labels;
    get(db, id, None)?; // an unknown set is NOT_FOUND, as without a label
    let target = labels::set_target(id);
    let point = labels::current(db, &target, name)?.ok_or_else(|| {
        Error::field(
            Code::InvalidArgument,
            "label",
            format!("set {id:?} has no label {name:?}"),
        )
    })?;
    let (value, taken) = point.pick(&target, name, seed);
    let revision = value
        .parse()
        .map_err(|_| Error::internal(format!("label {name:?} of set {id:?} holds {value:?}")))?;
    Ok((revision, taken))
}

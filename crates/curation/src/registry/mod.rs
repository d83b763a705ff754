//! The registry: the shipped presets plus entries operators add, each with a **pin** — the
//! commit that `{"kind": "preset", "id": …}` without a `version` means, so a pinned preset
//! whose bundle is in the store opens warm, with no network at all. Moving a pin acquires the
//! new commit first and keeps the history (a rollback is a move back).

use cloud_harness_control::audit;
use cloud_harness_control::input::{check_text, shown};
use cloud_harness_control::params;
use cloud_harness_control::presets::{self, Preset};
use cloud_harness_control::state::Optional;
use cloud_harness_control::state::{self, Db};
use cloud_harness_control::toolkit::{self, PresetSpec, Scope, ToolkitSpec};
use cloud_harness_provision::Provisioner;

pub use cloud_harness_control::presets::registry::{Entry, Pin, Registry};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_skills::discovery::Layout;
use cloud_harness_skills::spec::Validation;
use serde_json::json;

mod reachability;

fn pin_row(r: &state::Row) -> state::DbResult<Pin> {
    Ok(Pin {
        id: r.get("id")?,
        commit: r.get("commit_id")?,
        actor: r.get("actor")?,
        reason: r.get("reason")?,
        created_at: r.get("created_at")?,
        superseded_at: r.get("superseded_at")?,
    })
}

/// Brings the shipped presets into the database: their definitions as this binary has them,
/// and, for one never pinned, the commit it was tested at.
pub fn sync_shipped(db: &Db) -> Result<()> {
    db.write(|tx| {
        let now = state::now_ms();
        for p in presets::all() {
            // An override names a commit of the URL it was allowed for: a shipped preset
            // that moved to another repository loses it.
            tx.execute(
                "INSERT INTO registry_entries (id, name, description, url, layout, default_scope, session_start_skill, origin, created_at, created_by)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'shipped', $8, 'system:shipped')
                 ON CONFLICT (id) DO UPDATE SET name = $2, description = $3, url = $4, layout = $5,
                     default_scope = $6, session_start_skill = $7,
                     allow_unreachable = CASE WHEN registry_entries.url = $4 THEN registry_entries.allow_unreachable END",
                params![
                    p.id, p.name, p.description, p.url,
                    serde_json::to_string(&p.layout).expect("layouts serialize"),
                    scope_str(p.default_scope), p.session_start_skill, now
                ],
            )
            .map_err(state::internal)?;
            let pinned: bool = tx
                .query_row("SELECT EXISTS (SELECT 1 FROM pins WHERE entry_id = $1)", params![p.id], |r| r.get(0))
                .map_err(state::internal)?;
            if !pinned {
                tx.execute(
                    "INSERT INTO pins (id, entry_id, commit_id, actor, reason, created_at) VALUES ($1, $2, $3, 'system:shipped', 'the commit this preset was tested at', $4)",
                    params![state::new_id("pin"), p.id, p.tested_commit, now],
                )
                .map_err(state::internal)?;
            }
        }
        Ok(())
    })
}

fn scope_str(s: Scope) -> &'static str {
    match s {
        Scope::Owner => "owner",
        Scope::Workspace => "workspace",
    }
}

/// Every entry with its current pin: the shipped presets as this binary has them (pinned
/// once [`sync_shipped`] ran), and the operator's.
pub fn load(db: &Db) -> Result<Registry> {
    let entries = db.with(|c| {
        c.prepare_cached(
            "SELECT e.id, e.name, e.description, e.url, e.layout, e.default_scope, e.session_start_skill, e.origin, e.validation, e.allow_unreachable,
                    p.id AS pin_id, p.commit_id, p.actor, p.reason, p.created_at
             FROM registry_entries e LEFT JOIN pins p ON p.entry_id = e.id AND p.superseded_at IS NULL
             ORDER BY e.id",
        )?
        .query_map(params![], |r| {
            let layout: String = r.get("layout")?;
            let scope: String = r.get("default_scope")?;
            let pin = match r.get::<Option<String>>("pin_id")? {
                Some(id) => Some(Pin {
                    id,
                    commit: r.get("commit_id")?,
                    actor: r.get("actor")?,
                    reason: r.get("reason")?,
                    created_at: r.get("created_at")?,
                    superseded_at: None,
                }),
                None => None,
            };
            let commit = pin.as_ref().map(|p| p.commit.clone()).unwrap_or_default();
            Ok(Entry {
                preset: Preset {
                    id: r.get("id")?,
                    name: r.get("name")?,
                    description: r.get("description")?,
                    url: r.get("url")?,
                    tested_commit: commit,
                    layout: serde_json::from_str(&layout).unwrap_or_default(),
                    default_scope: if scope == "workspace" { Scope::Workspace } else { Scope::Owner },
                    session_start_skill: r.get("session_start_skill")?,
                },
                origin: r.get("origin")?,
                pin,
                validation: validation_from(&r.get::<String>("validation")?),
                allow_unreachable: r.get("allow_unreachable")?,
                labels: Default::default(),
            })
        })?
        .collect::<state::DbResult<Vec<Entry>>>()
    })?;
    let mut labels = cloud_harness_control::labels::of_entries(db)?;
    let mut registry = Registry::shipped().clone();
    for mut e in entries {
        e.labels = labels.remove(&e.preset.id).unwrap_or_default();
        registry.put(e);
    }
    Ok(registry)
}

/// Asks the remote of `id` for its default branch head (refs only, through the egress proxy)
/// and reports it against the pin.
pub fn check_updates(
    db: &Db,
    provisioner: &Provisioner,
    id: &str,
    actor: &str,
) -> Result<serde_json::Value> {
    let registry = load(db)?;
    let entry = registry.find(id).ok_or_else(|| unknown(id))?;
    let url = provisioner.hosts().check(&entry.preset.url, "url")?;
    let started = std::time::Instant::now();
    let head = cloud_harness_provision::fetch::remote_head(&url, &provisioner.transport()?)
        .map_err(|e| provisioner.explain(&url, e, started))?
        .to_string();
    let pinned = entry.pin.as_ref().map(|p| p.commit.clone());
    let report = json!({
        "id": id,
        "url": entry.preset.url,
        "pinned": pinned,
        "head": head,
        "upToDate": pinned.as_deref() == Some(head.as_str()),
        "checkedAt": state::now_ms(),
    });
    audit::event(
        db,
        actor,
        "registry.check",
        &format!("registry:{id}"),
        &report,
    )?;
    Ok(report)
}

pub(crate) fn unknown(id: &str) -> Error {
    Error::field(
        Code::NotFound,
        "id",
        format!("no registry entry {:?}", shown(id)),
    )
}

/// Acquires `commit` of the entry `id` (warm when its bundle is in the store already).
pub(crate) fn acquire(
    provisioner: &Provisioner,
    registry: &Registry,
    id: &str,
    commit: &str,
) -> Result<cloud_harness_provision::Acquired> {
    let spec = ToolkitSpec::Preset(PresetSpec {
        id: id.to_owned(),
        scope: None,
        version: Some(commit.to_owned()),
        label: None,
    });
    let t = spec.resolve_in(provisioner.hosts(), registry)?;
    if !matches!(t.revision, toolkit::Revision::Commit(_)) {
        return Err(Error::field(
            Code::InvalidArgument,
            "commit",
            "must be an exact commit id (40 or 64 lowercase hex digits)",
        ));
    }
    provisioner.acquire(&t)
}

/// Moves the pin of `id` to `commit`: acquired first (nothing changes if that fails), the
/// pin before it kept in the history.
/// With `expected`, the move is CONFLICT if the pin is no longer that commit (another
/// operator moved it since the move was compared).
pub fn pin(
    db: &Db,
    provisioner: &Provisioner,
    id: &str,
    commit: &str,
    reason: Option<&str>,
    expected: Option<&str>,
    actor: &str,
) -> Result<Pin> {
    let registry = load(db)?;
    let entry = registry.find(id).ok_or_else(|| unknown(id))?;
    // Checked before the fetch, and again in the write (another move may come between).
    let pinned = entry.pin.as_ref().map(|p| p.commit.as_str());
    if let Some(expected) = expected.filter(|e| pinned != Some(*e)) {
        return Err(moved_since(expected, pinned));
    }
    if reason.is_some_and(|r| r.len() > 1000 || r.chars().any(char::is_control)) {
        return Err(Error::field(
            Code::InvalidArgument,
            "reason",
            "at most 1000 bytes without control characters",
        ));
    }
    let acquired = acquire(provisioner, &registry, id, commit)?;
    let pin = Pin {
        id: state::new_id("pin"),
        commit: acquired.record.key.commit.clone(),
        actor: actor.to_owned(),
        reason: reason.map(str::to_owned),
        created_at: state::now_ms(),
        superseded_at: None,
    };
    db.write(|tx| {
        let before: Option<String> = tx
            .query_row(
                "UPDATE pins SET superseded_at = $1 WHERE entry_id = $2 AND superseded_at IS NULL RETURNING commit_id",
                params![pin.created_at, id],
                |r| r.get(0),
            )
            .optional()
            .map_err(state::internal)?;
        if let Some(expected) = expected.filter(|e| before.as_deref() != Some(*e)) {
            return Err(moved_since(expected, before.as_deref()));
        }
        tx.execute(
            "INSERT INTO pins (id, entry_id, commit_id, actor, reason, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
            params![pin.id, id, pin.commit, actor, reason, pin.created_at],
        )
        .map_err(state::internal)?;
        audit::record(
            tx,
            actor,
            "pin.move",
            &format!("registry:{id}"),
            &json!({ "from": before, "to": pin.commit, "bundle": acquired.record.bundle, "reason": reason, "reach": acquired.record.reach, "allowedBy": acquired.allowed_unreachable }),
        )
    })?;
    Ok(pin)
}

fn moved_since(expected: &str, pinned: Option<&str>) -> Error {
    Error::field(
        Code::Conflict,
        "from",
        format!(
            "the pin moved since it was compared with {}: it is at {}",
            shown(expected),
            pinned.unwrap_or("no commit")
        ),
    )
}

/// Every pin `id` has had, newest first.
pub fn history(db: &Db, id: &str) -> Result<Vec<Pin>> {
    load(db)?.find(id).ok_or_else(|| unknown(id))?;
    db.with(|c| {
        c.prepare_cached(
            "SELECT id, commit_id, actor, reason, created_at, superseded_at FROM pins WHERE entry_id = $1
             ORDER BY created_at DESC, superseded_at IS NULL DESC",
        )?
        .query_map(params![id], pin_row)?
        .collect()
    })
}

/// Moves the pin of `id` back to the commit it had before the current one.
pub fn rollback(db: &Db, provisioner: &Provisioner, id: &str, actor: &str) -> Result<Pin> {
    let pins = history(db, id)?;
    let previous = pins
        .iter()
        .find(|p| p.superseded_at.is_some() && Some(&p.commit) != pins.first().map(|c| &c.commit))
        .ok_or_else(|| {
            Error::field(
                Code::Conflict,
                "id",
                format!("{id} has no earlier pin to roll back to"),
            )
        })?;
    let reason = format!("rollback to the pin of {}", previous.id);
    pin(
        db,
        provisioner,
        id,
        &previous.commit.clone(),
        Some(&reason),
        None,
        actor,
    )
}

/// A new entry, pinned at `commit` (acquired first: an entry that cannot be fetched is not
/// added).
pub struct NewEntry {
    pub id: String,
    pub name: String,
    pub description: String,
    pub url: String,
    pub layout: Layout,
    pub default_scope: Scope,
    pub session_start_skill: Option<String>,
    pub commit: String,
    /// What opens do with its skills that break the Agent Skills specification.
    pub validation: Validation,
    /// Allow `commit` though no branch or tag of `url` reaches it (audited with the entry).
    pub allow_unreachable: bool,
}

/// An entry id: `owner/name`, each part 1-64 of letters, digits, `.`, `_` and `-`.
fn check_entry_id(id: &str) -> Result<()> {
    let part = |p: &str| {
        (1..=64).contains(&p.len())
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && !p.starts_with('.')
    };
    match id.split_once('/') {
        Some((a, b)) if part(a) && part(b) => Ok(()),
        _ => Err(Error::field(
            Code::InvalidArgument,
            "id",
            format!(
                "{:?} is not `owner/name` (letters, digits, '.', '_', '-')",
                shown(id)
            ),
        )),
    }
}

pub fn add(db: &Db, provisioner: &Provisioner, new: NewEntry, actor: &str) -> Result<Entry> {
    check_entry_id(&new.id)?;
    check_text("name", &new.name, 200)?;
    check_text("description", &new.description, 1024)?;
    provisioner.hosts().check(&new.url, "url")?;
    new.layout.validate()?;
    if let Some(s) = &new.session_start_skill {
        if !cloud_harness_skills::skill::is_spec_name(s) {
            return Err(Error::field(
                Code::InvalidArgument,
                "sessionStartSkill",
                "not a skill name",
            ));
        }
    }
    let allow_unreachable = new
        .allow_unreachable
        .then(|| reachability::check_commit(&new.commit))
        .transpose()?;
    let mut registry = load(db)?;
    if registry.find(&new.id).is_some() {
        return Err(Error::field(
            Code::Conflict,
            "id",
            format!("the registry has {:?} already", new.id),
        ));
    }
    let preset = Preset {
        id: new.id.clone(),
        name: new.name,
        description: new.description,
        url: new.url,
        tested_commit: new.commit.clone(),
        // The entry's column holds the policy, whatever the layout said.
        layout: Layout {
            validation: Validation::Warn,
            ..new.layout
        },
        default_scope: new.default_scope,
        session_start_skill: new.session_start_skill,
    };
    registry.put(Entry {
        preset: preset.clone(),
        origin: "operator".into(),
        pin: None,
        validation: new.validation,
        allow_unreachable: allow_unreachable.clone(),
        labels: Default::default(),
    });
    let acquired = acquire(provisioner, &registry, &preset.id, &new.commit)?;
    let now = state::now_ms();
    let pin = Pin {
        id: state::new_id("pin"),
        commit: acquired.record.key.commit.clone(),
        actor: actor.to_owned(),
        reason: Some("added".into()),
        created_at: now,
        superseded_at: None,
    };
    db.write(|tx| {
        tx.execute(
            "INSERT INTO registry_entries (id, name, description, url, layout, default_scope, session_start_skill, origin, created_at, created_by, validation, allow_unreachable)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'operator', $8, $9, $10, $11)",
            params![
                preset.id, preset.name, preset.description, preset.url,
                serde_json::to_string(&preset.layout).expect("layouts serialize"),
                scope_str(preset.default_scope), preset.session_start_skill, now, actor,
                validation_str(new.validation), allow_unreachable
            ],
        )
        .map_err(|e| if state::is_constraint(&e) { Error::field(Code::Conflict, "id", format!("the registry has {:?} already", preset.id)) } else { state::internal(e) })?;
        tx.execute(
            "INSERT INTO pins (id, entry_id, commit_id, actor, reason, created_at) VALUES ($1, $2, $3, $4, 'added', $5)",
            params![pin.id, preset.id, pin.commit, actor, now],
        )
        .map_err(state::internal)?;
        audit::record(tx, actor, "registry.add", &format!("registry:{}", preset.id), &json!({ "url": preset.url, "commit": pin.commit, "validation": new.validation, "allowUnreachable": allow_unreachable }))
    })?;
    Ok(Entry {
        preset,
        origin: "operator".into(),
        pin: Some(pin),
        validation: new.validation,
        allow_unreachable,
        labels: Default::default(),
    })
}

/// Sets what opens of the entry `id` do with skills that break the Agent Skills
/// specification (audited as `registry.validation`).
pub fn set_validation(db: &Db, id: &str, validation: Validation, actor: &str) -> Result<Entry> {
    let mut entry = load(db)?.find(id).cloned().ok_or_else(|| {
        Error::field(
            Code::NotFound,
            "id",
            format!("no registry entry {:?}", shown(id)),
        )
    })?;
    db.write(|tx| {
        tx.execute(
            "UPDATE registry_entries SET validation = $1 WHERE id = $2",
            params![validation_str(validation), id],
        )
        .map_err(state::internal)?;
        audit::record(
            tx,
            actor,
            "registry.validation",
            &format!("registry:{id}"),
            &json!({ "from": entry.validation, "to": validation }),
        )
    })?;
    entry.validation = validation;
    Ok(entry)
}

/// Lets the entry `id` serve `commit` though no branch or tag of its repository reaches it
/// (one commit per entry, in place of the one before; `None`: none), audited as
/// `registry.reachability` with `reason`, required when allowing.
pub fn allow_unreachable(
    db: &Db,
    id: &str,
    commit: Option<&str>,
    reason: Option<&str>,
    actor: &str,
) -> Result<Entry> {
    let entry = load(db)?.find(id).cloned().ok_or_else(|| unknown(id))?;
    reachability::allow_unreachable(db, entry, commit, reason, actor)
}

/// A policy as the database keeps it.
pub fn validation_str(v: Validation) -> &'static str {
    match v {
        Validation::Warn => "warn",
        Validation::Refuse => "refuse",
    }
}

/// A policy read back from the database: anything but `warn` refuses (a value this binary
/// does not know is never read as the lenient one).
pub fn validation_from(s: &str) -> Validation {
    if s == "warn" {
        Validation::Warn
    } else {
        Validation::Refuse
    }
}

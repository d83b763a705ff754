//! Launch conflicts: every `workspace_open` refused because two sources of one tier define a
//! skill differently is recorded — the request, the skill, each candidate's source, commit,
//! digest and SKILL.md — so an operator can settle it (an override of the skill with the chosen
//! source) instead of someone guessing; the same request then opens. The same conflict asked
//! again counts on its record rather than making another.

use crate::decisions;
use cloud_harness_control::audit;
use cloud_harness_control::params;
use cloud_harness_control::state::Optional;
use cloud_harness_control::state::{self, Db};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Kind, Store};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::Path;

/// How much of each candidate's SKILL.md a record keeps.
const MAX_SKILL_MD: u64 = 64 << 10;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchConflict {
    pub id: String,
    pub skill: String,
    pub tier: String,
    /// Each with `source`, `toolkit`, `url`, `commit`, `digest`, `path` and `skillMd`.
    pub candidates: Value,
    /// The `workspace_open` arguments that met it (the last time).
    pub request: Value,
    pub first_at: i64,
    pub last_at: i64,
    pub refusals: i64,
    pub actor: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub override_id: Option<String>,
}

/// The SKILL.md of the skill folder `digest`, as text (lossy), at most [`MAX_SKILL_MD`].
fn skill_md(store: &Store, digest: &Digest) -> Option<String> {
    let tree = store.tree(digest).ok()?;
    let entry = tree
        .entries()
        .iter()
        .find(|e| e.name == "SKILL.md" && matches!(e.kind, Kind::File | Kind::Executable))?;
    let bytes = store.blob_up_to(&entry.digest, MAX_SKILL_MD).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Records the conflicts a refused open met (`error` is its error; anything but a skill
/// conflict is not one); the ids of their records.
pub fn record(
    db: &Db,
    store: &Store,
    request: &Value,
    error: &Error,
    actor: &str,
) -> Result<Vec<String>> {
    let Some(conflicts) = error.details.get("conflicts").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    if error.code != Code::Conflict {
        return Ok(Vec::new());
    }
    let mut ids = Vec::new();
    // One refused open records at most this many of its conflicts (it names them all).
    for c in conflicts.iter().take(MAX_PER_OPEN) {
        let skill = c["skill"].as_str().unwrap_or_default().to_owned();
        let tier = c["tier"].as_str().unwrap_or_default().to_owned();
        let mut candidates = c["candidates"].as_array().cloned().unwrap_or_default();
        for cand in &mut candidates {
            if let Some(d) = cand["digest"].as_str().and_then(|d| Digest::parse(d).ok()) {
                cand["skillMd"] = json!(skill_md(store, &d));
            }
        }
        // The same conflict: the same skill between the same copies.
        let mut key: Vec<String> = candidates
            .iter()
            .map(|c| {
                format!(
                    "{}@{}",
                    c["source"].as_str().unwrap_or(""),
                    c["digest"].as_str().unwrap_or("")
                )
            })
            .collect();
        key.sort();
        let key = Digest::of(format!("{skill}\n{}", key.join("\n")).as_bytes()).hex();
        let id = db.write(|tx| {
            let now = state::now_ms();
            let existing: Option<String> = tx
                .query_row(
                    "UPDATE launch_conflicts SET last_at = $1, refusals = refusals + 1, request = $2
                     WHERE actor = $3 AND conflict_key = $4 AND settled_at IS NULL RETURNING id",
                    params![now, request.to_string(), actor, key],
                    |r| r.get(0),
                )
                .optional()
                .map_err(state::internal)?;
            if let Some(id) = existing {
                return Ok(id);
            }
            let id = state::new_id("cfl");
            tx.execute(
                "INSERT INTO launch_conflicts (id, conflict_key, skill, tier, candidates, request, first_at, last_at, refusals, actor)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $7, 1, $8)",
                params![id, key, skill, tier, Value::Array(candidates.clone()).to_string(), request.to_string(), now, actor],
            )
            .map_err(state::internal)?;
            // A caller can make many distinct conflicts: their rows are throttled like refusals.
            let subject = format!("skill:{skill}");
            if let Some(repeated) = audit::admit_refusal(actor, "conflict.recorded", &subject) {
                audit::record(tx, actor, "conflict.recorded", &subject, &json!({ "id": id, "tier": tier, "repeated": repeated }))?;
            }
            Ok(id)
        })?;
        ids.push(id);
    }
    Ok(ids)
}

fn row(r: &state::Row) -> state::DbResult<LaunchConflict> {
    let candidates: String = r.get("candidates")?;
    let request: String = r.get("request")?;
    Ok(LaunchConflict {
        id: r.get("id")?,
        skill: r.get("skill")?,
        tier: r.get("tier")?,
        candidates: serde_json::from_str(&candidates).unwrap_or(Value::Null),
        request: serde_json::from_str(&request).unwrap_or(Value::Null),
        first_at: r.get("first_at")?,
        last_at: r.get("last_at")?,
        refusals: r.get("refusals")?,
        actor: r.get("actor")?,
        settled_at: r.get("settled_at")?,
        settled_by: r.get("settled_by")?,
        override_id: r.get("override_id")?,
    })
}

const COLUMNS: &str = "id, skill, tier, candidates, request, first_at, last_at, refusals, actor, settled_at, settled_by, override_id";

/// Conflicts one refused open records at most.
pub(crate) const MAX_PER_OPEN: usize = 16;

/// The records, unsettled first, latest first.
pub fn list(db: &Db, include_settled: bool) -> Result<Vec<LaunchConflict>> {
    list_of(db, include_settled, None)
}

/// The records the principal `actor` met (all when `None`), unsettled first, latest first.
pub fn list_of(db: &Db, include_settled: bool, actor: Option<&str>) -> Result<Vec<LaunchConflict>> {
    db.with(|c| {
        c.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM launch_conflicts WHERE ($1 OR settled_at IS NULL)
               AND (CAST($2 AS TEXT) IS NULL OR actor = $2)
             ORDER BY settled_at IS NOT NULL, last_at DESC, id"
        ))?
        .query_map(params![include_settled, actor], row)?
        .collect()
    })
}

pub fn get(db: &Db, id: &str) -> Result<LaunchConflict> {
    db.with(|c| {
        c.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM launch_conflicts WHERE id = $1"
        ))?
        .query_row(params![id], row)
        .optional()
    })?
    .ok_or_else(|| not_found(id))
}

pub fn not_found(id: &str) -> Error {
    Error::field(
        Code::NotFound,
        "id",
        format!(
            "no launch conflict {:?}",
            cloud_harness_control::input::shown(id)
        ),
    )
}

/// Settles the conflict `id`: `source` (one of its candidates) serves the skill from now on.
/// Makes the override, and marks settled every open record of the same skill.
pub fn settle(
    db: &Db,
    home: &Path,
    id: &str,
    source: &str,
    set: Option<&str>,
    reason: Option<&str>,
    actor: &str,
) -> Result<decisions::Decision> {
    let conflict = get(db, id)?;
    if conflict.settled_at.is_some() {
        return Err(Error::field(
            Code::Conflict,
            "id",
            format!("launch conflict {id} is settled already"),
        ));
    }
    let sources: Vec<&str> = conflict
        .candidates
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["source"].as_str()).collect())
        .unwrap_or_default();
    if !sources.contains(&source) {
        return Err(Error::field(
            Code::InvalidArgument,
            "source",
            format!(
                "{:?} is not a candidate of this conflict: {}",
                cloud_harness_control::input::shown(source),
                sources.join(", ")
            ),
        ));
    }
    let new = decisions::NewOverride {
        skill: &conflict.skill,
        source,
        set,
        reason,
    };
    decisions::set_override_with(db, home, &new, actor, |tx, override_id| {
        tx.execute(
            "UPDATE launch_conflicts SET settled_at = $1, settled_by = $2, override_id = $3
             WHERE skill = $4 AND settled_at IS NULL",
            params![state::now_ms(), actor, override_id, conflict.skill],
        )
        .map_err(state::internal)?;
        audit::record(
            tx,
            actor,
            "conflict.settle",
            &format!("skill:{}", conflict.skill),
            &json!({ "id": id, "source": source, "set": set, "override": override_id }),
        )
    })
}

//! What only an operator decides: overrides of same-tier conflicts (which source serves a
//! skill) and approvals of skill digests for `skills_run`. Each has who, when and an optional
//! reason, and is revoked rather than deleted. Decisions made through the API and the CLI live
//! in the database; those declared in `<home>/operator.json` are *managed*: in force and
//! shown, but changed only by editing the file (configuration management owns them).

use cloud_harness_control::audit;
use cloud_harness_control::input::{check_text, shown};
use cloud_harness_control::operator::Operator;
use cloud_harness_control::params;
use cloud_harness_control::state::Optional;
use cloud_harness_control::state::{self, Db};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_skills::resolver::Override;
use cloud_harness_store::cas::Digest;
use serde::Serialize;
use serde_json::json;
use std::path::Path;

const MAX_SOURCE: usize = 255;
const MAX_REASON: usize = 1000;

/// One decision as listings show it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// `managed` for one of operator.json.
    pub id: String,
    pub actor: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
    pub managed: bool,
    #[serde(flatten)]
    pub what: What,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase", untagged)]
pub enum What {
    Override {
        skill: String,
        source: String,
        /// The set whose workspaces it applies to; none: every workspace.
        #[serde(skip_serializing_if = "Option::is_none")]
        set: Option<String>,
    },
    Approval {
        digest: Digest,
        #[serde(skip_serializing_if = "Option::is_none")]
        skill: Option<String>,
    },
}

/// The decisions in force: what opens and runs read.
#[derive(Debug, Clone, Default)]
pub struct InForce {
    /// Managed ones (operator.json), then the database's: each with the set it is for.
    overrides: Vec<(Override, Option<String>)>,
    /// How many of `overrides` are managed.
    managed: usize,
    pub approved: Vec<Digest>,
}

impl InForce {
    pub fn is_approved(&self, digest: &Digest) -> bool {
        self.approved.contains(digest)
    }

    /// The overrides of a workspace whose toolkits came from `sets` (and the request): for each
    /// skill a managed one, else one for one of those sets, else a global one.
    pub fn overrides_for(&self, sets: &[String]) -> Vec<Override> {
        let mut out: Vec<Override> = Vec::new();
        let rank = |set: &Option<String>| match set {
            Some(s) if sets.contains(s) => Some(1),
            Some(_) => None,
            None => Some(2),
        };
        let mut best: std::collections::BTreeMap<&str, (u8, &Override)> = Default::default();
        for (i, (o, set)) in self.overrides.iter().enumerate() {
            // Managed ones come first and win.
            let Some(r) = (if i < self.managed { Some(0) } else { rank(set) }) else {
                continue;
            };
            let slot = best.entry(o.skill.as_str()).or_insert((r, o));
            if r < slot.0 {
                *slot = (r, o);
            }
        }
        out.extend(best.into_values().map(|(_, o)| o.clone()));
        out
    }
}

fn check_reason(reason: Option<&str>) -> Result<()> {
    reason.map_or(Ok(()), |r| check_text("reason", r, MAX_REASON))
}

pub(crate) fn check_skill(skill: &str) -> Result<()> {
    if cloud_harness_skills::skill::is_spec_name(skill) {
        Ok(())
    } else {
        Err(Error::field(
            Code::InvalidArgument,
            "skill",
            format!(
                "{:?} is not a skill name: 1-64 lowercase letters, digits and single hyphens",
                shown(skill)
            ),
        ))
    }
}

pub fn in_force(db: &Db, home: &Path) -> Result<InForce> {
    let managed = Operator::load(home)?;
    let mut overrides: Vec<(Override, Option<String>)> =
        managed.overrides.into_iter().map(|o| (o, None)).collect();
    let managed_count = overrides.len();
    let mut approved = managed.approved_skills;
    let (db_overrides, db_approved) = db.with(|c| {
        let o = c
            .prepare_cached(
                "SELECT skill, source, set_id FROM overrides WHERE revoked_at IS NULL ORDER BY skill",
            )?
            .query_map(params![], |r| {
                Ok((
                    Override {
                        skill: r.get(0)?,
                        source: r.get(1)?,
                    },
                    r.get::<Option<String>>(2)?,
                ))
            })?
            .collect::<state::DbResult<Vec<_>>>()?;
        let a = c
            .prepare_cached("SELECT digest FROM approvals WHERE revoked_at IS NULL")?
            .query_map(params![], |r| r.get::<String>(0))?
            .collect::<state::DbResult<Vec<_>>>()?;
        Ok((o, a))
    })?;
    overrides.extend(db_overrides);
    approved.extend(db_approved.iter().filter_map(|d| Digest::parse(d).ok()));
    Ok(InForce {
        overrides,
        managed: managed_count,
        approved,
    })
}

fn managed(home: &Path) -> Result<Vec<Decision>> {
    let m = Operator::load(home)?;
    let file = Operator::path(home).display().to_string();
    let decision = |what| Decision {
        id: "managed".into(),
        actor: format!("file:{file}"),
        reason: None,
        created_at: 0,
        revoked_at: None,
        revoked_by: None,
        managed: true,
        what,
    };
    let mut all: Vec<Decision> = m
        .overrides
        .into_iter()
        .map(|o| {
            decision(What::Override {
                skill: o.skill,
                source: o.source,
                set: None,
            })
        })
        .collect();
    all.extend(m.approved_skills.into_iter().map(|digest| {
        decision(What::Approval {
            digest,
            skill: None,
        })
    }));
    Ok(all)
}

fn decision_row(r: &state::Row, what: What) -> state::DbResult<Decision> {
    Ok(Decision {
        id: r.get("id")?,
        actor: r.get("actor")?,
        reason: r.get("reason")?,
        created_at: r.get("created_at")?,
        revoked_at: r.get("revoked_at")?,
        revoked_by: r.get("revoked_by")?,
        managed: false,
        what,
    })
}

/// Every decision: managed ones first, then the database's, newest first.
pub fn list(db: &Db, home: &Path, include_revoked: bool) -> Result<Vec<Decision>> {
    let mut all = managed(home)?;
    let stored = db.with(|c| {
        let mut all = Vec::new();
        let mut q = c.prepare_cached(
            "SELECT id, skill, source, set_id, actor, reason, created_at, revoked_at, revoked_by FROM overrides
             WHERE ($1 OR revoked_at IS NULL) ORDER BY created_at DESC, id",
        )?;
        for d in q.query_map(params![include_revoked], |r| {
            let what = What::Override { skill: r.get("skill")?, source: r.get("source")?, set: r.get("set_id")? };
            decision_row(r, what)
        })? {
            all.push(d?);
        }
        let mut q = c.prepare_cached(
            "SELECT id, digest, skill, actor, reason, created_at, revoked_at, revoked_by FROM approvals
             WHERE ($1 OR revoked_at IS NULL) ORDER BY created_at DESC, id",
        )?;
        for d in q.query_map(params![include_revoked], |r| {
            let digest: String = r.get("digest")?;
            let what = What::Approval {
                digest: Digest::parse(&digest).unwrap_or(Digest([0; 32])),
                skill: r.get("skill")?,
            };
            decision_row(r, what)
        })? {
            all.push(d?);
        }
        Ok(all)
    })?;
    all.extend(stored);
    Ok(all)
}

/// What an override says: serve `skill` from `source`, in the workspaces of `set` (or all).
pub struct NewOverride<'a> {
    pub skill: &'a str,
    pub source: &'a str,
    pub set: Option<&'a str>,
    pub reason: Option<&'a str>,
}

/// Serves the skill from the source from now on (workspaces opened after it); an override of
/// the same skill and set made before is revoked by it, in the same transaction.
pub fn set_override(db: &Db, home: &Path, new: &NewOverride, actor: &str) -> Result<Decision> {
    set_override_with(db, home, new, actor, |_, _| Ok(()))
}

/// [`set_override`], with `also` done in the same transaction (given the override's id).
pub(crate) fn set_override_with(
    db: &Db,
    home: &Path,
    new: &NewOverride,
    actor: &str,
    also: impl FnOnce(&state::Conn, &str) -> Result<()>,
) -> Result<Decision> {
    let NewOverride {
        skill,
        source,
        set,
        reason,
    } = *new;
    check_skill(skill)?;
    check_text("source", source, MAX_SOURCE)?;
    check_reason(reason)?;
    if let Some(set) = set {
        crate::sets::get(db, set, None).map_err(|e| Error::field(e.code, "set", e.message))?;
    }
    if Operator::load(home)?
        .overrides
        .iter()
        .any(|o| o.skill == skill)
    {
        return Err(Error::field(
            Code::Conflict,
            "skill",
            format!(
                "the override of `{skill}` is managed in {}; change it there",
                Operator::path(home).display()
            ),
        ));
    }
    let decision = Decision {
        id: state::new_id("ovr"),
        actor: actor.to_owned(),
        reason: reason.map(str::to_owned),
        created_at: state::now_ms(),
        revoked_at: None,
        revoked_by: None,
        managed: false,
        what: What::Override {
            skill: skill.to_owned(),
            source: source.to_owned(),
            set: set.map(str::to_owned),
        },
    };
    db.write(|tx| {
        let superseded: Option<String> = tx
            .query_row(
                "UPDATE overrides SET revoked_at = $1, revoked_by = $2
                 WHERE skill = $3 AND COALESCE(set_id, '') = COALESCE($4, '') AND revoked_at IS NULL RETURNING id",
                params![decision.created_at, actor, skill, set],
                |r| r.get(0),
            )
            .optional()
            .map_err(state::internal)?;
        tx.execute(
            "INSERT INTO overrides (id, skill, source, set_id, actor, reason, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            params![decision.id, skill, source, set, actor, reason, decision.created_at],
        )
        .map_err(state::internal)?;
        audit::record(
            tx,
            actor,
            "override.set",
            &format!("skill:{skill}"),
            &json!({ "id": decision.id, "source": source, "set": set, "reason": reason, "supersedes": superseded }),
        )?;
        also(tx, &decision.id)
    })?;
    Ok(decision)
}

/// Lets the scripts of the skill folder `digest` run; CONFLICT if it already may.
pub fn approve(
    db: &Db,
    digest: &Digest,
    skill: Option<&str>,
    reason: Option<&str>,
    actor: &str,
) -> Result<Decision> {
    if let Some(s) = skill {
        check_skill(s)?;
    }
    check_reason(reason)?;
    let decision = Decision {
        id: state::new_id("apr"),
        actor: actor.to_owned(),
        reason: reason.map(str::to_owned),
        created_at: state::now_ms(),
        revoked_at: None,
        revoked_by: None,
        managed: false,
        what: What::Approval {
            digest: *digest,
            skill: skill.map(str::to_owned),
        },
    };
    db.write(|tx| {
        tx.execute(
            "INSERT INTO approvals (id, digest, skill, actor, reason, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
            params![decision.id, digest.to_string(), skill, actor, reason, decision.created_at],
        )
        .map_err(|e| {
            if state::is_constraint(&e) {
                Error::field(Code::Conflict, "digest", format!("{digest} is approved already"))
            } else {
                state::internal(e)
            }
        })?;
        audit::record(
            tx,
            actor,
            "approval.grant",
            &format!("skill:{digest}"),
            &json!({ "id": decision.id, "skill": skill, "reason": reason }),
        )
    })?;
    Ok(decision)
}

/// The two kinds of decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Override,
    Approval,
}

/// Revokes the decision `id` of `kind`: NOT_FOUND unless it is in force.
pub fn revoke(db: &Db, kind: Kind, id: &str, reason: Option<&str>, actor: &str) -> Result<()> {
    check_reason(reason)?;
    let (table, prefix) = match kind {
        Kind::Override => ("overrides", "ovr_"),
        Kind::Approval => ("approvals", "apr_"),
    };
    if !id.starts_with(prefix) {
        return Err(Error::field(
            Code::NotFound,
            "id",
            format!(
                "no {table} decision {:?} (managed decisions are changed in operator.json)",
                shown(id)
            ),
        ));
    }
    db.write(|tx| {
        let subject: Option<String> = tx
            .query_row(
                &format!(
                    "UPDATE {table} SET revoked_at = $1, revoked_by = $2 WHERE id = $3 AND revoked_at IS NULL
                     RETURNING {}",
                    if table == "overrides" { "skill" } else { "digest" }
                ),
                params![state::now_ms(), actor, id],
                |r| r.get(0),
            )
            .optional()
            .map_err(state::internal)?;
        let subject = subject.ok_or_else(|| {
            Error::field(Code::NotFound, "id", format!("no decision {:?} in force", shown(id)))
        })?;
        let action = if table == "overrides" { "override.revoke" } else { "approval.revoke" };
        audit::record(tx, actor, action, &format!("skill:{subject}"), &json!({ "id": id, "reason": reason }))
    })
}

/// A `skills_run` refused for want of an approval: kept as a pending request (the latest
/// script asked for, how often) and audited.
pub fn refused_run(
    db: &Db,
    digest: &Digest,
    skill: &str,
    script: &str,
    workspace: &str,
    actor: &str,
) -> Result<()> {
    db.write(|tx| {
        let now = state::now_ms();
        tx.execute(
            "INSERT INTO run_requests (digest, skill, script, workspace, first_at, last_at, refusals)
             VALUES ($1, $2, $3, $4, $5, $5, 1)
             ON CONFLICT (digest) DO UPDATE SET script = $3, workspace = $4, last_at = $5,
                 refusals = run_requests.refusals + 1",
            params![digest.to_string(), skill, script, workspace, now],
        )
        .map_err(state::internal)?;
        // The pending request counts every refusal; the audit log gets a row a minute.
        let subject = format!("skill:{digest}");
        match audit::admit_refusal(actor, "run.refused", &subject) {
            Some(repeated) => audit::record(
                tx,
                actor,
                "run.refused",
                &subject,
                &json!({ "skill": skill, "script": script, "workspace": workspace, "repeated": repeated }),
            ),
            None => Ok(()),
        }
    })
}

/// A run waiting for an approval.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    pub digest: String,
    pub skill: String,
    pub script: String,
    pub workspace: String,
    pub first_at: i64,
    pub last_at: i64,
    pub refusals: i64,
}

/// Refused runs of skills that are still not approved, latest first.
pub fn pending(db: &Db, home: &Path) -> Result<Vec<Pending>> {
    let force = in_force(db, home)?;
    let all = db.with(|c| {
        c.prepare_cached(
            "SELECT digest, skill, script, workspace, first_at, last_at, refusals FROM run_requests ORDER BY last_at DESC",
        )?
        .query_map(params![], |r| {
            Ok(Pending {
                digest: r.get(0)?,
                skill: r.get(1)?,
                script: r.get(2)?,
                workspace: r.get(3)?,
                first_at: r.get(4)?,
                last_at: r.get(5)?,
                refusals: r.get(6)?,
            })
        })?
        .collect::<state::DbResult<Vec<_>>>()
    })?;
    Ok(all
        .into_iter()
        .filter(|p| Digest::parse(&p.digest).is_ok_and(|d| !force.is_approved(&d)))
        .collect())
}

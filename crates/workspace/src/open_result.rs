//! What `workspace_open` returns: the toolkits as acquired and judged, the skills served and
//! shadowed, the executor, the warnings.

use super::{Workspace, Workspaces};
use cloud_harness_control::signatures::verdict::Verdict;
use cloud_harness_control::toolkit;
use cloud_harness_provision::Acquired;
use serde_json::{json, Value};

impl Workspaces {
    /// What `workspace_open` returns (and returns again for the same key).
    pub(super) fn open_result(
        &self,
        ws: &Workspace,
        acquired: &[(toolkit::Toolkit, Acquired)],
        verdicts: &[Option<Verdict>],
        repository: Value,
        warnings: Vec<String>,
    ) -> Value {
        let toolkits: Vec<Value> = acquired
            .iter()
            .zip(verdicts)
            .map(|((t, a), verdict)| {
                let mut listed = json!({
                    "instanceId": t.instance_id,
                    "preset": t.preset,
                    "scope": t.scope,
                    "url": a.record.key.url,
                    "commit": a.record.key.commit,
                    "bundle": a.record.bundle,
                    "manifest": a.record.manifest,
                    "skillCount": a.record.skills,
                    "warnings": a.record.warnings,
                    "skipped": a.record.skipped,
                    "warm": a.warm,
                    "mode": a.mode,
                    "reach": a.record.reach,
                    "allowedUnreachable": a.allowed_unreachable,
                });
                if let Some(label) = &t.label {
                    listed["label"] = json!(label);
                }
                if let Some(v) = verdict {
                    listed["signature"] = json!(v);
                    listed["served"] = json!(v.served());
                }
                listed
            })
            .collect();
        let g = ws.merged.generation();
        let index = &g.index;
        let skills: Vec<Value> = index
            .winners()
            .map(|c| ws.skill_json(index, c, true))
            .collect();
        let mut shadowed = Vec::new();
        for r in index.resolutions() {
            if let Some(w) = &r.winner {
                for s in &r.shadowed {
                    let mut v = ws.skill_json(index, s, false);
                    v["shadowedBy"] = json!({ "tier": w.tier, "toolkit": ws.toolkit_of(index, w) });
                    shadowed.push(v);
                }
            }
        }
        let settled: Vec<Value> = index
            .resolutions()
            .iter()
            .filter(|r| r.settled_by_override)
            .map(|r| json!({ "skill": r.name, "winner": r.winner.as_ref().map(|w| index.source(w).id.clone()), "settledBy": "operator override" }))
            .collect();
        let session_start = &ws.record.session_start;
        let paths = ws.executor.as_ref().map(|e| e.paths());
        json!({
            "workspace": ws.id,
            "path": paths.as_ref().map(|p| p.workspace.clone()),
            "repository": repository,
            "skillsMount": ws.skills_root(),
            "ownerSkillsMount": ws.skills_root().and(paths.as_ref().map(|p| p.owner_skills())),
            "executor": ws.executor.as_ref().map(|e| e.describe()),
            "generation": g.digest(),
            "provisioning": self.provisioner.provisioning(),
            "toolkits": toolkits,
            "skills": skills,
            "shadowed": shadowed,
            "conflicts": settled,
            "skipped": super::listing::skipped(&json!(toolkits), index, None),
            "sessionStart": if session_start.is_empty() { Value::Null } else { json!(session_start) },
            "warnings": warnings,
        })
    }
}

//! The set form as a browser sends it: the set's fields and one row per member, each turned
//! into the member the API takes.

use crate::dashboard::patterns;
use cloud_harness_auth::http::CSRF_FIELD;
use cloud_harness_control::toolkit::{Scope, ToolkitSpec};
use cloud_harness_error::{Code, Error};
use cloud_harness_skills::spec::Validation;
use serde_json::{json, Value};

/// One member row of the form.
#[derive(Default, Clone)]
pub struct Row {
    /// A registry entry id, `git`, or empty (the row is unused).
    pub toolkit: String,
    pub url: String,
    pub git_ref: String,
    pub instance_id: String,
    pub include: String,
    pub exclude: String,
    pub scope: String,
}

impl Row {
    pub fn of(spec: &ToolkitSpec) -> Row {
        let scope = |s: Option<Scope>| match s {
            Some(Scope::Workspace) => "workspace".to_owned(),
            _ => "owner".to_owned(),
        };
        match spec {
            ToolkitSpec::Preset(p) => Row {
                toolkit: p.id.clone(),
                git_ref: p.version.clone().unwrap_or_default(),
                scope: scope(p.scope),
                ..Row::default()
            },
            ToolkitSpec::Git(g) => Row {
                toolkit: "git".into(),
                url: g.url.clone(),
                git_ref: g.git_ref.clone().unwrap_or_default(),
                instance_id: g.instance_id.clone(),
                include: g
                    .skills
                    .as_ref()
                    .map(|s| s.include.join(", "))
                    .unwrap_or_default(),
                exclude: g
                    .skills
                    .as_ref()
                    .map(|s| s.exclude.join(", "))
                    .unwrap_or_default(),
                scope: scope(g.scope),
            },
            ToolkitSpec::Set(_) => Row::default(),
        }
    }

    /// The member the API would be sent; `i` names the row in errors.
    pub fn member(&self, i: usize) -> Result<Value, Error> {
        let mut v = if self.toolkit == "git" {
            let instance = match self.instance_id.trim() {
                "" => crate::dashboard::instance_from_url(&self.url),
                given => given.to_owned(),
            };
            let mut v = json!({ "kind": "git", "url": self.url.trim(), "instanceId": instance });
            if !self.git_ref.trim().is_empty() {
                v["ref"] = json!(self.git_ref.trim());
            }
            let (include, exclude) = (patterns(&self.include), patterns(&self.exclude));
            if !include.is_empty() || !exclude.is_empty() {
                v["skills"] = json!({ "include": include, "exclude": exclude });
            }
            v
        } else {
            if !(self.include.trim().is_empty() && self.exclude.trim().is_empty()) {
                return Err(Error::field(
                    Code::InvalidArgument,
                    &format!("members[{i}].skills"),
                    "a registry entry is taken whole: to pick its skills, add it as a git toolkit (its URL and commit) with include/exclude",
                ));
            }
            let mut v = json!({ "kind": "preset", "id": self.toolkit });
            if !self.git_ref.trim().is_empty() {
                v["version"] = json!(self.git_ref.trim());
            }
            v
        };
        if self.scope == "workspace" {
            v["scope"] = json!("workspace");
        }
        Ok(v)
    }
}

/// The form as sent: the set's fields and its rows, in order, the unused ones dropped.
#[derive(Default)]
pub(crate) struct SetForm {
    pub id: String,
    pub description: String,
    /// Skills that break the Agent Skills specification: `warn` or `refuse`.
    pub validation: Validation,
    pub revision: Option<i64>,
    pub preview: bool,
    pub csrf: String,
    pub rows: Vec<Row>,
}

impl SetForm {
    pub fn parse(fields: Vec<(String, String)>) -> SetForm {
        let mut f = SetForm::default();
        let mut rows: std::collections::BTreeMap<usize, Row> = Default::default();
        for (k, v) in fields {
            match k.as_str() {
                "id" => f.id = v.trim().to_owned(),
                "description" => f.description = v,
                "validation" => {
                    f.validation = if v == "refuse" {
                        Validation::Refuse
                    } else {
                        Validation::Warn
                    }
                }
                "revision" => f.revision = v.parse().ok(),
                "action" => f.preview = v == "preview",
                k if k == CSRF_FIELD => f.csrf = v,
                _ => {
                    let Some((i, field)) = k
                        .strip_prefix('m')
                        .and_then(|k| k.split_once('.'))
                        .and_then(|(i, f)| Some((i.parse::<usize>().ok()?, f)))
                    else {
                        continue;
                    };
                    let row = rows.entry(i).or_default();
                    let slot = match field {
                        "toolkit" => &mut row.toolkit,
                        "url" => &mut row.url,
                        "ref" => &mut row.git_ref,
                        "instanceId" => &mut row.instance_id,
                        "include" => &mut row.include,
                        "exclude" => &mut row.exclude,
                        "scope" => &mut row.scope,
                        _ => continue,
                    };
                    *slot = v;
                }
            }
        }
        f.rows = rows
            .into_values()
            .filter(|r| !r.toolkit.is_empty())
            .collect();
        f
    }

    pub fn members(&self) -> Result<Vec<Value>, Error> {
        self.rows
            .iter()
            .enumerate()
            .map(|(i, r)| r.member(i))
            .collect()
    }
}

impl Row {
    pub(crate) fn instance_id_or_entry(&self) -> String {
        if self.toolkit == "git" {
            self.instance_id.clone()
        } else {
            self.toolkit.clone()
        }
    }
}

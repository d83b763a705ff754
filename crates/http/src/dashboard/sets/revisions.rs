//! A set's revisions, each with the members that differ from the one before it.

use super::form::Row;
use crate::dashboard::layout;
use cloud_harness_control::toolkit::ToolkitSpec;
use cloud_harness_curation::sets::{self, Revision};
use maud::{html, Markup};
use serde_json::Value;
use std::collections::BTreeMap;

/// What a revision changed: the description, a member added or removed (its whole
/// definition), or one field of a member (`kit skills.exclude`), each before and after.
pub type Changes = Vec<(String, Option<String>, Option<String>)>;

pub fn history(
    db: &cloud_harness_control::state::Db,
    id: &str,
) -> cloud_harness_error::Result<Vec<(Revision, Changes)>> {
    let mut all = Vec::new();
    let mut before: Option<Revision> = None;
    for now in sets::every_revision(db, id)? {
        let key = |m: &ToolkitSpec| Row::of(m).instance_id_or_entry();
        let shown = |m: &ToolkitSpec| serde_json::to_string(m).unwrap_or_default();
        let mut changes: Changes = Vec::new();
        if let Some(b) = &before {
            if b.description != now.description {
                changes.push((
                    "description".into(),
                    Some(b.description.clone()),
                    Some(now.description.clone()),
                ));
            }
            for m in &now.members {
                match b.members.iter().find(|o| key(o) == key(m)) {
                    None => changes.push((key(m), None, Some(shown(m)))),
                    Some(o) if o != m => {
                        for (field, was, is) in fields_changed(o, m) {
                            changes.push((format!("{} {field}", key(m)), was, is));
                        }
                    }
                    Some(_) => {}
                }
            }
            for o in &b.members {
                if !now.members.iter().any(|m| key(m) == key(o)) {
                    changes.push((key(o), Some(shown(o)), None));
                }
            }
        }
        before = Some(now.clone());
        all.push((now, changes));
    }
    all.reverse();
    Ok(all)
}

/// A member's fields as `path = value` (nested objects flattened: `skills.include`).
fn fields(m: &ToolkitSpec) -> BTreeMap<String, String> {
    fn walk(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
        match v {
            Value::Object(o) => {
                for (k, v) in o {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&path, v, out);
                }
            }
            other => {
                out.insert(prefix.to_owned(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", &serde_json::to_value(m).unwrap_or_default(), &mut out);
    out
}

/// The fields that differ between two versions of a member: each with its value before and
/// after (`None`: not set).
fn fields_changed(
    was: &ToolkitSpec,
    is: &ToolkitSpec,
) -> Vec<(String, Option<String>, Option<String>)> {
    let (a, b) = (fields(was), fields(is));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (k.clone(), a.get(k).cloned(), b.get(k).cloned()))
        .collect()
}

pub(crate) fn revision_item(
    who: &cloud_harness_auth::Identity,
    id: &str,
    r: &Revision,
    changes: &Changes,
) -> Markup {
    html! {
        p {
            a href={ "/sets/" (id) "?revision=" (r.revision) } { "Revision " (r.revision) }
            " by " (r.actor) ", " (layout::when(r.created_at))
            @if r.revision == 1 { " — made with " (r.members.len()) " member(s)" }
        }
        @if r.revision > 1 && layout::operator(who) {
            form.inline method="post" action={ "/sets/" (id) "/diff" } {
                (layout::csrf(who))
                input type="hidden" name="from" value=(r.revision - 1);
                input type="hidden" name="to" value=(r.revision);
                button type="submit" { "Compare the skills of revisions " (r.revision - 1) " and " (r.revision) }
            }
        }
        @if !changes.is_empty() {
            table.changes { thead { tr { th { "Changed" } th { "Before" } th { "After" } } }
                tbody { @for (what, b, a) in changes { tr {
                    td { (what) }
                    td.removed { @if let Some(b) = b { code { (b) } } @else { em { "(not there)" } } }
                    td.added { @if let Some(a) = a { code { (a) } } @else { em { "(removed)" } } }
                } } }
            }
        }
    }
}

//! A set's revisions, each with the members that differ from the one before it.

use super::form::Row;
use super::layout;
use crate::sets::{self, Revision};
use crate::toolkit::ToolkitSpec;
use maud::{html, Markup};

/// Each revision with the members that differ from the one before (before and after).
pub type Changes = Vec<(String, Option<String>, Option<String>)>;

pub fn history(
    db: &crate::state::Db,
    id: &str,
) -> cloud_harness_fs::Result<Vec<(Revision, Changes)>> {
    let n = sets::get(db, id, None)?.revision;
    let mut all = Vec::new();
    let mut before: Option<Revision> = None;
    for r in 1..=n {
        let now = sets::get(db, id, Some(r))?;
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
                    Some(o) if o != m => changes.push((key(m), Some(shown(o)), Some(shown(m)))),
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

pub fn revision_item(id: &str, r: &Revision, changes: &Changes) -> Markup {
    html! {
        p {
            a href={ "/sets/" (id) "?revision=" (r.revision) } { "Revision " (r.revision) }
            " by " (r.actor) ", " (layout::when(r.created_at))
            @if r.revision == 1 { " — made with " (r.members.len()) " member(s)" }
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

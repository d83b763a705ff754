//! Version labels on the page of what carries them, a registry entry or a set: where each
//! points (and its canary, with its share), a rollback per label, and the form that moves one
//! (made if new).

use super::layout::{self, short};
use cloud_harness_auth::Identity;
use cloud_harness_control::labels::Canary;
use cloud_harness_curation::labels::Move;
use cloud_harness_error::{Code, Error, Result};
use maud::{html, Markup};

/// What carries the labels: what they point at, and how an open names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A registry entry's labels point at commits.
    Entry,
    /// A set's, at revisions.
    Set,
}

/// One label in force.
pub struct Shown<'a> {
    pub name: &'a str,
    pub revision: i64,
    pub value: &'a str,
    pub canary: Option<&'a Canary>,
}

impl Kind {
    /// The form's field, and the column's heading.
    fn field(self) -> (&'static str, &'static str) {
        match self {
            Kind::Entry => ("commit", "Commit"),
            Kind::Set => ("revision", "Revision of the set"),
        }
    }

    fn value(self, v: &str) -> &str {
        match self {
            Kind::Entry => short(v),
            Kind::Set => v,
        }
    }
}

/// The labels on the page `base` (`/registry/{id}`, `/sets/{id}`).
pub fn section(who: &Identity, base: &str, kind: Kind, labels: &[Shown]) -> Markup {
    let operator = layout::operator(who);
    let (field, heading) = kind.field();
    let example = match kind {
        Kind::Entry => "{\"kind\": \"preset\", \"id\": …, \"label\": \"stable\"}",
        Kind::Set => "{\"kind\": \"set\", \"id\": …, \"label\": \"stable\"}",
    };
    html! {
        section aria-labelledby="labels" {
            h2 id="labels" { "Labels" }
            p.hint { "Opens may name a label in place of a " (if kind == Kind::Entry { "version" } else { "revision" }) ": "
                code { (example) }
                ". A canary serves its " (field) " to about its share of new workspaces; a workspace keeps what it opened on." }
            @if labels.is_empty() { p.empty { "No label." } }
            @else {
                table { thead { tr { th { "Label" } th { "Label revision" } th { (heading) } th { "Canary" } @if operator { th { "Rollback" } } } }
                    tbody { @for l in labels { tr {
                        td { code { (l.name) } }
                        td { (l.revision) }
                        td { code { (kind.value(l.value)) } }
                        td { @match l.canary {
                            Some(c) => { code { (kind.value(&c.value)) } " to " (c.percent) "%" }
                            None => { "none" }
                        } }
                        @if operator { td {
                            form method="post" action={ (base) "/labels/" (l.name) "/rollback" } {
                                (layout::csrf(who))
                                input type="hidden" name="from" value=(l.revision);
                                button type="submit" disabled[l.revision < 2] aria-label={ "Roll back " (l.name) } { "Roll back" }
                            }
                        } }
                    } } }
                }
            }
            @if operator {
                form.stack method="post" action={ (base) "/labels" } aria-label="Move a label" {
                    (layout::csrf(who))
                    label { "Label" input type="text" name="label" required pattern="[a-z0-9][a-z0-9._\\-]{0,63}" placeholder="stable"; }
                    label { (heading) input type="text" name=(field) required; }
                    label { "Canary " (field) " (optional)" input type="text" name="canary"; }
                    label { "Canary share, percent" input type="number" name="percent" min="1" max="99"; }
                    label { "Reason" input type="text" name="reason"; }
                    button type="submit" { "Move label" }
                }
            }
        }
    }
}

/// The form that moves a label, as posted.
#[derive(serde::Deserialize)]
pub(crate) struct LabelForm {
    #[serde(default)]
    pub label: String,
    /// An entry's form.
    #[serde(default)]
    commit: String,
    /// A set's form.
    #[serde(default)]
    revision: String,
    #[serde(default)]
    canary: String,
    #[serde(default)]
    percent: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    pub csrf: String,
}

impl LabelForm {
    /// The move the form asks for (a canary if both its value and share are given).
    pub fn to_move(&self, kind: Kind) -> Result<Move> {
        let value = match kind {
            Kind::Entry => self.commit.trim(),
            Kind::Set => self.revision.trim(),
        };
        let (canary, percent) = (self.canary.trim(), self.percent.trim());
        let canary = match (canary.is_empty(), percent.is_empty()) {
            (true, true) => None,
            (false, false) => {
                let percent = percent.parse::<u8>().map_err(|_| {
                    Error::field(
                        Code::InvalidArgument,
                        "canary.percent",
                        "a share from 1 to 99",
                    )
                })?;
                Some((canary.to_owned(), percent))
            }
            _ => {
                return Err(Error::field(
                    Code::InvalidArgument,
                    "canary",
                    "give the canary and its share together",
                ))
            }
        };
        let reason = self.reason.trim();
        Ok(Move {
            value: Some(value.to_owned()),
            canary,
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
            from: None,
        })
    }
}

/// The rollback button's form: the revision shown (a second click on an old page is
/// CONFLICT, not a second rollback).
#[derive(serde::Deserialize)]
pub(crate) struct RollbackForm {
    #[serde(default)]
    from: String,
    #[serde(default)]
    pub csrf: String,
}

impl RollbackForm {
    pub fn from(&self) -> Option<i64> {
        self.from.trim().parse().ok()
    }
}

/// What a rollback did, said on the page.
pub fn rolled_back(l: &cloud_harness_curation::labels::Label) -> Markup {
    html! { p role="status" {
        "Rolled back: " code { (l.name) }
        @if l.value.is_some() { " points where it did before (label revision " (l.revision) ")." }
        @else { " is removed again, as it was before (label revision " (l.revision) ")." }
    } }
}

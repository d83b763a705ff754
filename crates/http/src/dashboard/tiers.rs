//! A resolution drawn as the four tiers side by side: one row per skill name, one column per
//! tier (highest precedence first), each copy marked as what it is — the one served, a copy it
//! shadows, one of a conflict still unsettled, or the winner an operator override chose.

use cloud_harness_skills::resolver::{Candidate, Index, Resolution, Tier};
use maud::{html, Markup};

/// What one copy of a skill is in its resolution.
#[derive(Clone, Copy, PartialEq)]
enum Mark {
    Serves,
    Override,
    Conflict,
    Overridden,
    Shadowed,
}

impl Mark {
    fn label(self) -> &'static str {
        match self {
            Mark::Serves => "serves",
            Mark::Override => "serves (override)",
            Mark::Conflict => "conflict",
            Mark::Overridden => "set aside by override",
            Mark::Shadowed => "shadowed",
        }
    }
    fn class(self) -> &'static str {
        match self {
            Mark::Serves => "copy serves",
            Mark::Override => "copy serves override",
            Mark::Conflict => "copy conflict",
            Mark::Overridden => "copy shadowed",
            Mark::Shadowed => "copy shadowed",
        }
    }
}

fn copies(r: &Resolution) -> Vec<(&Candidate, Mark)> {
    let same = |a: &Candidate, b: &Candidate| a.source == b.source && a.path == b.path;
    let mut all: Vec<(&Candidate, Mark)> = Vec::new();
    if let Some(w) = &r.winner {
        let mark = if r.settled_by_override {
            Mark::Override
        } else {
            Mark::Serves
        };
        all.push((w, mark));
    }
    for c in &r.conflict {
        if !all.iter().any(|(a, _)| same(a, c)) {
            let mark = if r.winner.is_some() {
                Mark::Overridden
            } else {
                Mark::Conflict
            };
            all.push((c, mark));
        }
    }
    for c in &r.shadowed {
        if !all.iter().any(|(a, _)| same(a, c)) {
            // A copy of the winner's own tier lost to the override, not to precedence.
            let overridden =
                r.settled_by_override && r.winner.as_ref().is_some_and(|w| w.tier == c.tier);
            let mark = if overridden {
                Mark::Overridden
            } else {
                Mark::Shadowed
            };
            all.push((c, mark));
        }
    }
    all
}

/// The drawing of `index`; `caption` says whose resolution it is.
pub(crate) fn drawing(index: &Index, caption: &str) -> Markup {
    let rows = index.resolutions();
    html! {
        table.tiers {
            caption { (caption) " — " (rows.len()) " skill names; precedence falls from left to right." }
            thead { tr {
                th scope="col" { "Skill" }
                @for t in Tier::ALL { th scope="col" { (tier_title(t)) } }
            } }
            tbody { @for r in rows {
                @let all = copies(r);
                tr.conflicted[r.winner.is_none()] {
                    th scope="row" {
                        @if let Some(w) = &r.winner {
                            a href={ "/skills/" (w.digest()) } { (r.name) }
                        } @else { (r.name) }
                    }
                    @for t in Tier::ALL { td {
                        @for (c, mark) in all.iter().filter(|(c, _)| c.tier == t) {
                            div class=(mark.class()) {
                                span.mark { (mark.label()) }
                                " " span.source { (index.source(c).id) }
                            }
                        }
                    } }
                }
            } }
        }
    }
}

pub(crate) fn tier_title(t: Tier) -> &'static str {
    match t {
        Tier::Builtin => "Built-in",
        Tier::Owner => "Owner",
        Tier::Workspace => "Workspace",
        Tier::Repository => "Repository",
    }
}

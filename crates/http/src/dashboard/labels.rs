//! A registry entry's version labels on its page: where each points (and its canary, with
//! its share), a rollback per label, and the form that moves one (made if new).

use super::layout::{self, short};
use cloud_harness_auth::Identity;
use cloud_harness_control::labels::Point;
use maud::{html, Markup};
use std::collections::BTreeMap;

/// The labels of the entry whose page is `base`.
pub fn section(who: &Identity, base: &str, labels: &BTreeMap<String, Point>) -> Markup {
    let operator = layout::operator(who);
    html! {
        section aria-labelledby="labels" {
            h2 id="labels" { "Labels" }
            p.hint { "Opens may name a label in place of a version: "
                code { "{\"kind\": \"preset\", \"id\": …, \"label\": \"stable\"}" }
                ". A canary serves its commit to about its share of new workspaces; a workspace keeps the commit it opened on." }
            @if labels.is_empty() { p.empty { "No label." } }
            @else {
                table { thead { tr { th { "Label" } th { "Revision" } th { "Commit" } th { "Canary" } @if operator { th { "Rollback" } } } }
                    tbody { @for (name, p) in labels { tr {
                        td { code { (name) } }
                        td { (p.revision) }
                        td { code { (short(&p.value)) } }
                        td { @match &p.canary {
                            Some(c) => { code { (short(&c.value)) } " to " (c.percent) "%" }
                            None => { "none" }
                        } }
                        @if operator { td {
                            form method="post" action={ (base) "/labels/" (name) "/rollback" } {
                                (layout::csrf(who))
                                input type="hidden" name="from" value=(p.revision);
                                button type="submit" disabled[p.revision < 2] aria-label={ "Roll back " (name) } { "Roll back" }
                            }
                        } }
                    } } }
                }
            }
            @if operator {
                form.stack method="post" action={ (base) "/labels" } aria-label="Move a label" {
                    (layout::csrf(who))
                    label { "Label" input type="text" name="label" required pattern="[a-z0-9][a-z0-9._\\-]{0,63}" placeholder="stable"; }
                    label { "Commit" input type="text" name="commit" required; }
                    label { "Canary commit (optional)" input type="text" name="canary"; }
                    label { "Canary share, percent" input type="number" name="percent" min="1" max="99"; }
                    label { "Reason" input type="text" name="reason"; }
                    button type="submit" { "Move label" }
                }
            }
        }
    }
}

//! What moving a registry entry's pin would change, shown on the entry's page before the
//! operator confirms: the skills added, removed, renamed and changed, each changed skill's
//! files and `SKILL.md` diff, the specification's problems before and after, the open
//! workspaces still serving the current pin; then the form that moves the pin.

use super::layout::{self, short};
use cloud_harness_auth::Identity;
use cloud_harness_curation::bundle_diff::{BundleDiff, Change, FileChange, SkillChange};
use maud::{html, Markup};
use serde_json::Value;

fn change_name(c: Change) -> &'static str {
    match c {
        Change::Added => "added",
        Change::Removed => "removed",
        Change::Renamed => "renamed",
        Change::Changed => "changed",
    }
}

/// The diff, and the form that confirms the move to its `to` commit.
pub fn section(who: &Identity, base: &str, diff: &BundleDiff, serving: &[Value]) -> Markup {
    let count = |c: Change| diff.skills.iter().filter(|s| s.change == c).count();
    html! {
        section.pin-diff aria-labelledby="diff" {
            h2 id="diff" { "What moving the pin changes" }
            p role="status" {
                "From " code { (short(&diff.from.commit)) } " to " code { (short(&diff.to.commit)) } ": "
                (count(Change::Added)) " added, " (count(Change::Removed)) " removed, "
                (count(Change::Renamed)) " renamed, " (count(Change::Changed)) " changed, "
                (diff.unchanged) " unchanged. Skills breaking the Agent Skills specification: "
                (diff.problems_before) " before, " (diff.problems_after) " after."
            }
            @if serving.is_empty() {
                p { "No open workspace serves the current pin's bundle." }
            } @else {
                p.warn {
                    @if serving.len() == 1 { "1 open workspace serves the current pin's bundle, and keeps it until it reopens:" }
                    @else { (serving.len()) " open workspaces serve the current pin's bundle, and keep it until they reopen:" }
                }
                ul.serving { @for s in serving {
                    li { a href={ "/workspaces/" (s["workspace"].as_str().unwrap_or("")) } { (s["workspace"].as_str().unwrap_or("")) }
                        " (" (s["owner"].as_str().unwrap_or("")) ")" }
                } }
            }
            @if diff.skills.is_empty() { p.empty { "No skill changes: the two bundles serve the same skills." } }
            @for s in &diff.skills { (skill(s)) }
            @if diff.files_left_out > 0 {
                p.warn { (diff.files_left_out) " more changed files are not listed." }
            }
            form.stack method="post" action={ (base) "/pin" } aria-label="Confirm the move" {
                (layout::csrf(who))
                input type="hidden" name="commit" value=(diff.to.commit);
                label { "Reason" input type="text" name="reason"; }
                button type="submit" { "Move the pin to " (short(&diff.to.commit)) }
            }
        }
    }
}

fn skill(s: &SkillChange) -> Markup {
    let change = change_name(s.change);
    html! {
        article.skill-change aria-label={ (s.name) " " (change) } {
            h3 { (s.name) " " span class={ "badge " (change) } { (change) }
                @if let Some(from) = &s.renamed_from { " " small { "was " (from) } } }
            @if !s.files.is_empty() {
                table.files { thead { tr { th scope="col" { "File" } th scope="col" { "Change" } th scope="col" { "Size" } th scope="col" { "Executable" } } }
                    tbody { @for f in &s.files { (file(f)) } }
                }
                @if s.scripts_changed == 1 { p.warn { "1 script changed: review it before moving the pin." } }
                @if s.scripts_changed > 1 { p.warn { (s.scripts_changed) " scripts changed: review them before moving the pin." } }
            }
            @if let Some(d) = &s.skill_md {
                pre.diff aria-label={ "SKILL.md diff of " (s.name) } {
                    @for line in d.unified.lines() {
                        @if line.starts_with("+++") || line.starts_with("---") { span.head { (line) } "\n" }
                        @else if line.starts_with('+') { ins { (line) } "\n" }
                        @else if line.starts_with('-') { del { (line) } "\n" }
                        @else if line.starts_with('@') { span.hunk { (line) } "\n" }
                        @else { (line) "\n" }
                    }
                }
                @if d.truncated { p.warn { "The diff is cut short." } }
            }
            @if s.problems_before != s.problems_after || !s.problems_after.is_empty() {
                p { "Specification: "
                    (problems(&s.problems_before)) " before, " (problems(&s.problems_after)) " after" }
            }
        }
    }
}

fn file(f: &FileChange) -> Markup {
    let size = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_else(|| "–".to_owned());
    let exec = |x: bool| if x { "yes" } else { "no" };
    html! {
        tr {
            td { code { (f.path) } @if f.script { " " span.badge { "script" } } }
            td { (f.change) }
            td.n { (size(f.size_before)) " → " (size(f.size_after)) }
            td { @match (f.change, f.executable_before == f.executable_after) {
                ("added", _) => (exec(f.executable_after)),
                ("removed", _) | (_, true) => (exec(f.executable_before)),
                _ => { (exec(f.executable_before)) " → " strong { (exec(f.executable_after)) } }
            } }
        }
    }
}

fn problems(p: &[cloud_harness_skills::spec::Problem]) -> Markup {
    crate::dashboard::library::spec_badge(p)
}

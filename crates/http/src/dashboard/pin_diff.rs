//! What moving a registry entry's pin would change, shown on the entry's page before the
//! operator confirms: the skills added, removed, renamed and changed, each changed skill's
//! files and `SKILL.md` diff, the specification's problems before and after, the open
//! workspaces still serving the current pin; then the form that moves the pin. A set's two
//! revisions are shown the same way (`changes`).

use super::layout::{self, short};
use cloud_harness_auth::Identity;
use cloud_harness_curation::bundle_diff::{BundleDiff, Change, Changes, FileChange, SkillChange};
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
pub fn section(
    who: &Identity,
    base: &str,
    diff: &BundleDiff,
    serving: &[Value],
    reason: &str,
) -> Markup {
    let from_to = html! { "From " code { (short(&diff.from.commit)) } " to " code { (short(&diff.to.commit)) } ": " };
    html! {
        section.pin-diff aria-labelledby="diff" {
            h2 id="diff" { "What moving the pin changes" }
            (changes(from_to, &diff.changes, serving, "the current pin's bundle"))
            form.stack method="post" action={ (base) "/pin" } aria-label="Confirm the move" {
                (layout::csrf(who))
                input type="hidden" name="commit" value=(diff.to.commit);
                input type="hidden" name="from" value=(diff.from.commit);
                label { "Reason" input type="text" name="reason" value=(reason); }
                button type="submit" { "Move the pin to " (short(&diff.to.commit)) }
            }
        }
    }
}

/// What serving one side in place of the other changes (`from_to` says which sides), and the
/// open workspaces still serving `old` (what they serve, said for people).
pub fn changes(from_to: Markup, c: &Changes, serving: &[Value], old: &str) -> Markup {
    let count = |k: Change| c.skills.iter().filter(|s| s.change == k).count();
    html! {
        p role="status" {
            (from_to)
            (count(Change::Added)) " added, " (count(Change::Removed)) " removed, "
            (count(Change::Renamed)) " renamed, " (count(Change::Changed)) " changed, "
            (c.unchanged) " unchanged. Skills breaking the Agent Skills specification: "
            (c.problems_before) " before, " (c.problems_after) " after."
        }
        @if serving.is_empty() {
            p { "No open workspace serves " (old) "." }
        } @else {
            p.warn {
                @if serving.len() == 1 { "1 open workspace serves " (old) ", and keeps it until it reopens:" }
                @else { (serving.len()) " open workspaces serve " (old) ", and keep it until they reopen:" }
            }
            ul.serving { @for s in serving {
                li { a href={ "/workspaces/" (s["workspace"].as_str().unwrap_or("")) } { (s["workspace"].as_str().unwrap_or("")) }
                    " (" (s["owner"].as_str().unwrap_or("")) ")" }
            } }
        }
        @if c.skills.is_empty() { p.empty { "No skill changes: both serve the same skills." } }
        @for s in &c.skills { (skill(s)) }
        @if c.files_left_out > 0 {
            p.warn { (c.files_left_out) " more changed files are not listed." }
        }
        @if c.text_diffs_left_out > 0 {
            p.warn { (c.text_diffs_left_out) " SKILL.md diffs are left out (the answer's budget of text diffs is spent)." }
        }
    }
}

fn skill(s: &SkillChange) -> Markup {
    let change = change_name(s.change);
    html! {
        article.skill-change aria-label={ (s.name) " " (change) } {
            h3 { (visible(&s.name)) " " span class={ "badge " (change) } { (change) }
                @if let Some(from) = &s.renamed_from { " " small { "was " (visible(from)) } } }
            @if !s.files.is_empty() {
                table.files { thead { tr { th scope="col" { "File" } th scope="col" { "Change" } th scope="col" { "Size" } th scope="col" { "Kind" } } }
                    tbody { @for f in &s.files { (file(f)) } }
                }
            }
            @if s.files_left_out > 0 { p.warn { (s.files_left_out) " more of its files differ, not listed." } }
            @if s.scripts_changed == 1 { p.warn { "1 script changed: review it before moving the pin." } }
            @if s.scripts_changed > 1 { p.warn { (s.scripts_changed) " scripts changed: review them before moving the pin." } }
            @if s.skill_md_left_out { p.warn { "Its SKILL.md changed; the diff is left out (the answer's budget of text diffs is spent)." } }
            @if let Some(d) = &s.skill_md {
                pre.diff aria-label={ "SKILL.md diff of " (s.name) } {
                    // The first two lines are the header; after them the first character
                    // says what a line is, whatever the line says.
                    @for (i, line) in d.unified.split_terminator('\n').enumerate() {
                        @let line = visible(line);
                        @if i < 2 { span.head { (line) } "\n" }
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
    html! {
        tr {
            td { code { (visible(&f.path)) } @if f.script { " " span.badge { "script" } } }
            td { (f.change) }
            td.n { (size(f.size_before)) " → " (size(f.size_after)) }
            td { @match (f.kind_before, f.kind_after) {
                (Some(b), Some(a)) if b != a => { (b) " → " strong { (a) } }
                (_, Some(k)) | (Some(k), None) => (k),
                (None, None) => "",
            } }
        }
    }
}

/// A toolkit's text with its control and direction-changing characters written out
/// (`\u{202e}`): what a reviewer reads is what the bytes say.
fn visible(s: &str) -> String {
    // Controls, and the format and separator characters that draw nothing or move text:
    // soft hyphen, zero widths, marks, line and paragraph separators, embeddings, isolates.
    let hidden = |c: char| {
        (c.is_control() && c != '\t')
            || matches!(c, '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
    };
    if !s.chars().any(hidden) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if hidden(c) {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn problems(p: &[cloud_harness_skills::spec::Problem]) -> Markup {
    crate::dashboard::library::spec_badge(p)
}

#[cfg(test)]
mod tests {
    use super::visible;

    #[test]
    fn hidden_characters_are_written_out() {
        assert_eq!(visible("run.sh"), "run.sh");
        assert_eq!(visible("evil\u{202e}hs.nur"), "evil\\u{202e}hs.nur");
        assert_eq!(visible("a\u{1b}[31mb\tc"), "a\\u{1b}[31mb\tc");
        assert_eq!(
            visible("run\u{200b}.sh\u{2028}-x\r"),
            "run\\u{200b}.sh\\u{2028}-x\\u{d}"
        );
    }
}

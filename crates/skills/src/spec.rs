//! The Agent Skills specification (agentskills.io), checked: what a client's loader may refuse
//! in a skill the harness still serves. Each finding is a [`Problem`] with a stable [`Rule`];
//! a skill with problems is served unless its toolkit's policy ([`Validation::Refuse`]) says
//! otherwise.
//!
//! The rules, from the specification: `name` is required, at most 64 characters, lowercase
//! letters, digits and single hyphens, not at either end, and equal to its folder's name (both
//! read in Unicode NFKC, as the reference validator reads them); `description` is required
//! (a skill without one is skipped, not served) and at most 1,024 characters; the front matter
//! holds only `name`, `description`, `license`, `allowed-tools`, `compatibility` and
//! `metadata`; `compatibility` is text of at most 500 characters, `metadata` a mapping of keys
//! to text, `allowed-tools` and `license` text. Fields that Claude Code reads are named as
//! such. Two rules go past the reference validator, which does not check them: the forms of
//! `metadata`, `allowed-tools` and `license`, and the files `SKILL.md` links to
//! ([`references`]), which must be in the skill.

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;

const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 1024;
const MAX_COMPATIBILITY: usize = 500;
/// Links of a SKILL.md checked at most; a body with more is checked for these.
pub const MAX_REFERENCES: usize = 256;

/// The fields the specification defines.
pub const FIELDS: &[&str] = &[
    "name",
    "description",
    "license",
    "allowed-tools",
    "compatibility",
    "metadata",
];

/// Fields outside the specification that Claude Code reads (its skills and slash commands).
const CLAUDE_CODE_FIELDS: &[&str] = &[
    "disable-model-invocation",
    "user-invocable",
    "argument-hint",
    "model",
    "context",
    "agent",
    "hooks",
];

/// What a skill breaks. The names are stable: programs and policies match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// No `name`, or an empty one.
    NameMissing,
    /// Not lowercase letters, digits and single inner hyphens.
    NameForm,
    /// Longer than 64 characters.
    NameLength,
    /// Differs from the skill's folder.
    NameFolder,
    /// Longer than 1,024 characters.
    DescriptionLength,
    /// A field the specification does not define.
    FieldUnknown,
    /// A field of one client (Claude Code), not of the specification.
    FieldClient,
    /// `compatibility` is not text.
    CompatibilityForm,
    /// `compatibility` is longer than 500 characters.
    CompatibilityLength,
    /// `metadata` is not a mapping of keys to text.
    MetadataForm,
    /// `allowed-tools` is not text (a space-separated list).
    AllowedToolsForm,
    /// `license` is not text.
    LicenseForm,
    /// `SKILL.md` links to a file the skill does not have.
    ReferenceMissing,
}

impl Rule {
    pub const ALL: [Rule; 13] = [
        Rule::NameMissing,
        Rule::NameForm,
        Rule::NameLength,
        Rule::NameFolder,
        Rule::DescriptionLength,
        Rule::FieldUnknown,
        Rule::FieldClient,
        Rule::CompatibilityForm,
        Rule::CompatibilityLength,
        Rule::MetadataForm,
        Rule::AllowedToolsForm,
        Rule::LicenseForm,
        Rule::ReferenceMissing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NameMissing => "name-missing",
            Rule::NameForm => "name-form",
            Rule::NameLength => "name-length",
            Rule::NameFolder => "name-folder",
            Rule::DescriptionLength => "description-length",
            Rule::FieldUnknown => "field-unknown",
            Rule::FieldClient => "field-client",
            Rule::CompatibilityForm => "compatibility-form",
            Rule::CompatibilityLength => "compatibility-length",
            Rule::MetadataForm => "metadata-form",
            Rule::AllowedToolsForm => "allowed-tools-form",
            Rule::LicenseForm => "license-form",
            Rule::ReferenceMissing => "reference-missing",
        }
    }

    /// Whether the reference validator (`skills-ref`) checks this rule too.
    pub fn in_reference_validator(self) -> bool {
        !matches!(
            self,
            Rule::MetadataForm
                | Rule::AllowedToolsForm
                | Rule::LicenseForm
                | Rule::ReferenceMissing
        )
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing a skill breaks, said for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub rule: Rule,
    pub message: String,
}

impl Problem {
    fn new(rule: Rule, message: impl Into<String>) -> Problem {
        Problem {
            rule,
            message: message.into(),
        }
    }
}

/// What a toolkit does with skills that have problems.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Validation {
    /// Served, with their problems said (the default).
    #[default]
    Warn,
    /// Not served: skipped as `SPEC_VIOLATION`, naming the problems.
    Refuse,
}

impl Validation {
    pub fn is_warn(&self) -> bool {
        *self == Validation::Warn
    }

    /// The stricter of two policies (a set that refuses refuses for all its members).
    pub fn stricter(self, other: Validation) -> Validation {
        self.max(other)
    }
}

impl std::str::FromStr for Validation {
    type Err = String;
    fn from_str(s: &str) -> Result<Validation, String> {
        match s {
            "warn" => Ok(Validation::Warn),
            "refuse" => Ok(Validation::Refuse),
            other => Err(format!("{other:?} is not `warn` or `refuse`")),
        }
    }
}

/// Checks a front matter's fields against the specification. `folder` is the skill's folder
/// name (`None` for a skill whose folder is the toolkit's top, named by its front matter).
/// A missing description is not checked here: such a skill is skipped, not served.
pub fn check(folder: Option<&str>, map: &yaml_serde::Mapping) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut named = false;
    for (key, value) in map {
        let Some(key) = key.as_str() else {
            problems.push(Problem::new(
                Rule::FieldUnknown,
                format!("front-matter key {} is not text", shown_value(key)),
            ));
            continue;
        };
        match key {
            "name" => {
                named = true;
                match text(value) {
                    Some(name) => check_name(&name, folder, &mut problems),
                    None => problems.push(Problem::new(Rule::NameForm, "`name` is not text")),
                }
            }
            "description" => {
                if let Some(d) = text(value) {
                    let n = d.chars().count();
                    if n > MAX_DESCRIPTION {
                        problems.push(Problem::new(
                            Rule::DescriptionLength,
                            format!("`description` has {n} characters, more than {MAX_DESCRIPTION}"),
                        ));
                    }
                }
            }
            "compatibility" => match text(value) {
                Some(c) if c.chars().count() > MAX_COMPATIBILITY => problems.push(Problem::new(
                    Rule::CompatibilityLength,
                    format!(
                        "`compatibility` has {} characters, more than {MAX_COMPATIBILITY}",
                        c.chars().count()
                    ),
                )),
                Some(_) => {}
                None => problems.push(Problem::new(
                    Rule::CompatibilityForm,
                    "`compatibility` is not text",
                )),
            },
            "metadata" => {
                let ok = match value {
                    yaml_serde::Value::Mapping(m) => m
                        .iter()
                        .all(|(k, v)| k.as_str().is_some() && text(v).is_some()),
                    _ => false,
                };
                if !ok {
                    problems.push(Problem::new(
                        Rule::MetadataForm,
                        "`metadata` is not a mapping of text keys to text values",
                    ));
                }
            }
            "allowed-tools" => {
                if text(value).is_none() {
                    problems.push(Problem::new(
                        Rule::AllowedToolsForm,
                        "`allowed-tools` is not text (the specification's form is one line of tool names separated by spaces)",
                    ));
                }
            }
            "license" => {
                if text(value).is_none() {
                    problems.push(Problem::new(Rule::LicenseForm, "`license` is not text"));
                }
            }
            _ if CLAUDE_CODE_FIELDS.contains(&key) => problems.push(Problem::new(
                Rule::FieldClient,
                format!("`{key}` is a Claude Code field, not one of the specification's; other clients may refuse the skill"),
            )),
            _ => problems.push(Problem::new(
                Rule::FieldUnknown,
                format!(
                    "`{}` is not a field of the specification (it defines {})",
                    short(key),
                    FIELDS.join(", ")
                ),
            )),
        }
    }
    if !named {
        problems.push(Problem::new(
            Rule::NameMissing,
            "the front matter has no `name`",
        ));
    }
    problems
}

fn check_name(name: &str, folder: Option<&str>, problems: &mut Vec<Problem>) {
    let name: String = name.trim().nfkc().collect();
    if name.is_empty() {
        problems.push(Problem::new(Rule::NameMissing, "`name` is empty"));
        return;
    }
    let shown = short(&name);
    let n = name.chars().count();
    if n > MAX_NAME {
        problems.push(Problem::new(
            Rule::NameLength,
            format!("`name` has {n} characters, more than {MAX_NAME}"),
        ));
    }
    let mut form = Vec::new();
    if name.to_lowercase() != name {
        form.push("is not lowercase");
    }
    if name.starts_with('-') || name.ends_with('-') {
        form.push("starts or ends with a hyphen");
    }
    if name.contains("--") {
        form.push("holds two hyphens in a row");
    }
    if !name.chars().all(|c| c.is_alphanumeric() || c == '-') {
        form.push("holds characters other than letters, digits and hyphens");
    }
    if !form.is_empty() {
        problems.push(Problem::new(
            Rule::NameForm,
            format!("`name` {shown:?} {}", form.join(", ")),
        ));
    }
    if let Some(folder) = folder {
        let folder: String = folder.nfkc().collect();
        if folder != name {
            problems.push(Problem::new(
                Rule::NameFolder,
                format!(
                    "`name` {shown:?} differs from its folder {:?}; the folder name is used",
                    short(&folder)
                ),
            ));
        }
    }
}

/// A scalar as text (YAML reads `1.0` and `true` as numbers and booleans; a loader that
/// wants text takes them as written).
pub(crate) fn text(value: &yaml_serde::Value) -> Option<String> {
    match value {
        yaml_serde::Value::String(s) => Some(s.clone()),
        yaml_serde::Value::Number(n) => Some(n.to_string()),
        yaml_serde::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn shown_value(value: &yaml_serde::Value) -> String {
    short(&serde_json::to_string(value).unwrap_or_default())
}

/// At most 80 characters of `s`, for a message.
fn short(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// The relative files a SKILL.md body links to (`[text](path)`, `![alt](path)`), outside code
/// blocks and code spans: no URL, no anchor alone, no absolute path; `#anchor` and `?query`
/// taken off, percent-escapes decoded. At most [`MAX_REFERENCES`], each once. Bounded for any
/// body: one pass over it, at most [`MAX_LINKS_LOOKED_AT`] link openings looked at, each
/// target read for at most [`MAX_TARGET`] bytes.
pub fn references(body: &str) -> Vec<String> {
    scan_references(body).0
}

/// [`references`], and whether the body was read to its end (false: a bound stopped the
/// scan, and links after it are not checked).
pub fn scan_references(body: &str) -> (Vec<String>, bool) {
    let mut out: Vec<String> = Vec::new();
    let mut looked_at = 0;
    // The open fence: its character and length (CommonMark: closed by at least as many).
    let mut fence: Option<(u8, usize)> = None;
    for line in body.lines() {
        let trimmed = line.trim_start();
        let run = |c: u8| trimmed.bytes().take_while(|&b| b == c).count();
        let marker = [b'`', b'~']
            .into_iter()
            .map(|c| (c, run(c)))
            .find(|&(_, n)| n >= 3);
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                continue;
            }
            // A closing fence is the run alone (no info string after it).
            (Some((c, n)), Some((mc, mn)))
                if c == mc && mn >= n && trimmed.trim_end().len() == mn =>
            {
                fence = None;
                continue;
            }
            (Some(_), _) => continue,
            (None, None) => {}
        }
        let visible = outside_code_spans(line);
        let mut rest = visible.as_str();
        while let Some(at) = rest.find("](") {
            looked_at += 1;
            if looked_at > MAX_LINKS_LOOKED_AT {
                return (out, false);
            }
            rest = &rest[at + 2..];
            let (target, used) = link_target(rest);
            rest = &rest[used..];
            if let Some(path) = target.and_then(relative_target) {
                if !out.contains(&path) {
                    out.push(path);
                    if out.len() == MAX_REFERENCES {
                        return (out, false);
                    }
                }
            }
        }
    }
    (out, true)
}

/// Link openings (`](`) a body is searched for at most.
pub const MAX_LINKS_LOOKED_AT: usize = 4096;
/// The longest link target read; a longer one is no file reference.
pub const MAX_TARGET: usize = 1024;

/// The target at the start of `rest` (what follows `](`), and how many bytes were read: up
/// to a `)` that closes it (parentheses inside may nest) or white space, or inside `<…>`.
fn link_target(rest: &str) -> (Option<&str>, usize) {
    if let Some(angled) = rest.strip_prefix('<') {
        let end = angled
            .bytes()
            .take(MAX_TARGET)
            .position(|b| b == b'>' || b == b'\n');
        return match end {
            Some(end) if angled.as_bytes()[end] == b'>' => (Some(&angled[..end]), end + 2),
            Some(end) => (None, end + 1),
            None => (None, 1 + boundary_after(angled, MAX_TARGET)),
        };
    }
    let mut depth = 0usize;
    for (i, b) in rest.bytes().enumerate().take(MAX_TARGET) {
        match b {
            b'(' => depth += 1,
            b')' if depth == 0 => return (Some(&rest[..i]), i),
            b')' => depth -= 1,
            b' ' | b'\t' => return (Some(&rest[..i]), i),
            _ => {}
        }
    }
    if rest.len() <= MAX_TARGET {
        (Some(rest), rest.len())
    } else {
        // Past the bound: no reference, and the search goes on after what was read.
        (None, boundary_after(rest, MAX_TARGET))
    }
}

/// The first character boundary of `s` at or after `at` (its length, past its end).
fn boundary_after(s: &str, at: usize) -> usize {
    let mut end = at.min(s.len());
    while !s.is_char_boundary(end) {
        end += 1;
    }
    end
}

/// `line` without its inline code spans (a run of backticks up to the next run exactly as
/// long): a link written as code is an example, not a reference. One pass over the runs.
fn outside_code_spans(line: &str) -> String {
    if !line.contains('`') {
        return line.to_owned();
    }
    let bytes = line.as_bytes();
    // Every run of backticks: where it starts and how long it is.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let start = i;
            while i < bytes.len() && bytes[i] == b'`' {
                i += 1;
            }
            runs.push((start, i - start));
        } else {
            i += 1;
        }
    }
    // For each length, the runs of that length in order: a span opened by one is closed by
    // the next of the same length.
    let mut by_len: std::collections::HashMap<usize, std::collections::VecDeque<usize>> =
        std::collections::HashMap::new();
    for (k, &(_, len)) in runs.iter().enumerate() {
        by_len.entry(len).or_default().push_back(k);
    }
    let mut out = String::with_capacity(line.len());
    let mut copied = 0;
    let mut k = 0;
    while k < runs.len() {
        let (start, len) = runs[k];
        let queue = by_len.get_mut(&len).expect("every run is queued");
        while queue.front().is_some_and(|&q| q <= k) {
            queue.pop_front();
        }
        match queue.pop_front() {
            Some(close) => {
                out.push_str(&line[copied..start]);
                copied = runs[close].0 + len;
                k = close + 1;
            }
            // An unclosed run is literal backticks.
            None => k += 1,
        }
    }
    out.push_str(&line[copied..]);
    out
}

fn relative_target(target: &str) -> Option<String> {
    let path = target.split(['#', '?']).next().unwrap_or("");
    let scheme = path.split_once(':').is_some_and(|(s, _)| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
    });
    if path.is_empty() || scheme || path.starts_with('/') || path.starts_with('\\') {
        return None;
    }
    let path = percent_decoded(path)?;
    let path = path
        .strip_prefix("./")
        .unwrap_or(&path)
        .trim_end_matches('/');
    (!path.is_empty()).then(|| path.to_owned())
}

/// `%XX` escapes decoded (as a link's target is written); `None` when that is not UTF-8.
fn percent_decoded(path: &str) -> Option<String> {
    if !path.contains('%') {
        return Some(path.to_owned());
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(folder: &str, front: &str) -> Vec<Rule> {
        let yaml_serde::Value::Mapping(map) = yaml_serde::from_str(front).unwrap() else {
            panic!("not a mapping: {front}")
        };
        check(Some(folder), &map)
            .into_iter()
            .map(|p| p.rule)
            .collect()
    }

    #[test]
    fn a_skill_by_the_specification_has_no_problem() {
        let front = "name: pdf-tools\ndescription: Fill PDF forms.\nlicense: MIT\ncompatibility: Needs python3\nallowed-tools: Bash(git:*) Read\nmetadata:\n  author: someone\n  version: 1.0\n";
        assert_eq!(problems("pdf-tools", front), vec![]);
    }

    #[test]
    fn each_rule_is_found() {
        let long = "a".repeat(65);
        let cases: &[(&str, String, Rule)] = &[
            ("x", "description: d\n".into(), Rule::NameMissing),
            ("x", "name: ''\ndescription: d\n".into(), Rule::NameMissing),
            ("Tdd", "name: Tdd\ndescription: d\n".into(), Rule::NameForm),
            ("-x", "name: -x\ndescription: d\n".into(), Rule::NameForm),
            (
                "a--b",
                "name: a--b\ndescription: d\n".into(),
                Rule::NameForm,
            ),
            ("a_b", "name: a_b\ndescription: d\n".into(), Rule::NameForm),
            (
                &long,
                format!("name: {long}\ndescription: d\n"),
                Rule::NameLength,
            ),
            ("x", "name: y\ndescription: d\n".into(), Rule::NameFolder),
            (
                "x",
                format!("name: x\ndescription: {}\n", "d".repeat(1025)),
                Rule::DescriptionLength,
            ),
            (
                "x",
                "name: x\ndescription: d\nversion: 1\n".into(),
                Rule::FieldUnknown,
            ),
            (
                "x",
                "name: x\ndescription: d\nargument-hint: a\n".into(),
                Rule::FieldClient,
            ),
            (
                "x",
                "name: x\ndescription: d\ncompatibility: [a]\n".into(),
                Rule::CompatibilityForm,
            ),
            (
                "x",
                format!(
                    "name: x\ndescription: d\ncompatibility: {}\n",
                    "c".repeat(501)
                ),
                Rule::CompatibilityLength,
            ),
            (
                "x",
                "name: x\ndescription: d\nmetadata: {a: [1]}\n".into(),
                Rule::MetadataForm,
            ),
            (
                "x",
                "name: x\ndescription: d\nmetadata: text\n".into(),
                Rule::MetadataForm,
            ),
            (
                "x",
                "name: x\ndescription: d\nallowed-tools: [Read, Bash]\n".into(),
                Rule::AllowedToolsForm,
            ),
            (
                "x",
                "name: x\ndescription: d\nlicense: {spdx: MIT}\n".into(),
                Rule::LicenseForm,
            ),
        ];
        for (folder, front, rule) in cases {
            assert_eq!(problems(folder, front), vec![*rule], "{front}");
        }
    }

    #[test]
    fn names_are_read_in_nfkc_and_unicode_letters_count() {
        // U+FB01 (the ligature fi) is `fi` in NFKC.
        assert_eq!(problems("fix", "name: \u{fb01}x\ndescription: d\n"), vec![]);
        assert_eq!(problems("café", "name: café\ndescription: d\n"), vec![]);
        assert_eq!(
            problems("Café", "name: Café\ndescription: d\n"),
            vec![Rule::NameForm]
        );
    }

    #[test]
    fn references_are_the_relative_links_outside_code() {
        let body = "See [the form](reference/forms.md#top) and ![chart](./img/a.png).\n\
            [site](https://example.com) [mail](mailto:a@b) [anchor](#x) [abs](/etc/passwd)\n\
            ```\n[in code](nope.md)\n```\n\
            [again](reference/forms.md) [spaced](<docs/a b.md>) [dir](scripts/)\n\
            An example: `see [x](./x.md)` and ``[y](y.md)`` are code; ``` `[z](z.md)` ``` too.\n";
        assert_eq!(
            references(body),
            vec!["reference/forms.md", "img/a.png", "docs/a b.md", "scripts"]
        );
        let many: String = (0..1000).map(|i| format!("[f](f{i}.md)\n")).collect();
        assert_eq!(references(&many).len(), MAX_REFERENCES);
        let odd = "[a](caf%C3%A9.md) [b](foo(1).md) [c](a%2Fb.md) [d](x%+5.md)\n````\n```\n```python\n[in](code.md)\n````\n[after](after.md)\n";
        assert_eq!(
            references(odd),
            vec!["café.md", "foo(1).md", "a/b.md", "x%+5.md", "after.md"]
        );
    }

    /// The worst bodies a toolkit can write cost one bounded pass: link openings that never
    /// make a reference, huge targets, and lines of unclosed backtick runs of every length.
    #[test]
    fn references_of_hostile_bodies_are_bounded() {
        let openings = "](/".repeat(350_000);
        assert!(references(&openings).is_empty());
        let huge: String = (0..256)
            .map(|i| format!("[x](a{i}{})\n", "a".repeat(4000)))
            .collect();
        assert!(references(&huge).is_empty());
        let angled = format!("[x](<{}", "é".repeat(2000));
        assert!(references(&angled).is_empty());
        let backticks: String = (1..1400).map(|n| "`".repeat(n) + "x").collect();
        assert_eq!(outside_code_spans(&backticks), backticks);
        let spans = "`a` [x](x.md) ``b`` [y](y.md) ```c``` [z](z.md)";
        assert_eq!(references(spans), vec!["x.md", "y.md", "z.md"]);
    }
}

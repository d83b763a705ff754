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
//! ([`crate::references`]), which must be in the skill.

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;

const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 1024;
const MAX_COMPATIBILITY: usize = 500;

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

/// The rules `problems` break, each once, in the order of [`Rule::ALL`].
pub fn rules(problems: &[Problem]) -> Vec<Rule> {
    let broken: std::collections::BTreeSet<Rule> = problems.iter().map(|p| p.rule).collect();
    broken.into_iter().collect()
}

/// The names of [`rules`], joined by `, ` (for a message).
pub fn rule_names(problems: &[Problem]) -> String {
    rules(problems)
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(", ")
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
}

//! The skill model: what a `SKILL.md` says about its skill, parsed as agents parse it.
//!
//! Lenient where agents are lenient: what breaks the Agent Skills specification (unknown
//! front-matter fields, a name that differs from its folder or breaks the naming rules, an
//! over-long description, …) is a [`crate::spec::Problem`] kept with the skill (a toolkit whose
//! policy refuses such skills leaves them out where it is served). Parsing skips a skill, with
//! the reason, only when its `SKILL.md` has no
//! front matter, broken YAML, front matter that is not a mapping, no description, is not UTF-8
//! text, or is too large to be a skill: the file, or its front matter past a bound of
//! [`crate::front_matter`] (size, nesting, values and text with aliases expanded, keys, string
//! length).

use crate::front_matter;
use crate::spec::{self, Problem};
use cloud_harness_error::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;

/// A `SKILL.md` larger than this is not a skill an agent could load: TOO_LARGE.
pub const MAX_SKILL_MD: usize = 1 << 20;
/// The file that makes a folder a skill.
pub const SKILL_MD: &str = "SKILL.md";
const MAX_NAME: usize = 64;

/// What the front matter of a `SKILL.md` declares.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkillMeta {
    /// The `name` field as written (the skill's identity is its folder name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared_name: Option<String>,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compatibility: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<String>,
    /// `disable-model-invocation: true`: the skill is for users to invoke, not the model.
    pub user_only: bool,
    /// Every other field, kept as written.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParsedSkill {
    pub meta: SkillMeta,
    /// What the skill breaks of the Agent Skills specification (its front matter's rules;
    /// the files it links to are checked where its folder is known).
    pub problems: Vec<Problem>,
    /// The relative files its body links to ([`crate::references`]).
    #[serde(skip)]
    pub references: Vec<String>,
    /// Whether every link of its body is among them (false: a bound stopped the scan).
    #[serde(skip)]
    pub references_complete: bool,
}

/// A skill's identity, checked once where skills are found (discovery) and used as it is
/// everywhere after: one path segment in a mount's root, an executor path, a store tree. A
/// folder name from a store tree is one already; a name from front matter (a skill at a
/// toolkit's top) must be shown to be. Names outside the Agent Skills rule stay a warning.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct SkillName(String);

/// The longest name a file system takes as one segment.
const MAX_SEGMENT: usize = 255;

impl SkillName {
    /// `name` as a skill's identity, or why it cannot be one.
    pub fn new(name: &str) -> Result<SkillName, String> {
        let bad = |why: &str| {
            Err(format!(
                "skill name {:?} {why}",
                name.chars().take(80).collect::<String>()
            ))
        };
        if name.is_empty() {
            return bad("is empty");
        }
        if name.len() > MAX_SEGMENT {
            return bad("is longer than 255 bytes");
        }
        if name.contains('/') || name.contains('\\') {
            return bad("is a path, not a name");
        }
        if name.starts_with('.') {
            return bad("starts with a dot (hidden, or a path step)");
        }
        if name.chars().any(char::is_control) {
            return bad("holds control characters");
        }
        Ok(SkillName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for SkillName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SkillName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `name` follows the Agent Skills rule: 1-64 lowercase letters, digits and single
/// hyphens, not starting or ending with a hyphen.
pub fn is_spec_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The front matter of a SKILL.md as JSON, every field as written (what the MCP Skills
/// extension calls `frontmatter`); `None` when there is none, it is not a mapping, or it is
/// past a bound (parsed as [`parse`] parses it).
pub fn frontmatter_json(bytes: &[u8]) -> Option<serde_json::Value> {
    if bytes.len() > MAX_SKILL_MD {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let (front, _) = split_front_matter(text).ok()?;
    // A mapping as written: not a tagged one (`!tag` before it), which `parse` refuses too.
    let value @ yaml_serde::Value::Mapping(_) = front_matter::parse(front).ok()? else {
        return None;
    };
    serde_json::to_value(&value).ok().filter(|v| v.is_object())
}

/// The body of a SKILL.md: what follows its front matter (all of it when there is none).
pub fn body(text: &str) -> &str {
    split_front_matter(text).map_or(text, |(_, body)| body)
}

/// Splits `text` into its front matter and body. The front matter sits between a first line
/// `---` and the next line `---` (or `...`).
fn split_front_matter(text: &str) -> Result<(&str, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err(Error::invalid(
            "SKILL.md does not start with YAML front matter (a first line `---`)",
        ));
    }
    let start = first.len();
    let mut pos = start;
    for line in lines {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed == "..." {
            return Ok((&text[start..pos], &text[pos + line.len()..]));
        }
        pos += line.len();
    }
    Err(Error::invalid(
        "SKILL.md front matter is not closed by a line `---`",
    ))
}

/// The refusal of a `SKILL.md` of `size` bytes, more than [`MAX_SKILL_MD`].
pub fn too_large(size: u64) -> Error {
    Error::too_large(format!(
        "SKILL.md is {size} bytes, more than the {MAX_SKILL_MD} a skill may have (bound `skill_md_bytes`)"
    ))
    .with_details(serde_json::json!({
        "file": SKILL_MD,
        "bound": "skill_md_bytes",
        "limit": MAX_SKILL_MD,
    }))
}

/// Parses the `SKILL.md` of the folder `folder_name` (empty for a skill at a toolkit's top,
/// named by its front matter). An error is the reason to skip the skill;
/// its details name the file (and the bound, for one).
pub fn parse(folder_name: &str, bytes: &[u8]) -> Result<ParsedSkill> {
    parse_file(folder_name, bytes).map_err(|mut e| {
        match &mut e.details {
            serde_json::Value::Object(details) => {
                details.entry("file").or_insert(SKILL_MD.into());
            }
            details => *details = serde_json::json!({ "file": SKILL_MD }),
        }
        e
    })
}

fn parse_file(folder_name: &str, bytes: &[u8]) -> Result<ParsedSkill> {
    if bytes.len() > MAX_SKILL_MD {
        return Err(too_large(bytes.len() as u64));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| Error::invalid(format!("SKILL.md is not UTF-8 text ({e})")))?;
    if text.contains('\0') {
        return Err(Error::invalid("SKILL.md is binary (it holds NUL bytes)"));
    }
    let (front, body) = split_front_matter(text)?;
    let yaml_serde::Value::Mapping(map) = front_matter::parse(front)? else {
        return Err(Error::invalid(
            "SKILL.md front matter is not a mapping of fields",
        ));
    };

    let folder = (!folder_name.is_empty()).then_some(folder_name);
    let problems = spec::check(folder, &map);
    let mut meta = SkillMeta::default();
    let mut description = None;
    for (key, value) in &map {
        let Some(key) = key.as_str() else {
            continue;
        };
        match key {
            "name" => meta.declared_name = spec::text(value),
            "description" => description = spec::text(value),
            "license" => meta.license = spec::text(value),
            "compatibility" => meta.compatibility = spec::text(value),
            "allowed-tools" => {
                meta.allowed_tools = match value {
                    yaml_serde::Value::Sequence(items) => Some(
                        items
                            .iter()
                            .filter_map(spec::text)
                            .collect::<Vec<_>>()
                            .join(" "),
                    ),
                    other => spec::text(other),
                }
            }
            "disable-model-invocation" => {
                meta.user_only = matches!(value, yaml_serde::Value::Bool(true))
                    || spec::text(value).as_deref() == Some("true")
            }
            _ => {
                let json = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
                meta.extra.insert(key.to_owned(), json);
            }
        }
    }

    meta.description = match description.map(|d| d.trim().to_owned()) {
        Some(d) if !d.is_empty() => d,
        _ => return Err(Error::invalid("SKILL.md front matter has no description")),
    };
    let (references, references_complete) = crate::references::references(body);
    Ok(ParsedSkill {
        meta,
        problems,
        references,
        references_complete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_harness_error::Code;

    #[test]
    fn parses_a_spec_skill_without_problems() {
        let md = "---\nname: tdd\ndescription: Test-driven development.\nlicense: MIT\nallowed-tools: Bash Read\n---\n# TDD\n";
        let parsed = parse("tdd", md.as_bytes()).unwrap();
        assert_eq!(parsed.meta.description, "Test-driven development.");
        assert_eq!(parsed.meta.license.as_deref(), Some("MIT"));
        assert_eq!(parsed.meta.allowed_tools.as_deref(), Some("Bash Read"));
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    }

    #[test]
    fn unknown_fields_and_name_mismatch_are_problems_of_a_served_skill() {
        let md = "---\r\nname: Other\r\ndescription: \"x\"\r\nfavourite-colour: blue\r\ndisable-model-invocation: true\r\n---\r\nbody";
        let parsed = parse("tdd", md.as_bytes()).unwrap();
        assert!(parsed.meta.user_only);
        assert_eq!(parsed.meta.extra["favourite-colour"], "blue");
        let rules: Vec<_> = parsed.problems.iter().map(|p| p.rule).collect();
        use crate::spec::Rule;
        assert_eq!(
            rules,
            [
                Rule::NameForm,
                Rule::NameFolder,
                Rule::FieldUnknown,
                Rule::FieldClient
            ]
        );
        assert!(parsed.problems[2].message.contains("`favourite-colour`"));
    }

    #[test]
    fn skips_with_typed_reasons() {
        let cases: &[(&[u8], Code, &str)] = &[
            (
                b"# no front matter",
                Code::InvalidArgument,
                "does not start",
            ),
            (b"---\nname: x\n", Code::InvalidArgument, "not closed"),
            (
                b"---\nname: x\n---\n",
                Code::InvalidArgument,
                "no description",
            ),
            (
                b"---\ndescription: \"\"\n---\n",
                Code::InvalidArgument,
                "no description",
            ),
            (
                b"---\n- a\n- b\n---\n",
                Code::InvalidArgument,
                "not a mapping",
            ),
            (
                b"---\njust text\n---\n",
                Code::InvalidArgument,
                "not a mapping",
            ),
            (
                b"---\ndescription: [unclosed\n---\n",
                Code::InvalidArgument,
                "not valid YAML",
            ),
            (b"\xff\xfe\x00junk", Code::InvalidArgument, "not UTF-8"),
            (
                b"---\ndescription: a\0b\n---\n",
                Code::InvalidArgument,
                "binary",
            ),
        ];
        for (bytes, code, needle) in cases {
            let err = parse("x", bytes).unwrap_err();
            assert_eq!(err.code, *code, "{err}");
            assert!(err.message.contains(needle), "{err} should say {needle}");
        }
        let huge = format!("---\ndescription: big\n---\n{}", "a".repeat(10 << 20));
        assert_eq!(
            parse("x", huge.as_bytes()).unwrap_err().code,
            Code::TooLarge
        );
    }

    #[test]
    fn a_bound_skips_the_skill_naming_the_file_and_the_bound() {
        let mut md = String::from("---\ndescription: x\na0: &a0 lol\n");
        for level in 1..=9 {
            let refs = vec![format!("*a{}", level - 1); 9].join(", ");
            md += &format!("a{level}: &a{level} [{refs}]\n");
        }
        md += "---\n";
        let err = parse("x", md.as_bytes()).unwrap_err();
        assert_eq!(err.code, Code::TooLarge, "{err}");
        assert_eq!(err.details["file"], "SKILL.md");
        assert_eq!(err.details["bound"], "nodes");
        assert_eq!(frontmatter_json(md.as_bytes()), None);
        let err = parse("x", b"---\ndescription: [unclosed\n---\n").unwrap_err();
        assert_eq!(err.details["file"], "SKILL.md", "{err}");
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/front_matter.rs`): a tagged mapping was a
    /// `frontmatter` (`{"!tag": {…}}`) of a SKILL.md that `parse` refuses as not a mapping.
    #[test]
    fn a_tagged_mapping_is_no_front_matter() {
        let md = b"---\n!xom@t\n k: +xTqR\\e\"UEdo\n---\n";
        assert!(parse("x", md)
            .unwrap_err()
            .message
            .contains("not a mapping"));
        assert_eq!(frontmatter_json(md), None);
    }

    /// The MCP Skills extension's front matter is what reading the YAML as JSON gave before
    /// the bounds, for front matters as toolkits write them.
    #[test]
    fn frontmatter_json_is_the_front_matter_as_written() {
        let cases = [
            "name: tdd\ndescription: Test-driven development.\nlicense: MIT\n",
            "name: a\ndescription: \"quoted: [x]\"\nallowed-tools: [Read, \"Bash(git:*)\"]\nversion: 1.2\nuser-invocable: false\n",
            "description: >\n  folded\n  text\nmetadata:\n  tags: [a, b]\n  owner: {team: x, n: 3}\n  empty: ~\n",
            "description: d\nhooks:\n  PreToolUse:\n    - matcher: Bash\n      hooks:\n        - type: command\n          command: ./check.sh\n",
            "description: d\nbase: &b {a: 1}\nother: *b\nnumbers: [1, -2, 3.5, 0x10, 1e3]\n",
            "description: d\n1: one\ntrue: yes\n",
        ];
        for front in cases {
            let md = format!("---\n{front}---\nbody\n");
            let before: serde_json::Value = yaml_serde::from_str(front).unwrap();
            assert_eq!(frontmatter_json(md.as_bytes()), Some(before), "{front}");
        }
        for builtin in [
            "cloud-harness-toolkits",
            "cloud-harness-conflicts",
            "cloud-harness-skills",
        ] {
            let path = format!(
                "{}/../../presets/builtin/{builtin}/SKILL.md",
                env!("CARGO_MANIFEST_DIR")
            );
            let md = std::fs::read(&path).unwrap();
            let text = std::str::from_utf8(&md).unwrap();
            let (front, _) = split_front_matter(text).unwrap();
            let before: serde_json::Value = yaml_serde::from_str(front).unwrap();
            assert_eq!(frontmatter_json(&md), Some(before), "{path}");
            assert!(parse(builtin, &md).is_ok(), "{path}");
        }
    }

    #[test]
    fn spec_names() {
        for good in ["a", "tdd", "code-review-2", &"a".repeat(64)] {
            assert!(is_spec_name(good), "{good}");
        }
        for bad in ["", "-a", "a-", "a--b", "A", "a_b", &"a".repeat(65)] {
            assert!(!is_spec_name(bad), "{bad}");
        }
    }
}

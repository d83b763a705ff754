//! Toolkit specs, exactly as users send them (each field within its ceiling), and the
//! [`Toolkit`] they resolve to.

use crate::input::{max_items, max_len};
use crate::labels::{self, Taken};
pub use crate::scope::Scope;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_skills::discovery::Layout;
use serde::{Deserialize, Serialize};

/// Ceilings of a spec's fields, enforced before anything else and stated in the tools' schemas.
pub const MAX_URL: usize = 2048;
/// A preset id, a version (a tag).
pub const MAX_NAME: usize = 200;
/// A subdirectory, a skill root.
pub const MAX_PATH: usize = 1024;
pub const MAX_ROOTS: usize = 16;
/// Include and exclude patterns, each list.
pub const MAX_PATTERNS: usize = 256;
pub const MAX_PATTERN: usize = 256;
/// Toolkits in one request.
pub const MAX_TOOLKITS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ToolkitSpec {
    Preset(PresetSpec),
    Git(GitSpec),
    /// A skill set: expanded into its members when a workspace opens.
    Set(SetRef),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetRef {
    pub id: String,
    /// A revision of the set; absent: its latest (or its label's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// A version label of the set, in place of a revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PresetSpec {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// A commit id or a tag; absent: the entry's pin (or its label's commit), else the default
    /// branch head, resolved and recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// A version label of the entry (`stable`), in place of a version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GitSpec {
    pub instance_id: String,
    pub url: String,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdirectory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<LayoutSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<SkillFilter>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LayoutSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_roots: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recursive: Option<bool>,
    /// Install only the skills a `.claude-plugin/marketplace.json` or `plugin.json` lists
    /// (when the toolkit has one); otherwise every skill the roots hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_manifest: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SkillFilter {
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Skills that break the Agent Skills specification: served with their problems (`warn`,
    /// the default) or not served (`refuse`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<cloud_harness_skills::spec::Validation>,
}

/// Which commit to take.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind", content = "value")]
pub enum Revision {
    /// An exact commit id: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits.
    Commit(String),
    /// A tag, resolved once and then pinned in the bundle index.
    Tag(String),
    /// The default branch head, resolved at acquisition and recorded.
    DefaultHead,
}

impl Revision {
    /// The form a helper container is handed: `commit:<id>`, `tag:<name>` or `head`.
    pub fn to_arg(&self) -> String {
        match self {
            Revision::Commit(c) => format!("commit:{c}"),
            Revision::Tag(t) => format!("tag:{t}"),
            Revision::DefaultHead => "head".into(),
        }
    }

    /// Reads [`Revision::to_arg`] back.
    pub fn from_arg(arg: &str) -> Option<Revision> {
        match arg.split_once(':') {
            Some(("commit", c)) => Some(Revision::Commit(c.to_owned())),
            Some(("tag", t)) => Some(Revision::Tag(t.to_owned())),
            _ if arg == "head" => Some(Revision::DefaultHead),
            _ => None,
        }
    }
}

/// A validated toolkit request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Toolkit {
    pub instance_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    pub url: String,
    pub revision: Revision,
    /// `/`-separated, empty for the repository's top.
    pub subdirectory: String,
    pub layout: Layout,
    /// Narrow the skills to those a plugin manifest lists (asked for with
    /// `layout.pluginManifest`; never a default).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plugin_manifest: bool,
    pub scope: Scope,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_start_skill: Option<String>,
    /// Who allowed this commit though no branch or tag of the repository reaches it
    /// (`registry:<id>`, the entry's override); none: such a commit is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_unreachable: Option<String>,
    /// The entry's label the commit came from, as this open took it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<Taken>,
}

/// Parses one toolkit spec from JSON; errors name the field.
pub fn parse_spec(json: &str) -> Result<ToolkitSpec> {
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| Error::field(Code::InvalidArgument, "toolkit", format!("not JSON: {e}")))?;
    spec_from_value(value)
}

/// A spec from a JSON value. The kind is read first, so the error for a bad field names it
/// (serde's tagged enums would lose the path).
pub fn spec_from_value(mut value: serde_json::Value) -> Result<ToolkitSpec> {
    fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T> {
        crate::input::parse(value, "toolkit")
    }
    let Some(object) = value.as_object_mut() else {
        return Err(Error::field(
            Code::InvalidArgument,
            "toolkit",
            "must be a JSON object",
        ));
    };
    let kind = object.remove("kind");
    match kind.as_ref().and_then(|k| k.as_str()) {
        Some("preset") => Ok(ToolkitSpec::Preset(typed(value)?)),
        Some("git") => Ok(ToolkitSpec::Git(typed(value)?)),
        Some("set") => Ok(ToolkitSpec::Set(typed(value)?)),
        Some(other) => Err(Error::field(
            Code::InvalidArgument,
            "kind",
            format!("{other:?} is not \"preset\", \"git\" or \"set\""),
        )),
        None => Err(Error::field(
            Code::InvalidArgument,
            "kind",
            "missing: \"preset\", \"git\" or \"set\"",
        )),
    }
}

/// A full commit id: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits.
pub fn is_hex_commit(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl SetRef {
    /// Its id within its ceiling, a revision of 1 or more, or a label's name (not both).
    pub fn check(&self) -> Result<()> {
        max_len("id", &self.id, 64)?;
        if self.revision.is_some_and(|r| r < 1) {
            return Err(Error::field(
                Code::InvalidArgument,
                "revision",
                "a revision is 1 or more",
            ));
        }
        label_alone(
            self.label.as_deref(),
            self.revision.is_some(),
            "a set names a revision",
        )
    }
}

/// A label's name checked, and refused beside the value it stands for (`pinned`): `names` says
/// what the spec names instead ("a set names a revision").
fn label_alone(label: Option<&str>, pinned: bool, names: &str) -> Result<()> {
    let Some(label) = label else { return Ok(()) };
    labels::check_name("label", label)?;
    if pinned {
        return Err(Error::field(
            Code::InvalidArgument,
            "label",
            format!("{names} or a label, not both"),
        ));
    }
    Ok(())
}

impl ToolkitSpec {
    /// Every string and list of the spec within its ceiling.
    pub(super) fn check_sizes(&self) -> Result<()> {
        match self {
            ToolkitSpec::Preset(p) => {
                max_len("id", &p.id, MAX_NAME)?;
                max_len("version", p.version.as_deref().unwrap_or(""), MAX_NAME)?;
                label_alone(
                    p.label.as_deref(),
                    p.version.is_some(),
                    "a preset names a version",
                )
            }
            ToolkitSpec::Set(s) => s.check(),
            ToolkitSpec::Git(g) => {
                max_len("url", &g.url, MAX_URL)?;
                max_len("instanceId", &g.instance_id, 80)?;
                max_len("ref", g.git_ref.as_deref().unwrap_or(""), 64)?;
                max_len(
                    "subdirectory",
                    g.subdirectory.as_deref().unwrap_or(""),
                    MAX_PATH,
                )?;
                let roots = g.layout.as_ref().and_then(|l| l.skill_roots.as_deref());
                let roots = roots.unwrap_or_default();
                max_items("layout.skillRoots", roots.len(), MAX_ROOTS)?;
                for root in roots {
                    max_len("layout.skillRoots", root, MAX_PATH)?;
                }
                let filter = g.skills.clone().unwrap_or_default();
                for (field, patterns) in [
                    ("skills.include", &filter.include),
                    ("skills.exclude", &filter.exclude),
                ] {
                    max_items(field, patterns.len(), MAX_PATTERNS)?;
                    for p in patterns {
                        max_len(field, p, MAX_PATTERN)?;
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Revision;

    #[test]
    fn a_revision_survives_the_trip_to_a_helper() {
        for r in [
            Revision::Commit("a".repeat(40)),
            Revision::Tag("v1.2".into()),
            Revision::DefaultHead,
        ] {
            assert_eq!(Revision::from_arg(&r.to_arg()), Some(r));
        }
        assert_eq!(Revision::from_arg("main"), None);
    }
}

//! Session-start instructions: a toolkit may name a skill whose instructions belong at the start
//! of every session (superpowers' `using-superpowers`). Those instructions speak of the tools of
//! the agent they were written for; the mapping says which of this server's tools to use instead.

use cloud_harness_store::cas::{Digest, Kind, Store};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolMapping {
    /// The tool name as the instructions mention it.
    pub mentioned: String,
    /// This server's tool to use instead, if there is one.
    #[serde(rename = "use", default, skip_serializing_if = "Option::is_none")]
    pub use_tool: Option<String>,
    pub how: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStart {
    pub toolkit: String,
    pub skill: String,
    pub instructions: String,
    pub tool_mapping: Vec<ToolMapping>,
}

/// Agent tool names session-start skills mention, and what they become here.
const KNOWN_TOOLS: &[(&str, Option<&str>, &str)] = &[
    ("Skill", Some("skills_read"), "load a skill: skills_read {workspace, skill} returns its SKILL.md"),
    ("Read", Some("skills_read"), "read a file of a skill: skills_read {workspace, skill, path}; other files: read them in the working tree"),
    ("Bash", Some("skills_run"), "run a skill's script: skills_run {workspace, skill, script, args}; other commands: your own shell"),
    ("TodoWrite", None, "keep the checklist in your own task list"),
    ("Task", None, "delegate with your own sub-agent mechanism, if you have one"),
];

/// Whether `name` stands in `text` as a word (not inside another word).
fn mentions(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric() && c != '_');
        boundary(before) && boundary(after)
    })
}

pub(crate) fn mapping_for(text: &str) -> Vec<ToolMapping> {
    KNOWN_TOOLS
        .iter()
        .filter(|(name, _, _)| mentions(text, name))
        .map(|&(mentioned, use_tool, how)| ToolMapping {
            mentioned: mentioned.to_owned(),
            use_tool: use_tool.map(str::to_owned),
            how: how.to_owned(),
        })
        .collect()
}

/// The session-start instructions of `skill` in the bundle `bundle`, if it is there.
pub(crate) fn from_bundle(
    store: &Store,
    bundle: &Digest,
    toolkit: &str,
    skill: &str,
    validation: cloud_harness_skills::spec::Validation,
) -> Option<SessionStart> {
    let folder = store
        .tree(bundle)
        .ok()?
        .get(skill)
        .filter(|e| e.kind == Kind::Tree)?
        .digest;
    // A skill its toolkit refuses to serve gives no instructions either.
    if validation == cloud_harness_skills::spec::Validation::Refuse {
        let read = cloud_harness_skills::discovery::read_skill(store, Some(skill), &folder);
        if read.map_or(true, |info| !info.problems.is_empty()) {
            return None;
        }
    }
    let md = store
        .tree(&folder)
        .ok()?
        .get("SKILL.md")
        .filter(|e| e.kind == Kind::File || e.kind == Kind::Executable)?
        .digest;
    let text = String::from_utf8(store.blob_up_to(&md, 1 << 20).ok()?).ok()?;
    // The body: what follows the front matter.
    let body = cloud_harness_skills::skill::body(&text)
        .trim_start_matches(['\r', '\n'])
        .to_owned();
    Some(SessionStart {
        toolkit: toolkit.to_owned(),
        skill: skill.to_owned(),
        tool_mapping: mapping_for(&body),
        instructions: body,
    })
}

/// The instructions as one prompt text, mapping included.
pub fn prompt_text(items: &[SessionStart], workspace: &str) -> String {
    let mut out = String::new();
    for s in items {
        out.push_str(&format!(
            "# Session start: `{}` from toolkit `{}`\n\n{}\n",
            s.skill, s.toolkit, s.instructions
        ));
        if !s.tool_mapping.is_empty() {
            out.push_str(&format!(
                "\n## Tools in this workspace ({workspace})\n\nThe instructions above name tools of another agent. Here:\n\n"
            ));
            for m in &s.tool_mapping {
                out.push_str(&format!("- `{}`: {}\n", m.mentioned, m.how));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_only_the_tools_mentioned_as_words() {
        let m =
            mapping_for("Use the Skill tool first. Track steps with TodoWrite. Reading is fine.");
        let names: Vec<_> = m.iter().map(|m| m.mentioned.as_str()).collect();
        assert_eq!(names, ["Skill", "TodoWrite"]);
        assert_eq!(m[0].use_tool.as_deref(), Some("skills_read"));
        assert!(mapping_for("Skills and Bashful").is_empty());
    }
}

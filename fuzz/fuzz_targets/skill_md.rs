//! The SKILL.md parser: any bytes give a skill or a reason to skip it naming the file, never a
//! panic (nor, under the run's memory limit, an expansion); what it accepts has a description,
//! a name taken from it is a single safe path segment, and the MCP Skills extension's
//! `frontmatter` of it holds every field it kept.
#![no_main]

use cloud_harness_skills::skill::{self, SkillName};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match skill::parse("fuzzed", data) {
        Ok(parsed) => {
            assert!(!parsed.meta.description.trim().is_empty(), "{parsed:?}");
            if let Some(declared) = &parsed.meta.declared_name {
                if let Ok(name) = SkillName::new(declared) {
                    assert!(!name.contains('/') && !name.starts_with('.') && !name.is_empty());
                    assert!(name.len() <= 255);
                }
            }
            serde_json::to_vec(&parsed).expect("a parsed skill serializes");
            let json = skill::frontmatter_json(data);
            if let Some(fields) = json.as_ref().and_then(|j| j.as_object()) {
                for key in parsed.meta.extra.keys() {
                    assert!(fields.contains_key(key), "{key} is missing from {json:?}");
                }
            }
        }
        Err(e) => assert_eq!(e.details["file"], "SKILL.md", "{e}"),
    }
    if let Ok(text) = std::str::from_utf8(data) {
        assert!(text.ends_with(skill::body(text)));
    }
});

//! The SKILL.md parser: any bytes give a skill or a reason to skip it, never a panic; what it
//! accepts has a description, and a name taken from it is a single safe path segment.
#![no_main]

use cloud_harness::fs::skill::{self, SkillName};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(parsed) = skill::parse("fuzzed", data) {
        assert!(!parsed.meta.description.trim().is_empty(), "{parsed:?}");
        if let Some(declared) = &parsed.meta.declared_name {
            if let Ok(name) = SkillName::new(declared) {
                assert!(!name.contains('/') && !name.starts_with('.') && !name.is_empty());
                assert!(name.len() <= 255);
            }
        }
        serde_json::to_vec(&parsed).expect("a parsed skill serializes");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        assert!(text.ends_with(skill::body(text)));
    }
});

//! The bounded YAML front matter parser: any text gives a value within the bounds or a typed
//! refusal, in little time and memory (the run's `-rss_limit_mb` catches an expansion), never a
//! panic; and the MCP Skills extension's `frontmatter` takes the same path.
#![no_main]

use cloud_harness_skills::front_matter::{self, MAX_NESTING, MAX_NODES};
use cloud_harness_skills::skill;
use cloud_harness_error::Code;
use libfuzzer_sys::fuzz_target;
use yaml_serde::Value;

/// Values and nesting of `v`, counted as the parser's budget counts them (a tag as two).
fn measure(v: &Value, depth: usize, nodes: &mut usize, deepest: &mut usize) {
    *nodes += 1;
    *deepest = (*deepest).max(depth);
    match v {
        Value::Sequence(items) => items.iter().for_each(|i| measure(i, depth + 1, nodes, deepest)),
        Value::Mapping(m) => m.iter().for_each(|(k, v)| {
            measure(k, depth + 1, nodes, deepest);
            measure(v, depth + 1, nodes, deepest);
        }),
        Value::Tagged(t) => {
            *nodes += 1;
            measure(&t.value, depth + 1, nodes, deepest);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = front_matter::parse(text);
    match &parsed {
        Ok(value) => {
            let (mut nodes, mut deepest) = (0, 0);
            measure(value, 0, &mut nodes, &mut deepest);
            assert!(nodes <= MAX_NODES, "{nodes} values");
            assert!(deepest <= MAX_NESTING, "{deepest} deep");
        }
        Err(e) => assert!(
            matches!(e.code, Code::TooLarge | Code::InvalidArgument),
            "{e}"
        ),
    }
    // As a SKILL.md's front matter (when no line of it would close the front matter early).
    let closes = text
        .split('\n')
        .any(|l| matches!(l.trim_end(), "---" | "..."));
    if !closes && !text.starts_with('\u{feff}') {
        let md = format!("---\n{text}\n---\nbody\n");
        let json = skill::frontmatter_json(md.as_bytes());
        let mapping = matches!(front_matter::parse(&format!("{text}\n")), Ok(Value::Mapping(_)));
        if json.is_some() {
            assert!(mapping, "frontmatter_json took what the parser refuses");
        }
    }
});

//! The diff's parts that need no store: rename pairing, the unified diff's cuts.

use super::*;

fn info(digest: u8, description: &str) -> (String, Arc<SkillInfo>) {
    let meta = cloud_harness_skills::skill::SkillMeta {
        description: description.to_owned(),
        ..Default::default()
    };
    let info = SkillInfo {
        digest: Digest([digest; 32]),
        meta,
        warnings: Vec::new(),
        problems: Vec::new(),
        links: Default::default(),
    };
    (String::new(), Arc::new(info))
}

fn named(name: &str, (_, i): (String, Arc<SkillInfo>)) -> (String, Arc<SkillInfo>) {
    (name.to_owned(), i)
}

#[test]
fn renames_pair_identical_folders_first_then_descriptions_only_one_skill_has() {
    let removed = vec![
        named("a-old", info(1, "Shared.")),
        named("b-old", info(2, "Deploys.")),
        named("c-old", info(3, "Same words.")),
        named("d-old", info(4, "Same words.")),
    ];
    let added = vec![
        // Takes b-old's description, but a-old's folder: a-old is its rename.
        named("a-new", info(1, "Deploys.")),
        // b-old's description is left to it alone.
        named("b-new", info(9, "Deploys.")),
        // Two removed skills have this description: no rename.
        named("c-new", info(8, "Same words.")),
    ];
    let got: BTreeMap<String, String> = renames(&removed, &added)
        .into_iter()
        .map(|(a, (b, _))| (a, b))
        .collect();
    assert_eq!(
        got,
        BTreeMap::from([
            ("a-new".to_owned(), "a-old".to_owned()),
            ("b-new".to_owned(), "b-old".to_owned()),
        ])
    );
    // Many skills of one description pair none, in time linear in them.
    let many: Vec<_> = (0..20_000u32)
        .map(|i| named(&format!("s{i}"), info((i % 200) as u8, "Generic.")))
        .collect();
    let others: Vec<_> = (0..20_000u32)
        .map(|i| named(&format!("t{i}"), info(250, "Generic.")))
        .collect();
    assert!(renames(&many, &others).is_empty());
}

#[test]
fn a_unified_diff_has_its_context_and_is_cut_at_a_line() {
    let d = unified("a\nb\nc\n", "a\nB\nc\n", MAX_TEXT_DIFF);
    assert_eq!(
        d.unified,
        "--- a/SKILL.md\n+++ b/SKILL.md\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    );
    assert!(!d.truncated);
    let old: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    let new: String = (0..20_000).map(|i| format!("LINE {i}\n")).collect();
    let d = unified(&old, &new, MAX_TEXT_DIFF);
    assert!(d.truncated && d.unified.len() <= MAX_TEXT_DIFF && d.unified.ends_with('\n'));
    // One line longer than the room: its start is shown.
    let long = format!("{}\n", "é".repeat(MAX_TEXT_DIFF));
    let d = unified("", &long, MAX_TEXT_DIFF);
    assert!(
        d.truncated && d.unified.len() <= MAX_TEXT_DIFF,
        "{}",
        d.unified.len()
    );
    assert!(d.unified.contains("+ééé"), "{}", &d.unified[..80]);
}

//! Normalization: the skills discovered in a staged toolkit become one bundle — a tree whose
//! entries are the skill folders, side by side — and a manifest of where they came from.

use cloud_harness_control::toolkit::{Toolkit, MAX_PATH, MAX_ROOTS};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_skills::discovery::{discover, Layout, SkillCache, Skipped};
use cloud_harness_skills::spec::Validation;
use cloud_harness_store::cas::{Digest, Entry, Kind, Store, Tree, WalkBudget};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Part of every bundle index key: a change of these rules makes new bundles.
/// 2: a plugin manifest narrows the skills only when the layout asks for it.
/// 3: a plugin manifest's skill roots are taken once each, none inside another, at most 16.
pub const NORMALIZER_VERSION: u32 = 3;

/// Where a plugin manifest may list the skills its author ships.
const PLUGIN_MANIFESTS: [&str; 2] = [
    ".claude-plugin/marketplace.json",
    ".claude-plugin/plugin.json",
];
/// The largest plugin manifest read, and the most skill paths taken from one: past either it
/// is left aside with a warning, as one that is not JSON is.
const MAX_PLUGIN_MANIFEST: u64 = 1 << 20;
const MAX_PLUGIN_PATHS: usize = 4096;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SourceInfo {
    pub url: String,
    pub fetched_url: String,
    pub commit: String,
    pub object_format: String,
    pub subdirectory: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ManifestFile {
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ManifestSkill {
    pub name: String,
    /// Where the skill folder sits in the repository (below the subdirectory).
    pub path: String,
    pub digest: Digest,
    pub description: String,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    pub normalizer: u32,
    pub source: SourceInfo,
    pub layout: Layout,
    pub skills: Vec<ManifestSkill>,
    pub skipped: Vec<Skipped>,
    pub warnings: Vec<String>,
}

pub(crate) struct Bundle {
    pub tree: Digest,
    pub manifest: Digest,
    pub skills: usize,
    pub warnings: Vec<String>,
    pub skipped: Vec<Skipped>,
}

/// The layout a plugin manifest declares, if the toolkit has one that lists skills. One that
/// cannot be used (too large, too many paths) is a warning.
fn plugin_layout(
    store: &Store,
    root: &Tree,
    base: &Layout,
    warnings: &mut Vec<String>,
) -> Result<Option<(Layout, &'static str)>> {
    for manifest in PLUGIN_MANIFESTS {
        let (dir, file) = manifest.split_once('/').expect("a folder and a file");
        let Some(folder) = root.get(dir).filter(|e| e.kind == Kind::Tree) else {
            continue;
        };
        let Some(entry) = store.tree(&folder.digest)?.get(file).cloned() else {
            continue;
        };
        if entry.kind != Kind::File {
            continue;
        }
        if entry.size > MAX_PLUGIN_MANIFEST {
            warnings.push(format!(
                "{manifest} is {} bytes, more than the {MAX_PLUGIN_MANIFEST} read; it is not used",
                entry.size
            ));
            continue;
        }
        // JSON nested deeper than serde_json's recursion limit (128) is an error like any.
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(
            &store.blob_up_to(&entry.digest, MAX_PLUGIN_MANIFEST)?,
        ) else {
            continue;
        };
        let mut paths = Vec::new();
        let mut collect = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => paths.push(s.clone()),
            serde_json::Value::Array(items) => {
                paths.extend(items.iter().filter_map(|i| i.as_str().map(str::to_owned)))
            }
            _ => {}
        };
        collect(&json["skills"]);
        if let Some(plugins) = json["plugins"].as_array() {
            for p in plugins {
                collect(&p["skills"]);
            }
        }
        if paths.len() > MAX_PLUGIN_PATHS {
            warnings.push(format!(
                "{manifest} lists {} skill paths, more than the {MAX_PLUGIN_PATHS} taken; it is not used",
                paths.len()
            ));
            continue;
        }
        let roots = plugin_roots(&paths, base.recursive, manifest, warnings);
        if !roots.is_empty() {
            let layout = Layout {
                skill_roots: roots,
                ..base.clone()
            };
            return Ok(Some((layout, manifest)));
        }
    }
    Ok(None)
}

/// The skill roots of a plugin manifest's `paths`, as a client's layout could give them:
/// each a relative path inside the toolkit (others are left out), taken once however it is
/// spelled (`skills`, `./skills/`), none inside another when the search is recursive (the
/// outer one's search finds its skills), at most [`MAX_ROOTS`] (past them, a warning and the
/// rest ignored). Discovery walks each root whole, so 4096 copies of `.` would walk the
/// toolkit 4096 times.
fn plugin_roots(
    paths: &[String],
    recursive: bool,
    manifest: &str,
    warnings: &mut Vec<String>,
) -> Vec<String> {
    let distinct: BTreeSet<Vec<&str>> = paths
        .iter()
        .filter(|p| p.len() <= MAX_PATH)
        .filter_map(|p| cloud_harness_skills::relpath::segments(p, "skills", "the toolkit").ok())
        .collect();
    // In order, a root comes right after any root it is inside of.
    let mut roots: Vec<Vec<&str>> = Vec::new();
    for root in distinct {
        if recursive && roots.iter().any(|outer| root.starts_with(outer)) {
            continue;
        }
        roots.push(root);
    }
    if roots.len() > MAX_ROOTS {
        warnings.push(format!(
            "{manifest} lists {} skill roots, more than the {MAX_ROOTS} taken; the first {MAX_ROOTS} in name order are searched, the rest ignored",
            roots.len()
        ));
        roots.truncate(MAX_ROOTS);
    }
    roots
        .into_iter()
        .map(|r| match r.is_empty() {
            true => ".".to_owned(),
            false => r.join("/"),
        })
        .collect()
}

fn files_of(
    store: &Store,
    digest: &Digest,
    prefix: &str,
    out: &mut Vec<ManifestFile>,
    budget: &mut WalkBudget,
) -> Result<()> {
    for e in budget.tree(store, digest)?.entries() {
        let path = if prefix.is_empty() {
            e.name.clone()
        } else {
            format!("{prefix}/{}", e.name)
        };
        if e.kind == Kind::Tree {
            files_of(store, &e.digest, &path, out, budget)?;
        } else {
            out.push(ManifestFile {
                path,
                kind: e.kind,
                size: e.size,
                // Blobs are named by the SHA-256 of their bytes.
                sha256: e.digest.hex(),
            });
        }
    }
    Ok(())
}

/// Builds and publishes the bundle of the staged tree `staged`.
pub(crate) fn normalize(
    store: &Store,
    staged: Digest,
    toolkit: &Toolkit,
    source: SourceInfo,
    mut warnings: Vec<String>,
) -> Result<Bundle> {
    let root = store.tree(&staged)?;
    // Every skill goes into the bundle; a policy that refuses some is applied when it is
    // served (`bundle_source`).
    let mut layout = Layout {
        validation: Validation::Warn,
        ..toolkit.layout.clone()
    };
    let manifest = plugin_layout(store, &root, &layout, &mut warnings)?;
    let mut unused_manifest = None;
    match manifest {
        Some((declared, file)) if toolkit.plugin_manifest => {
            warnings.push(format!(
                "{file} lists the skills this toolkit ships; only those are installed (layout.pluginManifest)"
            ));
            layout = declared;
        }
        Some((declared, file)) => unused_manifest = Some((declared, file)),
        None if toolkit.plugin_manifest => warnings.push(
            "layout.pluginManifest: the toolkit has no plugin manifest that lists skills; every skill of the skill roots is installed".into(),
        ),
        None => {}
    }
    let found = discover(store, &staged, &layout, &SkillCache::default())?;
    warnings.extend(found.warnings.iter().cloned());
    if let Some((declared, file)) = unused_manifest {
        let listed = discover(store, &staged, &declared, &SkillCache::default())?
            .skills
            .len();
        if listed < found.skills.len() {
            warnings.push(format!(
                "{file} lists {listed} of the {} skills found; all are installed (set layout.pluginManifest to install only those)",
                found.skills.len()
            ));
        }
    }

    // The manifest lists every file of every skill, by path: one walk, one budget.
    let mut budget = WalkBudget::default();
    let mut by_name: BTreeMap<&str, &str> = BTreeMap::new();
    let mut entries = Vec::new();
    let mut skills = Vec::new();
    for s in &found.skills {
        if let Some(first) = by_name.insert(&s.name, &s.path) {
            return Err(Error::new(
                Code::Conflict,
                format!(
                    "the toolkit has two skills named `{}` ({first} and {}); exclude one with skills.exclude or pick a layout",
                    s.name, s.path
                ),
            )
            .with_details(serde_json::json!({ "skill": s.name, "paths": [first, s.path] })));
        }
        for w in &s.info.warnings {
            warnings.push(format!("{}: {w}", s.name));
        }
        let mut files = Vec::new();
        files_of(store, &s.info.digest, "", &mut files, &mut budget)?;
        skills.push(ManifestSkill {
            name: s.name.to_string(),
            path: s.path.clone(),
            digest: s.info.digest,
            description: s.info.meta.description.clone(),
            files,
        });
        entries.push(Entry {
            name: s.name.to_string(),
            kind: Kind::Tree,
            size: 0,
            digest: s.info.digest,
        });
    }
    let manifest = Manifest {
        normalizer: NORMALIZER_VERSION,
        source,
        layout,
        skills,
        skipped: found.skipped.clone(),
        warnings: warnings.clone(),
    };
    let mut writer = store.writer()?;
    let tree = writer.put_tree(&Tree::new(entries)?)?;
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::internal(e.to_string()))?;
    let manifest_digest = writer.put_blob(&json)?;
    writer.commit()?;
    Ok(Bundle {
        tree,
        manifest: manifest_digest,
        skills: found.skills.len(),
        warnings,
        skipped: found.skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(paths: &[&str], recursive: bool) -> (Vec<String>, Vec<String>) {
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        let mut warnings = Vec::new();
        let roots = plugin_roots(&paths, recursive, "plugin.json", &mut warnings);
        (roots, warnings)
    }

    #[test]
    fn a_plugin_manifest_s_roots_are_taken_once_none_inside_another_at_most_sixteen() {
        // 4096 copies of the toolkit's top, spelled three ways: one root.
        let mut tops = vec!["."; 4094];
        tops.extend(["./", ""]);
        assert_eq!(roots(&tops, true), (vec![".".to_owned()], vec![]));
        let (taken, warned) = roots(
            &[
                "skills",
                "./skills/",
                "skills/cat",
                "skills-extra",
                "../up",
                "/abs",
            ],
            true,
        );
        assert_eq!(taken, ["skills", "skills-extra"]);
        assert!(warned.is_empty());
        // Not recursive: a root inside another holds skills the outer one does not reach.
        let (taken, _) = roots(&["skills", "skills/cat"], false);
        assert_eq!(taken, ["skills", "skills/cat"]);
        let many: Vec<String> = (0..40).map(|i| format!("kit-{i:02}/skills")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let (taken, warned) = roots(&many, true);
        assert_eq!(taken.len(), MAX_ROOTS);
        assert_eq!(taken[0], "kit-00/skills");
        assert!(
            warned[0].contains("lists 40 skill roots, more than the 16 taken"),
            "{warned:?}"
        );
    }

    /// A toolkit whose plugin manifest lists its top 4096 times: each skill once, whether or
    /// not the layout narrows to the manifest (which once made 4096 copies of every skill, and
    /// a conflict of each with itself).
    #[test]
    fn a_plugin_manifest_listing_one_root_many_times_finds_each_skill_once() {
        use cloud_harness_store::cas::Entry;
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let mut w = store.writer().unwrap();
        let mut top = Vec::new();
        for i in 0..20 {
            let md = format!("---\nname: s{i:02}\ndescription: d\n---\n");
            let md = Entry {
                name: "SKILL.md".into(),
                kind: Kind::File,
                size: md.len() as u64,
                digest: w.put_blob(md.as_bytes()).unwrap(),
            };
            top.push(Entry {
                name: format!("s{i:02}"),
                kind: Kind::Tree,
                size: 0,
                digest: w.put_tree(&Tree::new(vec![md]).unwrap()).unwrap(),
            });
        }
        let json = serde_json::to_vec(&serde_json::json!({ "skills": vec!["."; 4096] })).unwrap();
        let plugin = Entry {
            name: "plugin.json".into(),
            kind: Kind::File,
            size: json.len() as u64,
            digest: w.put_blob(&json).unwrap(),
        };
        top.push(Entry {
            name: ".claude-plugin".into(),
            kind: Kind::Tree,
            size: 0,
            digest: w.put_tree(&Tree::new(vec![plugin]).unwrap()).unwrap(),
        });
        let staged = w.put_tree(&Tree::new(top).unwrap()).unwrap();
        w.commit().unwrap();
        let source = SourceInfo {
            url: "https://git.example/kit.git".into(),
            fetched_url: "https://git.example/kit.git".into(),
            commit: "c".repeat(40),
            object_format: "sha1".into(),
            subdirectory: String::new(),
        };
        for narrow in [true, false] {
            let spec = serde_json::json!({ "kind": "git", "instanceId": "team", "url": "https://git.example/kit.git", "layout": { "skillRoots": ["."], "pluginManifest": narrow } });
            let toolkit = cloud_harness_control::toolkit::parse_spec(&spec.to_string())
                .unwrap()
                .resolve(&cloud_harness_control::hosts::HostPolicy::new("git.example", "").unwrap())
                .unwrap();
            let bundle = normalize(&store, staged, &toolkit, source.clone(), vec![]).unwrap();
            assert_eq!(bundle.skills, 20, "pluginManifest {narrow}");
        }
    }
}

//! Normalization: the skills discovered in a staged toolkit become one bundle — a tree whose
//! entries are the skill folders, side by side — and a manifest of where they came from.

use crate::toolkit::Toolkit;
use cloud_harness_fs::cas::{Digest, Entry, Kind, Store, Tree};
use cloud_harness_fs::discovery::{discover, Layout, SkillCache, Skipped};
use cloud_harness_fs::{Code, Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;

/// Part of every bundle index key: a change of these rules makes new bundles.
/// 2: a plugin manifest narrows the skills only when the layout asks for it.
pub const NORMALIZER_VERSION: u32 = 2;

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
pub struct SourceInfo {
    pub url: String,
    pub fetched_url: String,
    pub commit: String,
    pub object_format: String,
    pub subdirectory: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ManifestFile {
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ManifestSkill {
    pub name: String,
    /// Where the skill folder sits in the repository (below the subdirectory).
    pub path: String,
    pub digest: Digest,
    pub description: String,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub normalizer: u32,
    pub source: SourceInfo,
    pub layout: Layout,
    pub skills: Vec<ManifestSkill>,
    pub skipped: Vec<Skipped>,
    pub warnings: Vec<String>,
}

pub struct Bundle {
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
        let roots: Vec<String> = paths
            .iter()
            .map(|p| p.trim_start_matches("./").trim_end_matches('/').to_owned())
            .filter(|p| !p.is_empty() && !p.starts_with('/') && !p.split('/').any(|s| s == ".."))
            .collect();
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

fn files_of(
    store: &Store,
    digest: &Digest,
    prefix: &str,
    out: &mut Vec<ManifestFile>,
) -> Result<()> {
    for e in store.tree(digest)?.entries() {
        let path = if prefix.is_empty() {
            e.name.clone()
        } else {
            format!("{prefix}/{}", e.name)
        };
        if e.kind == Kind::Tree {
            files_of(store, &e.digest, &path, out)?;
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
pub fn normalize(
    store: &Store,
    staged: Digest,
    toolkit: &Toolkit,
    source: SourceInfo,
    mut warnings: Vec<String>,
) -> Result<Bundle> {
    let root = store.tree(&staged)?;
    let mut layout = toolkit.layout.clone();
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
        files_of(store, &s.info.digest, "", &mut files)?;
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

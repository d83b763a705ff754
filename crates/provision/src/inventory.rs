//! What a bundle holds, as a software bill of materials (CycloneDX 1.5 JSON): the toolkit
//! (its repository, commit, bundle digest and the reachability of its commit), each skill
//! folder, and each file with its SHA-256, size and mode, read from the store. And the other
//! way: which bundles hold a file (by digest) or a skill (by name).
//!
//! Every walk is bounded (`WalkBudget`) and so is every answer ([`MAX_HELD`]).

use crate::index::{BundleIndex, BundleRecord};
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{Digest, Kind, Store, WalkBudget};
use serde::Serialize;
use serde_json::{json, Value};

/// The most places one search answers with.
pub const MAX_HELD: usize = 1_000;

/// The record of the bundle `bundle` in the index, or NOT_FOUND.
pub fn record(index: &BundleIndex, bundle: &Digest) -> Result<BundleRecord> {
    index
        .list()?
        .into_iter()
        .find(|r| r.bundle == *bundle)
        .ok_or_else(|| {
            Error::field(
                Code::NotFound,
                "bundle",
                format!("no bundle {bundle} in this store's index"),
            )
        })
}

/// One file of a bundle: the skill folder it is in (empty at the top) and its path there.
struct File {
    skill: String,
    path: String,
    kind: Kind,
    size: u64,
    digest: Digest,
}

/// Every file of the tree `root`, depth first in canonical order, under `budget`.
fn files(store: &Store, root: &Digest, budget: &mut WalkBudget) -> Result<Vec<File>> {
    let mut out = Vec::new();
    // (tree, its path in the bundle)
    let mut pending = vec![(*root, String::new())];
    while let Some((digest, at)) = pending.pop() {
        let tree = budget.tree(store, &digest)?;
        for entry in tree.entries().iter().rev() {
            let path = match at.is_empty() {
                true => entry.name.clone(),
                false => format!("{at}/{}", entry.name),
            };
            match entry.kind {
                Kind::Tree => pending.push((entry.digest, path)),
                kind => {
                    let (skill, rest) = match path.split_once('/') {
                        Some((s, r)) => (s.to_owned(), r.to_owned()),
                        None => (String::new(), path),
                    };
                    out.push(File {
                        skill,
                        path: rest,
                        kind,
                        size: entry.size,
                        digest: entry.digest,
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.skill, &a.path).cmp(&(&b.skill, &b.path)));
    Ok(out)
}

fn mode(kind: Kind) -> &'static str {
    match kind {
        Kind::Executable => "0755",
        Kind::Symlink => "symlink",
        _ => "0644",
    }
}

fn property(name: &str, value: impl ToString) -> Value {
    json!({ "name": format!("cloud-harness:{name}"), "value": value.to_string() })
}

/// A serial number of the form CycloneDX asks for (`urn:uuid:`), the same for the same bundle.
fn serial(bundle: &Digest) -> String {
    let h = bundle.hex();
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The inventory of the bundle `record` names, from `store`.
pub fn of(store: &Store, record: &BundleRecord) -> Result<Value> {
    let files = files(store, &record.bundle, &mut WalkBudget::default())?;
    let mut properties = vec![
        property("commit", &record.key.commit),
        property("bundle", record.bundle),
        property("requested", &record.requested),
        property("acquiredAt", record.acquired_at),
    ];
    if !record.key.subdirectory.is_empty() {
        properties.push(property("subdirectory", &record.key.subdirectory));
    }
    match &record.reach {
        Some(r) => {
            properties.push(property("reach.reachable", r.reachable));
            properties.push(property(
                "reach.how",
                serde_json::to_value(r.how)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
            ));
            if let Some(via) = &r.via {
                properties.push(property("reach.via", via));
            }
            properties.push(property("reach.checkedAt", r.checked_at));
        }
        None => properties.push(property("reach.how", "unchecked")),
    }
    let mut skills: Vec<Value> = Vec::new();
    let mut top: Vec<Value> = Vec::new();
    for f in &files {
        let component = json!({
            "type": "file",
            "bom-ref": format!("file:{}/{}", f.skill, f.path),
            "name": f.path,
            "hashes": [{ "alg": "SHA-256", "content": f.digest.hex() }],
            "properties": [property("size", f.size), property("mode", mode(f.kind))],
        });
        if f.skill.is_empty() {
            top.push(component);
            continue;
        }
        let new_skill = skills
            .last()
            .is_none_or(|s| s["name"].as_str() != Some(f.skill.as_str()));
        if new_skill {
            skills.push(json!({
                "type": "library",
                "bom-ref": format!("skill:{}", f.skill),
                "name": f.skill,
                "components": [],
            }));
        }
        let last = skills.last_mut().expect("a skill was pushed");
        last["components"]
            .as_array_mut()
            .expect("an array")
            .push(component);
    }
    skills.extend(top);
    Ok(json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": serial(&record.bundle),
        "version": 1,
        "metadata": {
            "tools": { "components": [{
                "type": "application",
                "name": "cloud-harness",
                "version": env!("CARGO_PKG_VERSION"),
            }]},
            "component": {
                "type": "library",
                "bom-ref": "bundle",
                "name": record.instance_id,
                "version": record.key.commit,
                "externalReferences": [{ "type": "vcs", "url": record.key.url }],
                "properties": properties,
            },
        },
        "components": skills,
    }))
}

/// What a search looks for.
#[derive(Debug, Clone)]
pub enum Needle {
    /// A file by the SHA-256 of its bytes.
    File(Digest),
    /// A skill folder by name.
    Skill(String),
}

/// A place a bundle holds what was looked for.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub bundle: Digest,
    pub url: String,
    pub commit: String,
    pub instance_id: String,
    pub skill: String,
    /// The file's path in its skill folder; empty for a skill.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
}

/// Every place a bundle of the index holds `needle`, at most [`MAX_HELD`]; each bundle's walk
/// bounded.
pub fn held(store: &Store, index: &BundleIndex, needle: &Needle) -> Result<Vec<Held>> {
    let mut out = Vec::new();
    for record in index.list()? {
        let place = |skill: &str, path: &str| Held {
            bundle: record.bundle,
            url: record.key.url.clone(),
            commit: record.key.commit.clone(),
            instance_id: record.instance_id.clone(),
            skill: skill.to_owned(),
            path: path.to_owned(),
        };
        match needle {
            Needle::Skill(name) => {
                let tree = store.tree(&record.bundle)?;
                let found = tree
                    .entries()
                    .iter()
                    .any(|e| e.kind == Kind::Tree && e.name == *name);
                if found {
                    out.push(place(name, ""));
                }
            }
            Needle::File(digest) => {
                for f in files(store, &record.bundle, &mut WalkBudget::default())? {
                    if f.digest == *digest && f.kind != Kind::Symlink {
                        out.push(place(&f.skill, &f.path));
                    }
                }
            }
        }
        if out.len() >= MAX_HELD {
            out.truncate(MAX_HELD);
            break;
        }
    }
    Ok(out)
}

/// Where something was found: the places bundles hold it, and the acquisitions that served
/// those bundles (which workspaces and imports, by whom, for which tier, when; the history
/// keeps closed workspaces' too).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    pub held: Vec<Held>,
    pub served: Vec<crate::acquisitions::Acquisition>,
}

/// [`held`], and the acquisitions of each bundle found, newest first, at most [`MAX_HELD`].
pub fn search(
    store: &Store,
    db: &cloud_harness_control::state::Db,
    needle: &Needle,
) -> Result<Found> {
    let held = held(store, &BundleIndex::open(store), needle)?;
    let mut bundles: Vec<String> = held.iter().map(|h| h.bundle.to_string()).collect();
    bundles.dedup();
    let mut served = Vec::new();
    for bundle in &bundles {
        let left = MAX_HELD.saturating_sub(served.len());
        if left == 0 {
            break;
        }
        served.extend(crate::acquisitions::of_bundle(db, bundle, left)?);
    }
    served.sort_by_key(|a| std::cmp::Reverse(a.seq));
    Ok(Found { held, served })
}

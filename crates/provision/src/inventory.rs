//! What a bundle holds, as a software bill of materials (CycloneDX 1.5 JSON): the toolkit
//! (its repository, commit, bundle digest and the reachability of its commit), each skill
//! folder, and each file with its SHA-256, size and mode, read from the store. And the other
//! way: which bundles hold a file (by digest) or a skill (by name).
//!
//! Every walk is bounded (entries and depth) and so is every answer ([`MAX_HELD`]): a search
//! shares one budget across every bundle it reads, and stops where it runs out, saying so.

use crate::index::{BundleIndex, BundleRecord};
use cloud_harness_control::signatures::{self, policy::Policy, verdict::judge, Subject};
use cloud_harness_control::state::Db;
use cloud_harness_error::{Code, Error, Result};
use cloud_harness_store::cas::{
    Digest, Entry, Kind, Store, WalkBudget, MAX_TREE_DEPTH, MAX_WALK_ENTRIES,
};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};

/// The most places, and acquisitions, one search answers with.
pub const MAX_HELD: usize = 1_000;

/// The newest record of the bundle `bundle` in the index (one bundle may be recorded under
/// several keys), or NOT_FOUND.
pub fn record(index: &BundleIndex, bundle: &Digest) -> Result<BundleRecord> {
    index.by_bundle(bundle)?.ok_or_else(|| {
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

/// The most bytes of paths one walk builds: a hostile tree of long names nested deep cannot
/// make a walk build gigabytes of them.
const MAX_PATH_BYTES: usize = 64 << 20;

/// The files of the tree `root` that `keep` keeps, sorted by skill and path, under `budget`
/// and the store's depth limit; a path is built only for a file kept.
fn files(
    store: &Store,
    root: &Digest,
    budget: &mut WalkBudget,
    keep: impl Fn(&Entry) -> bool,
) -> Result<Vec<File>> {
    let mut out = Vec::new();
    // Each folder walked: its parent's index here and its name, so a path costs its own
    // names only when a file in it is kept.
    let mut folders: Vec<(Option<usize>, String)> = Vec::new();
    let mut built = 0usize;
    // (tree, its folder's index, its depth)
    let mut pending = vec![(*root, None, 0usize)];
    while let Some((digest, folder, depth)) = pending.pop() {
        if depth > MAX_TREE_DEPTH {
            return Err(Error::too_large(format!(
                "bundle {root} nests folders deeper than {MAX_TREE_DEPTH}"
            ))
            .with_details(json!({ "bound": "depth", "limit": MAX_TREE_DEPTH })));
        }
        let tree = budget.tree(store, &digest)?;
        for entry in tree.entries() {
            if entry.kind == Kind::Tree {
                folders.push((folder, entry.name.clone()));
                pending.push((entry.digest, Some(folders.len() - 1), depth + 1));
                continue;
            }
            if !keep(entry) {
                continue;
            }
            let mut names = vec![entry.name.as_str()];
            let mut at = folder;
            while let Some(i) = at {
                names.push(folders[i].1.as_str());
                at = folders[i].0;
            }
            names.reverse();
            built += names.iter().map(|n| n.len() + 1).sum::<usize>();
            if built > MAX_PATH_BYTES {
                return Err(Error::too_large(format!(
                    "bundle {root} names files by paths longer than {MAX_PATH_BYTES} bytes in all"
                ))
                .with_details(json!({ "bound": "path_bytes", "limit": MAX_PATH_BYTES })));
            }
            let (skill, path) = match names.split_first() {
                Some((first, rest)) if !rest.is_empty() => (first.to_string(), rest.join("/")),
                _ => (String::new(), entry.name.clone()),
            };
            out.push(File {
                skill,
                path,
                kind: entry.kind,
                size: entry.size,
                digest: entry.digest,
            });
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

/// A serial number as CycloneDX asks for it (an RFC 4122 UUID, name-based: version 5's bits
/// over a SHA-256), the same for the same record of the same bundle.
fn serial(record: &BundleRecord) -> String {
    let name = format!("{}\n{}", record.key.id(), record.bundle);
    let h = Digest::of(name.as_bytes()).hex();
    let variant = ["8", "9", "a", "b"][usize::from_str_radix(&h[16..17], 16).unwrap_or(0) % 4];
    format!(
        "urn:uuid:{}-{}-5{}-{variant}{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// `signature.<tier>.status` (the verdict), `….verifiedBy` (the trusted keys whose signatures
/// verified) and `….signedBy` (every key with a signature kept) of each tier that has a
/// signature or a scope of the policy.
fn signature_properties(record: &BundleRecord, db: &Db, policy: &Policy) -> Result<Vec<Value>> {
    let bundle = record.bundle.to_string();
    let mut out = Vec::new();
    for tier in signatures::TIERS {
        let on = Subject {
            url: &record.key.url,
            commit: &record.key.commit,
            bundle: &bundle,
            tier,
        };
        let kept = signatures::stored::of_subject(db, on)?;
        let signed_by: Vec<&str> = kept.iter().map(|s| s.key.as_str()).collect();
        if signed_by.is_empty() && policy.covering(on.url, tier).next().is_none() {
            continue;
        }
        let verdict = judge(policy, on, &kept);
        out.push(property(
            &format!("signature.{tier}.status"),
            verdict.status.as_str(),
        ));
        if !verdict.keys.is_empty() {
            out.push(property(
                &format!("signature.{tier}.verifiedBy"),
                verdict.keys.join(","),
            ));
        }
        if !signed_by.is_empty() {
            out.push(property(
                &format!("signature.{tier}.signedBy"),
                signed_by.join(","),
            ));
        }
    }
    Ok(out)
}

/// The inventory of the bundle `record` names, from `store`; its signatures (from `db`) and
/// `policy`'s verdict on them, for each tier with a signature or a scope covering it.
pub fn of(store: &Store, record: &BundleRecord, db: &Db, policy: &Policy) -> Result<Value> {
    let files = files(store, &record.bundle, &mut WalkBudget::default(), |_| true)?;
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
    properties.extend(signature_properties(record, db, policy)?);
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
        "serialNumber": serial(record),
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
pub struct Place {
    pub bundle: Digest,
    pub url: String,
    pub commit: String,
    pub instance_id: String,
    pub skill: String,
    /// The file's path in its skill folder; empty for a skill.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
}

/// What a search found in the index: the places, the bundles it could not read (damaged,
/// or trimmed from the store meanwhile) and whether it stopped short (its budget or
/// [`MAX_HELD`] reached).
pub struct Held {
    pub places: Vec<Place>,
    pub unreadable: Vec<Digest>,
    pub truncated: bool,
}

/// Every place a bundle of the index holds `needle`: each bundle read once however many
/// records name it, all of them under one walk budget (about a second of work).
pub fn held(store: &Store, index: &BundleIndex, needle: &Needle) -> Result<Held> {
    let mut budget = WalkBudget::default();
    let mut found = Held {
        places: Vec::new(),
        unreadable: Vec::new(),
        truncated: false,
    };
    // (skill, path) matched in each bundle read so far.
    let mut read: HashMap<Digest, Vec<(String, String)>> = HashMap::new();
    for record in index.list()? {
        if let std::collections::hash_map::Entry::Vacant(slot) = read.entry(record.bundle) {
            let matched = match needle {
                Needle::Skill(name) => budget.tree(store, &record.bundle).map(|tree| {
                    tree.entries()
                        .iter()
                        .filter(|e| e.kind == Kind::Tree && e.name == *name)
                        .map(|e| (e.name.clone(), String::new()))
                        .collect()
                }),
                Needle::File(digest) => files(store, &record.bundle, &mut budget, |e| {
                    e.digest == *digest && e.kind != Kind::Symlink
                })
                .map(|all| {
                    all.into_iter()
                        .take(MAX_HELD + 1)
                        .map(|f| (f.skill, f.path))
                        .collect()
                }),
            };
            match matched {
                Ok(m) => {
                    slot.insert(m);
                }
                // The search's budget is spent (not this bundle's own fault): stop here.
                Err(_) if budget.listed() > MAX_WALK_ENTRIES => {
                    found.truncated = true;
                    break;
                }
                Err(_) => {
                    found.unreadable.push(record.bundle);
                    slot.insert(Vec::new());
                }
            }
        }
        for (skill, path) in &read[&record.bundle] {
            if found.places.len() == MAX_HELD {
                found.truncated = true;
                return Ok(found);
            }
            found.places.push(Place {
                bundle: record.bundle,
                url: record.key.url.clone(),
                commit: record.key.commit.clone(),
                instance_id: record.instance_id.clone(),
                skill: skill.clone(),
                path: path.clone(),
            });
        }
    }
    Ok(found)
}

/// Where something was found: the places bundles of this runner's index hold it, and the
/// acquisitions that served those bundles (which workspaces and imports, by whom, for which
/// tier, when; the history keeps closed workspaces' too, its newest 100,000 rows).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    pub held: Vec<Place>,
    pub served: Vec<crate::acquisitions::Acquisition>,
    /// Bundles of the index that could not be read (damaged, or trimmed meanwhile).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Digest>,
    /// True when `held` or `served` stopped short of all there is.
    pub truncated: bool,
}

/// [`held`], and the acquisitions of each bundle found, newest first, at most [`MAX_HELD`].
pub fn search(store: &Store, db: &Db, needle: &Needle) -> Result<Found> {
    let held = held(store, &BundleIndex::open(store), needle)?;
    // One bundle may be recorded under several keys (the same tree from two URLs).
    let bundles: BTreeSet<String> = held.places.iter().map(|h| h.bundle.to_string()).collect();
    let mut served = Vec::new();
    for bundle in &bundles {
        served.extend(crate::acquisitions::of_bundle(db, bundle, MAX_HELD + 1)?);
    }
    served.sort_by_key(|a| std::cmp::Reverse(a.seq));
    let truncated = held.truncated || served.len() > MAX_HELD;
    served.truncate(MAX_HELD);
    Ok(Found {
        held: held.places,
        served,
        unreadable: held.unreadable,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::BundleKey;

    fn record(url: &str, bundle: Digest) -> BundleRecord {
        BundleRecord {
            key: BundleKey {
                url: url.into(),
                commit: "c".repeat(40),
                subdirectory: String::new(),
                layout: Default::default(),
                plugin_manifest: false,
                normalizer: crate::normalize::NORMALIZER_VERSION,
            },
            bundle,
            manifest: bundle,
            skills: 1,
            instance_id: "kit".into(),
            preset: None,
            fetched_url: url.into(),
            object_format: "sha1".into(),
            requested: "commit".into(),
            warnings: vec![],
            skipped: vec![],
            acquired_at: 0,
            pack: None,
            reach: None,
        }
    }

    #[test]
    fn a_bundle_two_records_name_is_found_for_each_and_one_missing_is_named_not_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path().join("store")).unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("lint/scripts")).unwrap();
        std::fs::write(src.join("lint/SKILL.md"), "same").unwrap();
        std::fs::write(src.join("lint/scripts/copy.md"), "same").unwrap();
        let bundle = store.import_dir(&src, &Default::default()).unwrap().digest;
        let index = BundleIndex::open(&store);
        let gone = Digest::of(b"a bundle no longer in the store");
        for r in [
            record("https://a.example/kit.git", bundle),
            record("https://b.example/kit.git", bundle),
            record("https://c.example/gone.git", gone),
        ] {
            index.put(&r).unwrap();
        }
        let found = held(&store, &index, &Needle::File(Digest::of(b"same"))).unwrap();
        let mut places: Vec<(String, String, String)> = found
            .places
            .iter()
            .map(|p| (p.url.clone(), p.skill.clone(), p.path.clone()))
            .collect();
        places.sort();
        assert_eq!(places.len(), 4, "{places:?}");
        assert_eq!(
            places[..2],
            [
                (
                    "https://a.example/kit.git".into(),
                    "lint".into(),
                    "SKILL.md".into()
                ),
                (
                    "https://a.example/kit.git".into(),
                    "lint".into(),
                    "scripts/copy.md".into()
                ),
            ]
        );
        assert_eq!((found.unreadable, found.truncated), (vec![gone], false));

        // The inventory's serial is an RFC 4122 UUID of the version-5 shape, per record.
        let home = tempfile::tempdir().unwrap();
        let db = Db::open_sqlite(home.path()).unwrap();
        let policy = Policy::default();
        let doc = of(
            &store,
            &record("https://a.example/kit.git", bundle),
            &db,
            &policy,
        )
        .unwrap();
        let serial = doc["serialNumber"].as_str().unwrap();
        let uuid = serial.strip_prefix("urn:uuid:").unwrap();
        let parts: Vec<&str> = uuid.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(
            parts[2].starts_with('5') && "89ab".contains(&parts[3][..1]),
            "{serial}"
        );
        let other = of(
            &store,
            &record("https://b.example/kit.git", bundle),
            &db,
            &policy,
        )
        .unwrap();
        assert_ne!(other["serialNumber"], doc["serialNumber"]);
    }
}

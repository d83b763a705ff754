//! Skills held to the Agent Skills specification: a corpus of broken skills, one folder per
//! rule (`tests/spec/corpus`, the rules each breaks in `tests/spec/expected.json`), through
//! `cloud-harness skills check`, the reference validator (`agentskills validate`), a live
//! tier of a workspace (`skills_list`, `skills_read`) and a toolkit whose policy refuses them.

use crate::support;

use cloud_harness_control::toolkit::{self, ToolkitSpec};
use cloud_harness_executor::{Choice, Kind, Settings};
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::{OpenRequest, Workspaces};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::{Certs, GitServer, Node, Repo};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/spec/corpus")
}

/// Each corpus folder and the rules it breaks (`None`: it is no skill at all, skipped).
fn expected() -> BTreeMap<String, Option<BTreeSet<String>>> {
    let text = std::fs::read_to_string(corpus_dir().join("../expected.json")).unwrap();
    let doc: BTreeMap<String, Value> = serde_json::from_str(&text).unwrap();
    doc.into_iter()
        .map(|(folder, rules)| {
            let rules = rules.as_array().map(|rules| {
                rules
                    .iter()
                    .map(|r| r.as_str().unwrap().to_owned())
                    .collect()
            });
            (folder, rules)
        })
        .collect()
}

fn check(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["skills", "check"])
        .args(args)
        .output()
        .unwrap()
}

fn rules_of(problems: &Value) -> BTreeSet<String> {
    problems
        .as_array()
        .unwrap()
        .iter()
        .map(|p| match p {
            Value::String(rule) => rule.clone(),
            p => p["rule"].as_str().unwrap().to_owned(),
        })
        .collect()
}

#[test]
fn skills_check_finds_each_rule_of_the_corpus_and_exits_as_the_reference_validator_does() {
    let corpus = corpus_dir();
    let out = check(&[corpus.to_str().unwrap(), "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts: BTreeMap<String, &Value> = doc["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["path"].as_str().unwrap().to_owned(), v))
        .collect();
    let expected = expected();
    assert_eq!(
        verdicts.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (folder, rules) in &expected {
        let v = verdicts[folder];
        match rules {
            Some(rules) => {
                assert_eq!(&rules_of(&v["problems"]), rules, "{folder}: {v}");
                assert_eq!(v["valid"], rules.is_empty(), "{folder}: {v}");
            }
            None => {
                assert_eq!(v["valid"], false, "{folder}: {v}");
                assert!(v["error"].is_string(), "{folder}: {v}");
            }
        }
    }
    let every_rule: BTreeSet<String> = expected.values().flatten().flatten().cloned().collect();
    for rule in cloud_harness_skills::spec::Rule::ALL {
        assert!(
            every_rule.contains(rule.as_str()),
            "the corpus has no folder for {rule}"
        );
    }

    // One valid skill: exit 0, said as valid. Text names each problem with its rule.
    let one = check(&[corpus.join("valid-skill").to_str().unwrap()]);
    assert_eq!(one.status.code(), Some(0), "{one:?}");
    assert!(String::from_utf8_lossy(&one.stdout).contains("1 skills: 1 valid"));
    let bad = check(&[corpus.join("name-folder").to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    let said = String::from_utf8_lossy(&bad.stdout);
    assert!(
        said.contains("name-folder: `name` \"another-name\" differs from its folder"),
        "{said}"
    );
    // Two folders with the same bytes are two verdicts: the name must match each folder.
    let twins = tempfile::tempdir().unwrap();
    for folder in ["same", "other"] {
        let dir = twins.path().join(folder);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            "---\nname: same\ndescription: Twins.\n---\n",
        )
        .unwrap();
    }
    let out = check(&[twins.path().to_str().unwrap(), "--format", "json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let by_path: BTreeMap<&str, BTreeSet<String>> = doc["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["path"].as_str().unwrap(), rules_of(&v["problems"])))
        .collect();
    assert!(by_path["same"].is_empty(), "{doc}");
    assert_eq!(
        by_path["other"],
        BTreeSet::from(["name-folder".to_owned()]),
        "{doc}"
    );
    // One skill named by `..`: its real folder's name is the one checked.
    std::fs::create_dir_all(twins.path().join("other/sub")).unwrap();
    let dotted = check(&[twins.path().join("other/sub/..").to_str().unwrap()]);
    assert_eq!(dotted.status.code(), Some(1), "{dotted:?}");
    assert!(String::from_utf8_lossy(&dotted.stdout).contains("name-folder"));
    // Not a folder: 2, as the reference validator's bad path.
    let missing = check(&[corpus.join("no-such-skill").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
}

/// The harness's verdict agrees with the reference validator's on every folder of the corpus
/// and on the built-in skills (`tests/spec/compare`).
#[test]
fn verdicts_agree_with_the_reference_validator() {
    let have = Command::new("agentskills").arg("--help").output().is_ok();
    if !have {
        assert!(
            std::env::var_os("CI").is_none(),
            "agentskills (PyPI skills-ref) is missing; .ci/setup installs it"
        );
        eprintln!("skipped: agentskills (PyPI skills-ref) is not installed");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("tests/spec/compare"))
        .arg(BIN)
        .arg(corpus_dir())
        .arg(root.join("presets/builtin"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{said}");
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("22 skills, 22 verdicts agree"), "{said}");
    assert!(said.contains("3 skills, 3 verdicts agree"), "{said}");
}

/// A server over a local git host with the corpus as one repository.
struct World {
    _tmp: tempfile::TempDir,
    server: GitServer,
    workspaces: Workspaces,
    commit: String,
    _certs: Certs,
}

fn corpus_node(path: &Path) -> Node {
    if path.is_dir() {
        let mut entries: Vec<(Vec<u8>, Node)> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().into_encoded_bytes(), corpus_node(&e.path()))
            })
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Node::Dir(entries)
    } else {
        Node::File(std::fs::read(path).unwrap())
    }
}

fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let server = GitServer::start(&repos, &certs);
    let commit = Repo::create(&repos, "team/corpus.git", false).commit(Node::Dir(vec![(
        b"skills".to_vec(),
        corpus_node(&corpus_dir()),
    )]));
    // A project whose own skills (a live tier) are the corpus.
    Repo::create(&repos, "team/project.git", false).commit(Node::Dir(vec![(
        b".agents".to_vec(),
        Node::Dir(vec![(b"skills".to_vec(), corpus_node(&corpus_dir()))]),
    )]));
    let store = Store::open(tmp.path().join("store")).unwrap();
    let provisioner = server.provisioner(&certs, store, "", "127.0.0.0/8", "");
    let mut settings = Settings::with_kind(Kind::Host);
    settings.choice = Choice::Off;
    let workspaces =
        Workspaces::with_executors(tmp.path().join("home"), provisioner, false, settings).unwrap();
    World {
        _tmp: tmp,
        server,
        workspaces,
        commit,
        _certs: certs,
    }
}

impl World {
    fn toolkit(&self, validation: Option<&str>) -> ToolkitSpec {
        let mut spec = json!({
            "kind": "git", "instanceId": "corpus",
            "url": self.server.url("team/corpus.git"), "ref": self.commit,
        });
        if let Some(v) = validation {
            spec["skills"] = json!({ "validation": v });
        }
        toolkit::spec_from_value(spec).unwrap()
    }

    fn open(&self, key: &str, project: bool, toolkits: Vec<ToolkitSpec>) -> Value {
        self.workspaces
            .open(OpenRequest {
                repository_url: project.then(|| self.server.url("team/project.git")),
                idempotency_key: key.into(),
                toolkits,
                allow_toolkit_workspace_changes: false,
                idle_pause: true,
            })
            .unwrap()
    }
}

/// Served skills by name with their compact problems, from a result or listing.
fn served(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
    doc["skills"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["tier"] != "builtin")
        .map(|s| {
            let problems = s.get("problems").cloned().unwrap_or(json!([]));
            (s["name"].as_str().unwrap().to_owned(), rules_of(&problems))
        })
        .collect()
}

/// What the corpus should serve: every skill with its rules, by the name it is served as (its
/// folder's), the folders that are no skill left out.
fn expected_served() -> BTreeMap<String, BTreeSet<String>> {
    expected()
        .into_iter()
        .filter_map(|(folder, rules)| Some((folder, rules?)))
        .collect()
}

#[test]
fn a_live_tier_lists_each_skills_problems_and_reads_them_whole() {
    let w = world();
    let result = w.open("live", true, vec![]);
    let ws_id = result["workspace"].as_str().unwrap().to_owned();
    let ws = w.workspaces.get(&ws_id).unwrap();
    let listing = ws.list(None, false);
    assert_eq!(served(&listing), expected_served(), "{listing}");
    // The open's own answer says the same.
    assert_eq!(served(&result), expected_served(), "{result}");
    // skills_read of SKILL.md: every problem with its message; of another file, none.
    let page =
        serde_json::to_value(ws.read("name-folder", "SKILL.md", 0, 1 << 16).unwrap()).unwrap();
    assert_eq!(page["problems"][0]["rule"], "name-folder", "{page}");
    assert!(
        page["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("another-name"),
        "{page}"
    );
    let other = serde_json::to_value(
        ws.read("valid-skill", "references/guide.md", 0, 1 << 16)
            .unwrap(),
    )
    .unwrap();
    assert!(other.get("problems").is_none(), "{other}");
    drop(ws);
    w.workspaces.close(&ws_id).unwrap();
}

#[test]
fn a_toolkit_that_refuses_serves_only_the_skills_that_follow_the_specification() {
    let w = world();
    // warn (the default): everything served, problems said.
    let warned = w.open("warn", false, vec![w.toolkit(None)]);
    assert_eq!(served(&warned), expected_served(), "{warned}");

    // refuse: only the valid ones served; the open names each refused skill and its rules.
    let refused = w.open("refuse", false, vec![w.toolkit(Some("refuse"))]);
    let valid: BTreeMap<String, BTreeSet<String>> = expected_served()
        .into_iter()
        .filter(|(_, rules)| rules.is_empty())
        .collect();
    assert_eq!(served(&refused), valid, "{refused}");
    assert_refused(&w, &refused);
}

/// The open `result` served the corpus's valid skills alone and names every other one as
/// refused (SPEC_VIOLATION) with the rules it breaks.
fn assert_refused(w: &World, result: &Value) {
    let valid: BTreeMap<String, BTreeSet<String>> = expected_served()
        .into_iter()
        .filter(|(_, rules)| rules.is_empty())
        .collect();
    assert_eq!(served(result), valid, "{result}");
    let ws_id = result["workspace"].as_str().unwrap();
    let listing = w.workspaces.get(ws_id).unwrap().list(None, false);
    let skipped: BTreeMap<String, &Value> = listing["skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no skipped in {listing}"))
        .iter()
        .filter(|s| s["code"] == "SPEC_VIOLATION")
        .map(|s| (s["path"].as_str().unwrap().to_owned(), s))
        .collect();
    for (name, rules) in expected_served().iter().filter(|(_, r)| !r.is_empty()) {
        let s = skipped
            .iter()
            .find(|(path, _)| path.rsplit('/').next() == Some(name.as_str()))
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("{name} is not refused: {listing}"));
        for rule in rules {
            assert!(s["reason"].as_str().unwrap().contains(rule.as_str()), "{s}");
        }
        assert_eq!(&rules_of(&s["details"]["problems"]), rules, "{s}");
    }
}

#[test]
fn a_set_or_a_registry_entry_that_refuses_applies_to_its_toolkits() {
    use cloud_harness_curation::{registry, sets};
    use cloud_harness_skills::spec::Validation;
    let w = world();
    let (db, hosts) = (w.workspaces.db(), w.workspaces.hosts());
    // A set that refuses, over a member that would warn.
    let member = serde_json::to_value(w.toolkit(None)).unwrap();
    sets::create(db, hosts, "strict", "", &[member], Validation::Refuse, "op").unwrap();
    let set = toolkit::spec_from_value(json!({"kind": "set", "id": "strict"})).unwrap();
    assert_refused(&w, &w.open("set", false, vec![set]));

    // A registry entry that refuses; set back to warn, audited, the next open serves all.
    let new = registry::NewEntry {
        id: "team/corpus".into(),
        name: "Corpus".into(),
        description: "Broken skills.".into(),
        url: w.server.url("team/corpus.git"),
        layout: Default::default(),
        default_scope: Default::default(),
        session_start_skill: None,
        commit: w.commit.clone(),
        validation: Validation::Refuse,
        allow_unreachable: false,
    };
    registry::add(db, w.workspaces.provisioner(), new, "op").unwrap();
    let preset =
        || toolkit::spec_from_value(json!({"kind": "preset", "id": "team/corpus"})).unwrap();
    assert_refused(&w, &w.open("preset-refuse", false, vec![preset()]));
    let entry = registry::set_validation(db, "team/corpus", Validation::Warn, "op").unwrap();
    assert_eq!(entry.validation, Validation::Warn);
    let warned = w.open("preset-warn", false, vec![preset()]);
    assert_eq!(served(&warned), expected_served(), "{warned}");
    let filter = cloud_harness_control::audit::Filter {
        action: Some("registry.validation".into()),
        ..Default::default()
    };
    let (audited, _) = cloud_harness_control::audit::list(db, &filter, None, 10).unwrap();
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0].actor, "op");
}

/// Through a real `serve --http`: an import of the corpus says which skills break the
/// specification, the library's API finds them, the metrics count them, and the registry's
/// policy is set over the API (audited) and refused when it is not `warn` or `refuse`.
#[test]
fn an_import_the_library_the_metrics_and_the_registry_api_say_it() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let repos = tmp.path().join("repos");
    let commit = Repo::create(&repos, "team/corpus.git", false).commit(Node::Dir(vec![(
        b"skills".to_vec(),
        corpus_node(&corpus_dir()),
    )]));
    let git = GitServer::start(&repos, &certs);
    let (ca, host) = (certs.ca.display().to_string(), git.host());
    let w = support::api::world_with(
        tmp,
        &[
            ("CLOUD_HARNESS_EXECUTOR", "none"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", host.as_str()),
            ("CLOUD_HARNESS_EXTRA_CA", ca.as_str()),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8"),
        ],
    );
    let spec = json!({"kind": "git", "instanceId": "corpus", "url": git.url("team/corpus.git"), "ref": commit});
    let queued = w.op("POST", "/api/v1/imports", Some(json!({ "toolkit": spec })));
    let id = queued["id"].as_str().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let job = loop {
        let job = w.op("GET", &format!("/api/v1/imports/{id}"), None);
        if job["state"] != "queued" && job["state"] != "running" {
            break job;
        }
        assert!(std::time::Instant::now() < deadline, "{job}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(job["state"], "done", "{job}");
    let with_problems: BTreeMap<String, BTreeSet<String>> = expected_served()
        .into_iter()
        .filter(|(_, rules)| !rules.is_empty())
        .collect();
    let said: BTreeMap<String, BTreeSet<String>> = job["result"]["problems"]
        .as_object()
        .unwrap_or_else(|| panic!("no problems in {job}"))
        .iter()
        .map(|(name, rules)| (name.clone(), rules_of(rules)))
        .collect();
    assert_eq!(said, with_problems, "{job}");

    let found = w.op(
        "GET",
        "/api/v1/skills?problems=true&toolkit=corpus&limit=100",
        None,
    );
    let listed: BTreeMap<String, BTreeSet<String>> = found["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                rules_of(&s["problems"]),
            )
        })
        .collect();
    assert_eq!(listed, with_problems, "{found}");

    let metrics = w.metrics();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("cloud_harness_skill_problems_total{rule=\"name-folder\"}"))
        .unwrap_or_else(|| panic!("no name-folder count in {metrics}"));
    let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1, "{line}");

    let path = "/api/v1/registry/obra/superpowers/validation";
    let entry = w.op("PUT", path, Some(json!({"validation": "refuse"})));
    assert_eq!(entry["validation"], "refuse", "{entry}");
    let shown = w.op("GET", "/api/v1/registry/obra/superpowers", None);
    assert_eq!(shown["entry"]["validation"], "refuse", "{shown}");
    let (status, bad) = w.call(
        "PUT",
        path,
        Some(&w.operator),
        Some(r#"{"validation":"sometimes"}"#),
    );
    assert_eq!(status, 400, "{bad}");
    assert!(w
        .audit_actions()
        .contains(&"registry.validation".to_owned()));
}

//! Skill sets on the control-plane database alone (SQLite in a temporary home): made, edited
//! by revision, a stale edit refused, bad input refused by field with nothing stored, and a set
//! expanded into its members. The same through the API, on SQLite and on PostgreSQL, is
//! `tests/sets.rs` and `tests/sets_postgres.rs` at the root.

use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_control::state::Db;
use cloud_harness_control::toolkit::{self, ToolkitSpec};
use cloud_harness_curation::sets;
use cloud_harness_error::Code;
use cloud_harness_skills::spec::Validation;
use serde_json::{json, Value};

const HOST: &str = "git.example.test";

fn member(name: &str) -> Value {
    json!({
        "kind": "git",
        "instanceId": name,
        "url": format!("https://{HOST}/{name}.git"),
        "ref": "0123456789abcdef0123456789abcdef01234567",
    })
}

fn world() -> (tempfile::TempDir, Db, HostPolicy) {
    let home = tempfile::tempdir().unwrap();
    let db = Db::open_sqlite(home.path()).unwrap();
    (home, db, HostPolicy::new(HOST, "").unwrap())
}

#[test]
fn a_set_is_made_and_edited_by_revision_and_a_stale_edit_is_refused() {
    let (_home, db, hosts) = world();
    let made = sets::create(
        &db,
        &hosts,
        "backend",
        "What the backend team uses.",
        &[member("kit-a"), member("kit-b")],
        Validation::Warn,
        "alice",
    )
    .unwrap();
    assert_eq!((made.revision, made.members.len()), (1, 2));
    assert_eq!(made.validation, Validation::Warn);
    let again = sets::create(
        &db,
        &hosts,
        "backend",
        "",
        &[member("kit-a")],
        Default::default(),
        "bob",
    )
    .unwrap_err();
    assert_eq!(again.code, Code::Conflict, "{again}");

    let edited = sets::edit(
        &db,
        &hosts,
        "backend",
        1,
        None,
        Some(&[member("kit-a")]),
        Some(Validation::Refuse),
        "bob",
    )
    .unwrap();
    assert_eq!((edited.revision, edited.members.len()), (2, 1));
    // What an edit does not give stays: the policy, read back from the database.
    assert_eq!(
        sets::get(&db, "backend", None).unwrap().validation,
        Validation::Refuse
    );
    assert_eq!(
        sets::get(&db, "backend", Some(1)).unwrap().validation,
        Validation::Warn
    );
    assert_eq!(edited.description, "What the backend team uses.");
    let stale =
        sets::edit(&db, &hosts, "backend", 1, Some("late"), None, None, "carol").unwrap_err();
    assert_eq!(stale.code, Code::Conflict, "{stale}");

    // Every revision stays readable; the latest is the default.
    assert_eq!(sets::get(&db, "backend", Some(1)).unwrap().members.len(), 2);
    assert_eq!(sets::get(&db, "backend", None).unwrap().revision, 2);
    let history = sets::revisions(&db, "backend").unwrap();
    assert_eq!(history.len(), 2);
}

#[test]
fn bad_input_is_refused_by_field_and_stores_nothing() {
    let (_home, db, hosts) = world();
    let unpinned = {
        let mut m = member("kit-a");
        m.as_object_mut().unwrap().remove("ref");
        m
    };
    let elsewhere = {
        let mut m = member("kit-a");
        m["url"] = json!("https://elsewhere.example.test/x.git");
        m
    };
    let bad = Code::InvalidArgument;
    let cases: Vec<(&str, Vec<Value>, &str, Code)> = vec![
        ("Bad_Id", vec![member("kit-a")], "id", bad),
        ("x", vec![], "members", bad),
        ("x", vec![unpinned], "members[0].ref", bad),
        (
            "x",
            vec![member("kit-a"), json!({"kind": "set", "id": "y"})],
            "members[1].kind",
            bad,
        ),
        (
            "x",
            vec![member("kit-a"), member("kit-a")],
            "members[1].instanceId",
            bad,
        ),
        ("x", vec![elsewhere], "members[0].url", Code::Forbidden),
    ];
    for (id, members, field, code) in cases {
        let e =
            sets::create(&db, &hosts, id, "", &members, Default::default(), "alice").unwrap_err();
        assert_eq!(e.code, code, "{id} {members:?}: {e}");
        assert_eq!(e.details["field"], field, "{id} {members:?}: {e}");
    }
    assert!(
        sets::list(&db).unwrap().is_empty(),
        "a refused set left a row"
    );
}

#[test]
fn a_set_in_a_request_expands_into_its_members_in_place() {
    let (_home, db, hosts) = world();
    sets::create(
        &db,
        &hosts,
        "team",
        "",
        &[member("kit-a"), member("kit-b")],
        Validation::Refuse,
        "alice",
    )
    .unwrap();
    let request: Vec<ToolkitSpec> = [json!({"kind": "set", "id": "team"}), member("kit-c")]
        .into_iter()
        .map(|v| toolkit::spec_from_value(v).unwrap())
        .collect();
    let expanded = sets::expand(&db, &request, None).unwrap();
    let ids: Vec<String> = expanded
        .specs
        .iter()
        .map(|s| match s {
            ToolkitSpec::Git(g) => g.instance_id.clone(),
            other => panic!("not expanded: {other:?}"),
        })
        .collect();
    assert_eq!(ids, ["kit-a", "kit-b", "kit-c"]);
    assert_eq!(
        expanded.origins[0],
        Some(json!({"id": "team", "revision": 1}))
    );
    assert!(expanded.origins[2].is_none());
    // The set's policy goes with its members alone.
    assert_eq!(
        expanded.validation,
        [Validation::Refuse, Validation::Refuse, Validation::Warn]
    );
}

//! Idle workspaces pause (`CLOUD_HARNESS_IDLE_PAUSE`): unused, a workspace lets go of its
//! mounts and its bubblewrap sandbox; the next call that names it takes them back first, and
//! finds the same files and the same working tree.

use crate::faults::aftermath::fuse_mounts_under;
use crate::faults::site::processes_naming;
use crate::support;

use serde_json::{json, Value};
use std::time::Duration;
use support::api::world_of;
use support::http::server_mounting;

/// What the script prints: how the skill's own file reads through the executor's mount, and
/// how many runs the working tree has seen.
const NOTE: &str = "echo skill: $(grep -c 'Alpha notes' /opt/cloud-harness/skills/alpha/SKILL.md)\necho run >> /workspace/notes\necho runs: $(wc -l < /workspace/notes)\n";

#[test]
fn an_idle_workspace_pauses_and_resumes_with_the_same_files_and_runs() {
    if !support::executors::available(cloud_harness_executor::Kind::Bwrap) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = cloud_harness_store::cas::Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src/kit");
    support::executors::write(
        &src.join("alpha/SKILL.md"),
        "---\nname: alpha\ndescription: Alpha notes.\n---\nAlpha notes.\n",
    );
    support::executors::write(&src.join("alpha/scripts/note.sh"), NOTE);
    let kit = serde_json::to_value(support::warm_toolkit(&store, &src, "kit")).unwrap();
    let w = world_of(server_mounting(
        tmp,
        &[],
        &[
            ("CLOUD_HARNESS_EXECUTOR", "bwrap"),
            ("CLOUD_HARNESS_CONTAINERS", "off"),
            ("ALLOWED_GIT_HOSTS", support::WARM_HOST),
            ("CLOUD_HARNESS_IDLE_PAUSE", "1"),
        ],
    ));
    let session = w.session();
    let opened = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "idle", "toolkits": [kit]}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let ws = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = w.home().join("workspaces").join(&ws);
    // Beside it, one its opener asked never to pause.
    let kept = w.tool(
        &session,
        "workspace_open",
        json!({"idempotencyKey": "kept", "toolkits": [kit], "idlePause": false}),
    );
    assert_eq!(kept["isError"], false, "{kept}");
    let kept = kept["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let kept_dir = w.home().join("workspaces").join(&kept);
    let listed_as = |id: &str| -> Value {
        let all = w
            .call("GET", "/api/v1/workspaces", Some(w.operator.as_str()), None)
            .1;
        all["workspaces"]
            .as_array()
            .and_then(|l| l.iter().find(|x| x["workspace"] == id).cloned())
            .unwrap_or_else(|| panic!("{id} not listed: {all}"))
    };
    let run = || -> Value {
        w.tool(
            &session,
            "skills_run",
            json!({"workspace": ws, "skill": "alpha", "script": "scripts/note.sh"}),
        )
    };
    let refused = run();
    let digest = refused["structuredContent"]["details"]["digest"].clone();
    assert!(digest.is_string(), "{refused}");
    let (status, _) = w.call(
        "POST",
        "/api/v1/approvals",
        Some(w.operator.as_str()),
        Some(&json!({"digest": digest, "skill": "alpha", "reason": "read it"}).to_string()),
    );
    assert!((200..300).contains(&status), "{status}");
    let first = run();
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(first["structuredContent"]["stdout"], "skill: 2\nruns: 1\n");
    let skill_md = dir.join("mounts/skills/alpha/SKILL.md");
    let served = std::fs::read(&skill_md).unwrap();

    // Unused for a second: its mounts and its sandbox go, and it says it is paused.
    support::wait::until("the workspace pauses", Duration::from_secs(20), || {
        fuse_mounts_under(&dir).is_empty() && processes_naming(&dir).is_empty()
    });
    assert_eq!(listed_as(&ws)["paused"], true);
    // The other, as idle, is not.
    assert_eq!(fuse_mounts_under(&kept_dir).len(), 2);
    let other = listed_as(&kept);
    assert_eq!(
        (&other["paused"], &other["idlePause"]),
        (&json!(false), &json!(false)),
        "{other}"
    );
    let metrics = w.metrics();
    assert!(
        metrics.contains("cloud_harness_paused_workspaces 1"),
        "{metrics}"
    );

    // The next call resumes it first: the same skill through the same mount, the same
    // working tree.
    let again = run();
    assert_eq!(again["isError"], false, "{again}");
    assert_eq!(again["structuredContent"]["stdout"], "skill: 2\nruns: 2\n");
    assert_eq!(fuse_mounts_under(&dir).len(), 2);
    assert_eq!(std::fs::read(&skill_md).unwrap(), served);
    assert_eq!(listed_as(&ws)["paused"], false);

    // Paused again, it closes as any workspace does.
    support::wait::until(
        "the workspace pauses again",
        Duration::from_secs(20),
        || fuse_mounts_under(&dir).is_empty(),
    );
    let closed = w.tool(&session, "workspace_close", json!({ "workspace": ws }));
    assert_eq!(closed["isError"], false, "{closed}");
    assert!(!dir.exists());
}

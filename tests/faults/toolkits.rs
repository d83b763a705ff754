//! What the crash suite's steps work on: a local git server with a toolkit that has a new
//! commit every round (so every acquisition is cold), the plan of kills, and small calls.

use super::site::{session, tool, Kill, Random, Site};
use crate::support::http::Running;
use crate::support::{dir, file, skill, Certs, GitServer, Repo};
use cloud_harness_control::params;
use serde_json::{json, Value};
use std::time::Duration;

/// A local git server with one toolkit repository, a new commit of it per round.
pub(super) struct Toolkits {
    tmp: tempfile::TempDir,
    certs: Certs,
    server: GitServer,
    repo: Repo,
}

impl Toolkits {
    pub(super) fn new() -> Toolkits {
        let tmp = tempfile::tempdir().unwrap();
        let repos = tmp.path().join("repos");
        std::fs::create_dir_all(&repos).unwrap();
        let certs = Certs::new(&tmp.path().join("certs"));
        let server = GitServer::start(&repos, &certs);
        let repo = Repo::create(&repos, "kit.git", false);
        Toolkits {
            tmp,
            certs,
            server,
            repo,
        }
    }

    /// Where the server's repositories are (for more of them).
    pub(super) fn repos(&self) -> std::path::PathBuf {
        self.tmp.path().join("repos")
    }

    /// The URL of repository `name` on the server.
    pub(super) fn url(&self, name: &str) -> String {
        self.server.url(name)
    }

    /// The server's environment: the git server allowed and trusted, executors `executor`.
    pub(super) fn env(&self, executor: &str) -> Vec<(&'static str, String)> {
        vec![
            ("CLOUD_HARNESS_EXECUTOR", executor.to_owned()),
            ("CLOUD_HARNESS_CONTAINERS", "off".to_owned()),
            ("ALLOWED_GIT_HOSTS", self.server.host()),
            (
                "CLOUD_HARNESS_EXTRA_CA",
                self.certs.ca.display().to_string(),
            ),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8".to_owned()),
        ]
    }

    /// A new commit: eight skills of a few files each (`skill-0` with a script,
    /// `scripts/hello.sh`), new bytes every round (so each acquisition is cold); the toolkit
    /// spec that pins it.
    pub(super) fn commit(&self, round: usize) -> Value {
        let names: Vec<String> = (0..8).map(|i| format!("skill-{i}")).collect();
        let skills = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let mut folder = skill(name, &format!("Round {round}, skill {i}."));
                if let crate::support::Node::Dir(entries) = &mut folder {
                    let notes = format!("notes {round} {i}\n").repeat(200);
                    entries.push(("notes.md".into(), file(&notes)));
                    if i == 0 {
                        let script = b"#!/bin/sh\necho hello from the executor\n".to_vec();
                        let scripts =
                            vec![(b"hello.sh".to_vec(), crate::support::Node::Exec(script))];
                        entries.push(("scripts".into(), crate::support::Node::Dir(scripts)));
                    }
                }
                (name.as_str(), folder)
            })
            .collect();
        let commit = self.repo.commit(dir(vec![("skills", dir(skills))]));
        json!({"kind": "git", "instanceId": "team", "url": self.server.url("kit.git"), "ref": commit})
    }
}

/// Named points first (each must be reached), then `timed` random moments within `span`.
pub(super) fn plan(named: &[&str], timed: usize, span: Duration, random: &mut Random) -> Vec<Kill> {
    let mut kills: Vec<Kill> = named.iter().map(|p| Kill::At(p.to_string())).collect();
    for _ in 0..timed {
        let ms = random.below(span.as_millis() as u64);
        kills.push(Kill::After(Duration::from_millis(ms)));
    }
    kills
}

pub(super) fn workspace_of(result: &Value) -> String {
    assert_ne!(result["isError"], json!(true), "{result}");
    result["structuredContent"]["workspace"]
        .as_str()
        .unwrap_or_else(|| panic!("no workspace in {result}"))
        .to_owned()
}

pub(super) fn key_rows(site: &Site, key: &str) -> i64 {
    let db = cloud_harness_control::state::Db::open_sqlite(&site.home()).unwrap();
    db.with(|c| {
        c.query_row(
            "SELECT COUNT(*) FROM workspaces WHERE idempotency_key = $1",
            params![key],
            |r| r.get(0),
        )
    })
    .unwrap()
}

pub(super) fn close(running: &Running, workspace: &str) {
    let session = session(running).unwrap();
    let closed = tool(
        running,
        &session,
        "workspace_close",
        json!({"workspace": workspace}),
    )
    .unwrap();
    assert_ne!(closed["isError"], json!(true), "{closed}");
}

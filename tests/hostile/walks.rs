//! No walk or watch leaves its root. A project whose skills folder links to large and special
//! folders of the host (`/usr`, `/proc`, `/dev`, `/`) and nests 1,500 folders is opened; a
//! FIFO, a chain of 5,000 folders and more folders than the watch budget are written into it
//! as an executor could; it is watched within its budget and closed, the server serving
//! throughout. A restart on the same home with such a workspace, and with one whose restore
//! fails, starts, answers `/healthz`, serves the first again and reports the second with its
//! reason until it is closed. A project nesting more folders than any checkout can hold is
//! refused before anything is written. A flood of FIFOs in a skills folder counts against the
//! project's entry limit (refused typed, live and at restart) rather than being kept as one
//! warning each.

use crate::support::api::{mcp_session, tool, world_with, World};
use crate::support::http::server_in;
use crate::support::{Certs, GitServer, Repo};
use gix::objs::tree::{Entry, EntryKind};
use gix::objs::Tree;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The watches one workspace may hold, small enough for a test to spend.
const WATCHES: usize = 40;
/// Deeper than any walk's bound, within what a checkout can write (a path of 4,096 bytes).
const CHECKED_OUT: usize = 1_500;
/// Deeper than any checkout could hold.
const LEVELS: usize = 5_000;

/// A local git server and the projects it serves.
struct Git {
    _tmp: tempfile::TempDir,
    repos: PathBuf,
    certs: Certs,
    server: GitServer,
}

fn git() -> Git {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let server = GitServer::start(&repos, &certs);
    Git {
        _tmp: tmp,
        repos,
        certs,
        server,
    }
}

impl Git {
    fn env(&self, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("CLOUD_HARNESS_EXECUTOR", "none".to_owned()),
            ("CLOUD_HARNESS_CONTAINERS", "off".to_owned()),
            ("ALLOWED_GIT_HOSTS", self.server.host()),
            (
                "CLOUD_HARNESS_EXTRA_CA",
                self.certs.ca.display().to_string(),
            ),
            ("CLOUD_HARNESS_ALLOW_CIDRS", "127.0.0.0/8".to_owned()),
            ("CLOUD_HARNESS_PROJECT_MAX_WATCHES", WATCHES.to_string()),
        ];
        env.extend(extra.iter().cloned());
        env
    }

    /// A project whose `.agents/skills` holds the skill `ok`, links to `/usr`, `/proc`, `/dev`
    /// and `/`, and a chain of `levels` folders with a file at its bottom. Written object by
    /// object (a path 10,000 characters long is no path git's own commands take).
    fn hostile_project(&self, name: &str, levels: usize) -> String {
        let path = self.repos.join(format!("{name}.git"));
        Repo::create(&self.repos, &format!("{name}.git"), false);
        // git refuses trees deeper than 4,096 levels unless told otherwise (the project is
        // hostile, its server need not be git's own).
        git_in(&path, &["config", "core.maxTreeDepth", "100000"]);
        let repo = gix::open(&path).unwrap();
        let blob = |bytes: &[u8]| repo.write_blob(bytes).unwrap().detach();
        let tree = |mut entries: Vec<Entry>| {
            entries.sort();
            repo.write_object(&Tree { entries }).unwrap().detach()
        };
        let entry = |kind: EntryKind, name: &str, oid| Entry {
            mode: kind.into(),
            filename: name.into(),
            oid,
        };
        let mut chain = tree(vec![entry(
            EntryKind::Blob,
            "bottom.md",
            blob(b"the end\n"),
        )]);
        for _ in 0..levels {
            chain = tree(vec![entry(EntryKind::Tree, "d", chain)]);
        }
        let ok = tree(vec![entry(
            EntryKind::Blob,
            "SKILL.md",
            blob(b"---\nname: ok\ndescription: A plain skill.\n---\nHello.\n"),
        )]);
        let mut skills = vec![
            entry(EntryKind::Tree, "ok", ok),
            entry(EntryKind::Tree, "deep", chain),
        ];
        for (link, target) in [
            ("usr", "/usr"),
            ("proc", "/proc"),
            ("dev", "/dev"),
            ("root", "/"),
        ] {
            skills.push(entry(EntryKind::Link, link, blob(target.as_bytes())));
        }
        let skills = tree(skills);
        let agents = tree(vec![entry(EntryKind::Tree, "skills", skills)]);
        let root = tree(vec![
            entry(EntryKind::Tree, ".agents", agents),
            entry(EntryKind::Blob, "README.md", blob(b"# hostile\n")),
        ]);
        commit(&path, &root.to_string());
        self.server.url(&format!("{name}.git"))
    }

    /// A project with one plain skill.
    fn plain_project(&self, name: &str) -> String {
        use crate::support::{dir, file, skill};
        Repo::create(&self.repos, &format!("{name}.git"), false).commit(dir(vec![
            ("README.md", file("# plain\n")),
            (
                ".agents",
                dir(vec![(
                    "skills",
                    dir(vec![("plain", skill("plain", "Plain."))]),
                )]),
            ),
        ]));
        self.server.url(&format!("{name}.git"))
    }
}

fn git_in(git_dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn commit(git_dir: &Path, tree: &str) {
    let id = git_in(git_dir, &["commit-tree", tree, "-m", "hostile"]);
    git_in(git_dir, &["update-ref", "refs/heads/main", &id]);
}

/// The inotify watches the process `pid` holds now.
fn watches(pid: u32) -> usize {
    let mut n = 0;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        if let Ok(info) = std::fs::read_to_string(fd.path()) {
            n += info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
        }
    }
    n
}

fn fdinfo(pid: u32) -> String {
    let mut out = String::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        if let Ok(info) = std::fs::read_to_string(fd.path()) {
            let n = info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
            if n > 0 {
                out += &format!("{:?}: {n}\n", fd.file_name());
            }
        }
    }
    out
}

fn call(w: &World, session: &str, name: &str, args: Value) -> Value {
    tool(w.server.addr, &w.operator, session, name, args)
}

fn skill_names(listing: &Value) -> Vec<String> {
    listing["structuredContent"]["skills"]
        .as_array()
        .unwrap_or_else(|| panic!("no skills in {listing}"))
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect()
}

fn healthy(w: &World) {
    let (status, body) = w.call("GET", "/healthz", None, None);
    assert_eq!((status, body), (200, Value::String("ok\n".into())));
}

/// Stops the server (SIGTERM, as systemd does) and keeps its home and store.
fn stop(mut w: World) -> tempfile::TempDir {
    let tmp = std::mem::replace(&mut w.server.tmp, tempfile::tempdir().unwrap());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(w.server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = w.server.child.wait().unwrap();
    assert!(status.success(), "the server ended with {status}");
    tmp
}

/// The server again on the same home and store, its operator token the one it made first.
fn restart(tmp: tempfile::TempDir, env: &[(&'static str, String)], operator: String) -> World {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    World {
        server: server_in(tmp, &[], &env),
        operator,
        http: reqwest::blocking::Client::builder()
            .no_proxy()
            .build()
            .unwrap(),
    }
}

fn listed(w: &World) -> Vec<Value> {
    w.op("GET", "/api/v1/workspaces", None)["workspaces"]
        .as_array()
        .unwrap()
        .clone()
}

fn waited_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn links_fifos_and_deep_chains_stay_inside_their_project() {
    let git = git();
    let hostile = git.hostile_project("hostile", CHECKED_OUT);
    let too_deep = git.hostile_project("too-deep", LEVELS);
    let plain = git.plain_project("plain");
    let env = git.env(&[]);
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let w = world_with(tempfile::tempdir().unwrap(), &pairs);
    let pid = w.server.child.id();
    let home = w.home();
    let session = mcp_session(w.server.addr, &w.operator);

    let refused = call(
        &w,
        &session,
        "workspace_open",
        json!({"repositoryUrl": too_deep, "idempotencyKey": "too-deep"}),
    );
    let error = &refused["structuredContent"];
    assert_eq!(
        (&refused["isError"], &error["code"]),
        (&json!(true), &json!("TOO_LARGE")),
        "{refused}"
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("deeper than 2048 levels"),
        "{error}"
    );
    assert_eq!(
        std::fs::read_dir(home.join("workspaces")).unwrap().count(),
        0,
        "a refused open left a workspace behind"
    );

    let opened = call(
        &w,
        &session,
        "workspace_open",
        json!({"repositoryUrl": hostile, "idempotencyKey": "hostile"}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let result = &opened["structuredContent"];
    let id = result["workspace"].as_str().unwrap().to_owned();
    let served: Vec<&str> = result["skills"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["tier"] == "repository")
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(served, ["ok"], "{result}");
    let warnings = result["warnings"].to_string();
    assert!(
        warnings.contains("deeper than 32 folders"),
        "the chain's cut is said: {warnings}"
    );
    assert!(
        !warnings.contains(home.to_str().unwrap()),
        "a host path in {warnings}"
    );
    let held = watches(pid);
    assert!(
        (1..=WATCHES).contains(&held),
        "{held} watches, more than the {WATCHES} a workspace may hold"
    );

    // What an executor could write there: a FIFO, a chain of 5,000 folders, many folders, a
    // new skill.
    let skills = home
        .join("workspaces")
        .join(&id)
        .join("repo/.agents/skills");
    nix::unistd::mkfifo(&skills.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    cloud_harness_store::walk::make_chain(&skills, "chain", LEVELS).unwrap();
    for i in 0..WATCHES {
        std::fs::create_dir_all(skills.join(format!("many/f{i}"))).unwrap();
    }
    std::fs::create_dir_all(skills.join("late")).unwrap();
    std::fs::write(
        skills.join("late/SKILL.md"),
        "---\nname: late\ndescription: Written while open.\n---\n",
    )
    .unwrap();
    waited_for("the live tier serves `late`", || {
        let listing = call(&w, &session, "skills_list", json!({"workspace": id}));
        skill_names(&listing)
            .contains(&"late".to_owned())
            .then_some(())
    });
    let held = watches(pid);
    assert!(held <= WATCHES, "{held} watches: {}", fdinfo(pid));
    waited_for("the log names the watch budget", || {
        let log = w.server.log.lock().unwrap().clone();
        log.contains(&format!("more than {WATCHES} folders to watch"))
            .then_some(())
    });
    healthy(&w);

    // A second workspace, which the restart will not be able to serve.
    let other = call(
        &w,
        &session,
        "workspace_open",
        json!({"repositoryUrl": plain, "idempotencyKey": "plain"}),
    );
    assert_eq!(other["isError"], false, "{other}");
    let broken = other["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let operator = w.operator.clone();
    let tmp = stop(w);

    // Its skills folder now leads out of the project.
    let repo = home.join("workspaces").join(&broken).join("repo");
    std::fs::remove_dir_all(repo.join(".agents/skills")).unwrap();
    std::os::unix::fs::symlink("/usr", repo.join(".agents/skills")).unwrap();

    let w = restart(tmp, &env, operator);
    healthy(&w);
    let pid = w.server.child.id();
    let all = listed(&w);
    let state = |id: &str| {
        all.iter()
            .find(|v| v["workspace"] == id)
            .unwrap_or_else(|| panic!("{id} is not listed: {all:?}"))
            .clone()
    };
    assert_eq!(state(&id)["state"], "open", "{all:?}");
    let failed = state(&broken);
    assert_eq!(failed["state"], "failed", "{failed}");
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.contains("FORBIDDEN") && reason.contains("leads outside the project"),
        "{reason}"
    );
    assert!(!reason.contains(home.to_str().unwrap()), "{reason}");
    assert!(watches(pid) <= WATCHES, "{} watches", watches(pid));

    let session = mcp_session(w.server.addr, &w.operator);
    let listing = call(&w, &session, "skills_list", json!({"workspace": id}));
    assert!(
        skill_names(&listing).contains(&"late".to_owned()),
        "{listing}"
    );
    let refused = call(&w, &session, "skills_list", json!({"workspace": broken}));
    assert_eq!(refused["isError"], true, "{refused}");
    let error = &refused["structuredContent"];
    assert_eq!(error["code"], "CONFLICT", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("could not be restored"),
        "{error}"
    );
    assert_eq!(error["details"]["state"], "failed");

    for ws in [&broken, &id] {
        let closed = call(&w, &session, "workspace_close", json!({"workspace": ws}));
        assert_eq!(closed["isError"], false, "{closed}");
        assert!(!home.join("workspaces").join(ws).exists(), "{ws} left");
    }
    assert_eq!(listed(&w), Vec::<Value>::new());
    // The link's target is the host's own, untouched.
    assert!(Path::new("/usr/bin").is_dir());
    healthy(&w);
    assert_eq!(watches(pid), 0);
}

/// A restore that takes longer than `CLOUD_HARNESS_RESTORE_TIMEOUT` does not hold the start:
/// the server answers first, says the workspace is still being restored, and serves it once
/// its restore ends.
#[test]
fn a_restore_past_its_bound_does_not_hold_the_start() {
    let git = git();
    let plain = git.plain_project("plain");
    let env = git.env(&[]);
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let w = world_with(tempfile::tempdir().unwrap(), &pairs);
    let session = mcp_session(w.server.addr, &w.operator);
    let opened = call(
        &w,
        &session,
        "workspace_open",
        json!({"repositoryUrl": plain, "idempotencyKey": "plain"}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let id = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let operator = w.operator.clone();
    let tmp = stop(w);

    let env = git.env(&[("CLOUD_HARNESS_RESTORE_TIMEOUT", "0".into())]);
    let w = restart(tmp, &env, operator);
    healthy(&w);
    let first = listed(&w);
    let state = first[0]["state"].as_str().unwrap().to_owned();
    assert!(["restoring", "open"].contains(&state.as_str()), "{first:?}");
    waited_for("the late restore is served", || {
        (listed(&w)[0]["state"] == "open").then_some(())
    });
    let session = mcp_session(w.server.addr, &w.operator);
    let listing = call(&w, &session, "skills_list", json!({"workspace": id}));
    assert!(
        skill_names(&listing).contains(&"plain".to_owned()),
        "{listing}"
    );
    let closed = call(&w, &session, "workspace_close", json!({"workspace": id}));
    assert_eq!(closed["isError"], false, "{closed}");
}

/// A script making FIFOs in a loop in a project's skills folder (as an executor could): each
/// counts against the project's limit of 20,000 entries, what no skill can hold included, so
/// the live tier refuses the folder with a typed error (the last good generation stays
/// served) instead of keeping a warning for each, and a restart reports the workspace failed
/// with that reason instead of holding them all. The server serves throughout, and the
/// workspace closes.
#[test]
fn a_flood_of_fifos_counts_against_the_project_limit() {
    let git = git();
    let plain = git.plain_project("plain");
    let env = git.env(&[]);
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let w = world_with(tempfile::tempdir().unwrap(), &pairs);
    let home = w.home();
    let session = mcp_session(w.server.addr, &w.operator);
    let opened = call(
        &w,
        &session,
        "workspace_open",
        json!({"repositoryUrl": plain, "idempotencyKey": "fifos"}),
    );
    assert_eq!(opened["isError"], false, "{opened}");
    let id = opened["structuredContent"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();

    // Made beside the skills folder, then moved in whole: the live tier sees them at once.
    let repo = home.join("workspaces").join(&id).join("repo");
    let x = repo.join("made");
    std::fs::create_dir_all(&x).unwrap();
    std::fs::write(
        x.join("SKILL.md"),
        "---\nname: x\ndescription: Among FIFOs.\n---\n",
    )
    .unwrap();
    for i in 0..20_010 {
        nix::unistd::mkfifo(&x.join(format!("p{i}")), nix::sys::stat::Mode::S_IRWXU).unwrap();
    }
    std::fs::rename(&x, repo.join(".agents/skills/x")).unwrap();
    let limit = "more than the limit of 20000 files and folders";
    waited_for("the live tier refuses the folder", || {
        let log = w.server.log.lock().unwrap().clone();
        log.contains(limit).then_some(())
    });
    let log = w.server.log.lock().unwrap().clone();
    assert!(!log.contains("a FIFO is not"), "FIFOs were said one by one");
    let listing = call(&w, &session, "skills_list", json!({"workspace": id}));
    let names = skill_names(&listing);
    assert!(
        names.contains(&"plain".to_owned()) && !names.contains(&"x".to_owned()),
        "{names:?}"
    );
    healthy(&w);

    let operator = w.operator.clone();
    let tmp = stop(w);
    let w = restart(tmp, &env, operator);
    healthy(&w);
    let all = listed(&w);
    let failed = all
        .iter()
        .find(|v| v["workspace"] == id.as_str())
        .unwrap_or_else(|| panic!("{id} is not listed: {all:?}"));
    assert_eq!(failed["state"], "failed", "{failed}");
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("TOO_LARGE") && reason.contains(limit),
        "{reason}"
    );
    assert!(!reason.contains(home.to_str().unwrap()), "{reason}");
    let session = mcp_session(w.server.addr, &w.operator);
    let closed = call(&w, &session, "workspace_close", json!({"workspace": id}));
    assert_eq!(closed["isError"], false, "{closed}");
    assert!(!home.join("workspaces").join(&id).exists());
    healthy(&w);
}

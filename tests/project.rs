//! A project repository is hostile like any toolkit: its skill folders and `.cloud-harness`
//! must not lead the harness outside the working tree, neither when the workspace opens nor
//! when a live tier changes later.

use crate::support;

use cloud_harness_control::toolkit::{self, ToolkitSpec};
use cloud_harness_error::Code;
use cloud_harness_executor::{Choice, Kind, Settings};
use cloud_harness_provision::fetch::CloneLimits;
use cloud_harness_store::cas::Store;
use cloud_harness_workspace::{OpenRequest, Workspaces};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{dir, skill, Certs, GitServer, Node, Repo};

struct World {
    tmp: tempfile::TempDir,
    repos: PathBuf,
    certs: Certs,
    server: GitServer,
    workspaces: Workspaces,
    /// A folder outside every working tree, holding a skill of its own.
    outside: PathBuf,
}

fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let repos = tmp.path().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let certs = Certs::new(&tmp.path().join("certs"));
    let server = GitServer::start(&repos, &certs);
    let workspaces = serve(&tmp, &server, &certs, CloneLimits::default());
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(outside.join("leak")).unwrap();
    std::fs::write(
        outside.join("leak/SKILL.md"),
        "---\nname: leak\ndescription: The host's own.\n---\nsecret\n",
    )
    .unwrap();
    World {
        tmp,
        repos,
        certs,
        server,
        workspaces,
        outside,
    }
}

/// The workspaces of a server on this world's home, as a (re)started `serve` has them.
fn serve(
    tmp: &tempfile::TempDir,
    server: &GitServer,
    certs: &Certs,
    project_limits: CloneLimits,
) -> Workspaces {
    let store = Store::open(tmp.path().join("store")).unwrap();
    let mut provisioner = server.provisioner(certs, store, "", "127.0.0.0/8", "");
    provisioner.project_limits = project_limits;
    let mut settings = Settings::with_kind(Kind::Host);
    settings.choice = Choice::Off;
    Workspaces::with_executors(tmp.path().join("home"), provisioner, false, settings).unwrap()
}

impl World {
    fn project(&self, name: &str, root: Node) -> String {
        Repo::create(&self.repos, &format!("{name}.git"), false).commit(root);
        self.server.url(&format!("{name}.git"))
    }

    fn open(
        &self,
        key: &str,
        url: &str,
        toolkits: Vec<ToolkitSpec>,
    ) -> cloud_harness_error::Result<Value> {
        self.workspaces.open(OpenRequest {
            repository_url: Some(url.to_owned()),
            idempotency_key: key.into(),
            toolkits: toolkits.clone(),
            allow_toolkit_workspace_changes: !toolkits.is_empty(),
            idle_pause: true,
        })
    }

    fn workspaces_left(&self) -> usize {
        std::fs::read_dir(self.tmp.path().join("home/workspaces"))
            .unwrap()
            .count()
    }

    fn names(result: &Value) -> Vec<String> {
        result["skills"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn link(target: &str) -> Node {
    Node::Link(target.to_owned())
}

#[test]
fn skill_folders_that_lead_outside_the_project_are_refused() {
    let w = world();
    let outside = w.outside.display().to_string();
    let decoy_dir = w.tmp.path().join("decoy");
    std::fs::create_dir_all(decoy_dir.join("skills")).unwrap();
    std::os::unix::fs::symlink(w.outside.join("leak"), decoy_dir.join("skills/leak")).unwrap();
    let decoy = decoy_dir.display().to_string();
    for (name, root, what) in [
        (
            "to-root",
            dir(vec![(".agents", dir(vec![("skills", link("/"))]))]),
            ".agents/skills",
        ),
        (
            "to-host",
            dir(vec![(".agents", dir(vec![("skills", link(&outside))]))]),
            ".agents/skills",
        ),
        (
            "upwards",
            dir(vec![(
                ".claude",
                dir(vec![("skills", link("../../../../../../.."))]),
            )]),
            ".claude/skills",
        ),
        // A link one level up: the project's `.claude` is a host folder holding `skills/`.
        (
            "parent-link",
            dir(vec![(".claude", link(&decoy))]),
            ".claude/skills",
        ),
    ] {
        let url = w.project(name, root);
        let err = w.open(name, &url, vec![]).unwrap_err();
        assert_eq!(err.code, Code::Forbidden, "{name}: {err}");
        assert!(err.message.contains(what), "{name}: {err}");
        assert!(
            !err.message.contains(&outside),
            "{name} names a host path: {err}"
        );
        assert_eq!(w.workspaces_left(), 0, "{name} left a workspace behind");
    }
    // A link that stays inside the project is an ordinary shape, and served.
    let url = w.project(
        "inside",
        dir(vec![
            ("skills", dir(vec![("ours", skill("ours", "Ours."))])),
            (".agents", dir(vec![("skills", link("../skills"))])),
        ]),
    );
    let result = w.open("inside", &url, vec![]).unwrap();
    assert!(
        World::names(&result).contains(&"ours".to_owned()),
        "{result}"
    );
}

#[test]
fn workspace_scope_toolkits_never_write_through_a_link() {
    let w = world();
    let kit = Repo::create(&w.repos, "kit.git", false);
    let commit = kit.commit(dir(vec![(
        "skills",
        dir(vec![("wsx", skill("wsx", "Ws."))]),
    )]));
    let spec = toolkit::parse_spec(&format!(
        r#"{{"kind":"git","instanceId":"kit","url":"{}","ref":"{commit}","scope":"workspace"}}"#,
        w.server.url("kit.git")
    ))
    .unwrap();
    let target = w.tmp.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let t = target.display().to_string();
    for (name, root) in [
        ("dot-link", dir(vec![(".cloud-harness", link(&t))])),
        (
            "skills-link",
            dir(vec![(".cloud-harness", dir(vec![("skills", link(&t))]))]),
        ),
        (
            "skill-link",
            dir(vec![(
                ".cloud-harness",
                dir(vec![("skills", dir(vec![("wsx", link(&t))]))]),
            )]),
        ),
    ] {
        let url = w.project(name, root);
        let err = w.open(name, &url, vec![spec.clone()]).unwrap_err();
        assert_eq!(err.code, Code::Forbidden, "{name}: {err}");
        assert!(err.message.contains("is a link"), "{name}: {err}");
        assert_eq!(
            std::fs::read_dir(&target).unwrap().count(),
            0,
            "{name} wrote outside"
        );
        assert_eq!(w.workspaces_left(), 0, "{name} left a workspace behind");
    }
}

/// A skill folder the project already has where a workspace-scope toolkit writes one is read
/// with the project's ceilings (32 MiB a file), not those of an operator's own folder.
#[test]
fn a_workspace_scope_skill_already_in_the_project_is_read_within_the_project_ceilings() {
    let w = world();
    let kit = Repo::create(&w.repos, "kit.git", false);
    let commit = kit.commit(dir(vec![(
        "skills",
        dir(vec![("wsx", skill("wsx", "Ws."))]),
    )]));
    let spec = toolkit::parse_spec(&format!(
        r#"{{"kind":"git","instanceId":"kit","url":"{}","ref":"{commit}","scope":"workspace"}}"#,
        w.server.url("kit.git")
    ))
    .unwrap();
    // 40 MiB of zeros: a few kilobytes in git.
    let big = Node::File(vec![0u8; 40 << 20]);
    let url = w.project(
        "big",
        dir(vec![(
            ".cloud-harness",
            dir(vec![(
                "skills",
                dir(vec![("wsx", dir(vec![("big.bin", big)]))]),
            )]),
        )]),
    );
    let err = w.open("big", &url, vec![spec]).unwrap_err();
    assert_eq!(err.code, Code::TooLarge, "{err}");
    assert!(
        err.message
            .contains("larger than the limit of 33554432 bytes per file"),
        "{err}"
    );
    assert_eq!(w.workspaces_left(), 0, "a workspace was left behind");
}

#[test]
fn a_live_tier_turned_into_a_link_out_keeps_the_last_good_generation() {
    let w = world();
    let url = w.project("live", dir(vec![("README.md", support::file("# live\n"))]));
    let result = w.open("live", &url, vec![]).unwrap();
    let id = result["workspace"].as_str().unwrap();
    let repo = w.tmp.path().join("home/workspaces").join(id).join("repo");
    // `.agents` appears whole, its link already inside (as a checkout or `mv` would make it).
    std::fs::create_dir_all(repo.join("staged")).unwrap();
    std::os::unix::fs::symlink(&w.outside, repo.join("staged/skills")).unwrap();
    std::fs::rename(repo.join("staged"), repo.join(".agents")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let listing = w.workspaces.get(id).unwrap().list(None, false);
    let names: Vec<&str> = listing["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"leak"),
        "a host folder is served: {names:?}"
    );
    assert!(Path::new(&w.outside).join("leak/SKILL.md").exists());
    w.workspaces.close(id).unwrap();
}

/// Garbage collection while workspaces are open keeps everything they serve: the built-in
/// tier, the project's own skills (a snapshot of a live folder), a new generation of it.
#[test]
fn gc_while_a_workspace_is_open_keeps_what_it_serves() {
    let w = world();
    let url = w.project(
        "gc",
        dir(vec![(
            ".claude",
            dir(vec![("skills", dir(vec![("own", skill("own", "Own."))]))]),
        )]),
    );
    let result = w.open("gc", &url, vec![]).unwrap();
    let id = result["workspace"].as_str().unwrap().to_owned();
    let gc = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-harness"))
            .args(["cas", "gc", "--grace", "0"])
            .env("TOOLKIT_CACHE_ROOT", w.tmp.path().join("store"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    gc();
    let ws = w.workspaces.get(&id).unwrap();
    for skill in ["own", "cloud-harness-skills"] {
        let page = ws.read(skill, "SKILL.md", 0, 1 << 16).unwrap();
        assert!(
            page.content.contains("description"),
            "{skill}: {}",
            page.content
        );
    }
    // A live edit makes a new generation; it is kept too.
    let repo = w.tmp.path().join("home/workspaces").join(&id).join("repo");
    std::fs::write(
        repo.join(".claude/skills/own/SKILL.md"),
        "---\nname: own\ndescription: Own, edited.\n---\nEdited.\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ws
        .read("own", "SKILL.md", 0, 1 << 16)
        .unwrap()
        .content
        .contains("Edited.")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the edit never showed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    gc();
    assert!(ws
        .read("own", "SKILL.md", 0, 1 << 16)
        .unwrap()
        .content
        .contains("Edited."));
    drop(ws);
    w.workspaces.close(&id).unwrap();
    let store = Store::open(w.tmp.path().join("store")).unwrap();
    let left: Vec<String> = store
        .roots()
        .unwrap()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("workspaces/"))
        .collect();
    assert!(left.is_empty(), "roots of a closed workspace: {left:?}");
    let folder = w.tmp.path().join("store/roots/workspaces").join(&id);
    assert!(
        !folder.exists(),
        "a closed workspace's folder of roots stays"
    );
}

/// A workspace that cannot be served again after a restart keeps its key: opening with the
/// key is a CONFLICT saying so (never a second workspace), and closing it frees the key.
#[test]
fn a_key_whose_workspace_failed_to_restore_owns_no_second_workspace() {
    let mut w = world();
    let kit = Repo::create(&w.repos, "kit.git", false);
    let commit = kit.commit(dir(vec![("skills", dir(vec![("k", skill("k", "K."))]))]));
    let spec = toolkit::parse_spec(&format!(
        r#"{{"kind":"git","instanceId":"kit","url":"{}","ref":"{commit}"}}"#,
        w.server.url("kit.git")
    ))
    .unwrap();
    let url = w.project("restore", dir(vec![("README.md", support::file("# r\n"))]));
    let request = || OpenRequest {
        repository_url: Some(url.clone()),
        idempotency_key: "same-key".into(),
        toolkits: vec![spec.clone()],
        allow_toolkit_workspace_changes: false,
        idle_pause: true,
    };
    let first = w.workspaces.open(request()).unwrap();
    let id = first["workspace"].as_str().unwrap().to_owned();
    let bundle = first["toolkits"][0]["bundle"].as_str().unwrap().to_owned();
    w.workspaces.shutdown();
    // The bundle's tree is lost: the workspace cannot be served again.
    let store = Store::open(w.tmp.path().join("store")).unwrap();
    let digest = cloud_harness_store::cas::Digest::parse(&bundle).unwrap();
    std::fs::remove_file(store.object_path(cloud_harness_store::cas::ObjectKind::Tree, &digest))
        .unwrap();
    w.workspaces.shutdown(); // a restart: the home is served by one at a time
    w.workspaces = serve(&w.tmp, &w.server, &w.certs, CloneLimits::default());
    let err = w.workspaces.open(request()).unwrap_err();
    assert_eq!(err.code, Code::Conflict, "{err}");
    assert!(
        err.message.contains(&id) && err.message.contains("workspace_close"),
        "{err}"
    );
    assert_eq!(w.workspaces_left(), 1, "a second workspace was made");
    w.workspaces.close(&id).unwrap();
    assert_eq!(w.workspaces_left(), 0);
    let again = w.workspaces.open(request()).unwrap();
    assert_ne!(again["workspace"], first["workspace"]);
    w.workspaces
        .close(again["workspace"].as_str().unwrap())
        .unwrap();
}

/// A conflict that a live change makes (the project's `.agents/skills` and `.claude/skills`
/// both bring `dup`, differently) is reported by `skills_list`, never a silent disappearance.
#[test]
fn a_conflict_made_live_is_reported() {
    let w = world();
    let url = w.project(
        "dup",
        dir(vec![(
            ".claude",
            dir(vec![("skills", dir(vec![("dup", skill("dup", "One."))]))]),
        )]),
    );
    let result = w.open("dup", &url, vec![]).unwrap();
    assert!(World::names(&result).contains(&"dup".to_owned()));
    let id = result["workspace"].as_str().unwrap();
    let repo = w.tmp.path().join("home/workspaces").join(id).join("repo");
    std::fs::create_dir_all(repo.join("staged/skills/dup")).unwrap();
    std::fs::write(
        repo.join("staged/skills/dup/SKILL.md"),
        "---\nname: dup\ndescription: The other one.\n---\nTwo.\n",
    )
    .unwrap();
    std::fs::rename(repo.join("staged"), repo.join(".agents")).unwrap();
    let ws = w.workspaces.get(id).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listing = ws.list(None, false);
        let conflicts = listing["conflicts"].to_string();
        if conflicts.contains("dup") {
            assert!(
                !listing["skills"].to_string().contains("\"name\":\"dup\""),
                "{listing}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no conflict reported: {listing}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(ws);
    w.workspaces.close(id).unwrap();
}

/// A listing of one tier shows what `.tiers/<tier>/` serves: a name two copies of the tier
/// define differently is a conflict there, even when a higher tier's copy is served.
#[test]
fn a_tier_listing_and_the_tier_view_agree() {
    use cloud_harness_skills::generation::View;
    use cloud_harness_skills::resolver::Tier;
    let w = world();
    let clash = |body: &str| {
        dir(vec![(
            "skills",
            dir(vec![
                ("cloud-harness-skills", skill("cloud-harness-skills", body)),
                ("lint", skill("lint", "Lint.")),
            ]),
        )])
    };
    let url = w.project(
        "tiers",
        dir(vec![(".agents", clash("One.")), (".claude", clash("Two."))]),
    );
    let result = w.open("tiers", &url, vec![]).unwrap();
    let id = result["workspace"].as_str().unwrap();
    let ws = w.workspaces.get(id).unwrap();
    // The built-in copy is served; the project's two copies stay in conflict in their tier.
    let merged = ws.list(None, false);
    assert!(
        merged["conflicts"].as_array().unwrap().is_empty(),
        "{merged}"
    );
    let listing = ws.list(Some(Tier::Repository), true);
    let names = World::names(&listing);
    assert_eq!(names, ["lint"], "{listing}");
    assert_eq!(listing["skills"][0]["served"], true);
    let conflicts = listing["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{listing}");
    assert_eq!(conflicts[0]["skill"], "cloud-harness-skills");
    assert_eq!(conflicts[0]["candidates"].as_array().unwrap().len(), 2);
    // Every tier's listing names exactly what its view serves.
    let g = ws.generation();
    for tier in Tier::ALL {
        let served: Vec<&String> = g.view(View::Tier(tier)).keys().collect();
        let listed = World::names(&ws.list(Some(tier), false));
        assert_eq!(served, listed.iter().collect::<Vec<_>>(), "{tier}");
    }
    drop(ws);
    w.workspaces.close(id).unwrap();
}

/// A project clone has ceilings of its own: on the download, and on the checked-out tree
/// (measured before anything is written, so a small pack of zeros cannot fill the disk).
#[test]
fn a_project_clone_stays_under_its_ceilings() {
    let mut w = world();
    let limits = CloneLimits {
        max_bytes: 1 << 20,
        max_files: 50,
    };
    w.workspaces.shutdown(); // a restart: the home is served by one at a time
    w.workspaces = serve(&w.tmp, &w.server, &w.certs, limits);
    // Each object under the ceiling, all of them over it.
    let noisy = Node::Dir(
        (0..4)
            .map(|i| {
                (
                    format!("blob{i}").into_bytes(),
                    Node::File(support::noise(768 << 10, i + 1)),
                )
            })
            .collect(),
    );
    let zeros = Node::Dir(
        (0..8)
            .map(|i| {
                (
                    format!("zeros{i}").into_bytes(),
                    Node::File(vec![0; (512 << 10) + i]),
                )
            })
            .collect(),
    );
    let many = Node::Dir(
        (0..60)
            .map(|i| (format!("f{i}").into_bytes(), Node::File(vec![b'x'; i])))
            .collect(),
    );
    for (name, root, needle) in [
        ("noisy", noisy, "the download passed 1048576 bytes"),
        ("zeros", zeros, "more than 50 files or 1048576 bytes"),
        // One object larger than the whole checkout may be: a few KiB of pack, not unpacked.
        (
            "bomb",
            dir(vec![("blob", Node::File(vec![0; 8 << 20]))]),
            "larger than the limit of 1048576 bytes",
        ),
        ("many", dir(vec![("src", many)]), "more than 50 files"),
    ] {
        let url = w.project(name, root);
        let e = w.open(name, &url, vec![]).unwrap_err();
        assert_eq!(e.code, Code::TooLarge, "{name}: {e}");
        assert!(e.message.contains(needle), "{name}: {e}");
        assert_eq!(w.workspaces_left(), 0, "{name} left a workspace behind");
    }
    let url = w.project("small", dir(vec![("README", Node::File(b"hi".to_vec()))]));
    let result = w.open("small", &url, vec![]).unwrap();
    w.workspaces
        .close(result["workspace"].as_str().unwrap())
        .unwrap();
}

/// Pages of a text file end on character boundaries: each is valid UTF-8 text, `nextOffset`
/// says where the next begins, and the pages put together are the file, byte for byte.
#[test]
fn pages_of_a_multibyte_text_file_are_each_text_and_add_up_to_the_file() {
    let w = world();
    // Two-, three- and four-byte characters, so any page length splits one sometimes.
    let text: String = (0..3000)
        .map(|i| ["é", "ж", "€", "漢", "😀", "a"][i % 6])
        .collect();
    let url = w.project(
        "unicode",
        dir(vec![(
            ".agents",
            dir(vec![(
                "skills",
                dir(vec![(
                    "uni",
                    dir(vec![
                        ("SKILL.md", skill_md("uni")),
                        (
                            "refs",
                            dir(vec![("u.md", Node::File(text.clone().into_bytes()))]),
                        ),
                    ]),
                )]),
            )]),
        )]),
    );
    let result = w.open("unicode", &url, vec![]).unwrap();
    let id = result["workspace"].as_str().unwrap();
    let ws = w.workspaces.get(id).unwrap();
    for length in [1000, 1001, 1002, 1003, 4097] {
        let (mut whole, mut offset, mut pages) = (Vec::new(), 0, 0);
        loop {
            let page = ws.read("uni", "refs/u.md", offset, length).unwrap();
            assert_eq!(page.encoding, "utf-8", "length {length}, page at {offset}");
            assert_eq!(page.length, page.content.len() as u64);
            whole.extend_from_slice(page.content.as_bytes());
            pages += 1;
            match page.next_offset {
                Some(next) => {
                    assert_eq!(next, offset + page.length);
                    offset = next;
                }
                None => break,
            }
        }
        assert_eq!(whole, text.as_bytes(), "length {length}");
        assert!(pages > 1);
    }
    // A page asked for in the middle of a character is not text: base64.
    assert_eq!(
        ws.read("uni", "refs/u.md", 1, 100).unwrap().encoding,
        "base64"
    );
    drop(ws);
    w.workspaces.close(id).unwrap();
}

fn skill_md(name: &str) -> Node {
    Node::File(format!("---\nname: {name}\ndescription: d\n---\n").into_bytes())
}

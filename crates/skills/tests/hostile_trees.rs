//! Trees that change while they are read (a live project an executor writes): an import never
//! follows a link swapped in after a check, neither inside the tree nor at its top.

use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::resolver::Tier;
use cloud_harness_skills::stack::dir_source;
use cloud_harness_store::cas::{Digest, Limits, ObjectKind, Store};
use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"---\nname: secret\ndescription: the host's own\n---\nsecret\n";

struct Race {
    tmp: tempfile::TempDir,
    store: Store,
    project: PathBuf,
}

impl Race {
    /// A project with `.agents/skills/sub/` (one skill), and a folder outside it holding the
    /// host's secret.
    fn new() -> Race {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path().join("store")).unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("secret")).unwrap();
        fs::write(outside.join("secret/SKILL.md"), SECRET).unwrap();
        let project = tmp.path().join("project");
        let sub = project.join(".agents/skills/sub");
        fs::create_dir_all(&sub).unwrap();
        fs::write(sub.join("SKILL.md"), "---\ndescription: fine\n---\n").unwrap();
        Race {
            tmp,
            store,
            project,
        }
    }

    /// Swaps `place` with a link to the outside folder, over and over, while `import` runs
    /// for a few seconds; the secret must never reach the store.
    fn run(&self, place: &Path, import: impl Fn(&Store) -> bool) {
        let parked = self.project.join("parked");
        symlink(self.tmp.path().join("outside"), &parked).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, place, parked) = (stop.clone(), place.to_owned(), parked.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    renameat2(
                        AT_FDCWD,
                        &place,
                        AT_FDCWD,
                        &parked,
                        RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                }
            })
        };
        let (mut clean, mut refused) = (0, 0);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            match import(&self.store) {
                true => clean += 1,
                false => refused += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        eprintln!("{clean} clean imports, {refused} refused");
        assert!(clean > 0 && refused > 0, "the race never ran both ways");
        assert!(
            !self.store.contains(ObjectKind::Blob, &Digest::of(SECRET)),
            "an import read through the swapped-in link"
        );
    }
}

#[test]
fn a_folder_swapped_for_a_link_during_an_import_is_never_followed() {
    let r = Race::new();
    let skills = r.project.join(".agents/skills");
    r.run(&skills.join("sub"), |store| {
        store.import_dir(&skills, &Limits::default()).is_ok()
    });
}

#[test]
fn a_project_folder_swapped_for_a_link_out_is_refused_never_imported() {
    let r = Race::new();
    let skills = r.project.join(".agents/skills");
    let cache = SkillCache::default();
    r.run(&skills, |store| {
        dir_source(store, &cache, Tier::Repository, &skills, Some(&r.project)).is_ok()
    });
}

/// What no skill can hold (a FIFO, a socket, folders nested past the project's depth) is left
/// out of a project's folder, each said in a warning naming it from the project; the rest is
/// served. Imported strictly (an operator's own folder), the FIFO is an error.
#[test]
fn what_no_skill_can_hold_is_left_out_of_a_project_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let project = tmp.path().join("project");
    let skills = project.join(".agents/skills");
    let ok = skills.join("ok");
    fs::create_dir_all(&ok).unwrap();
    fs::write(ok.join("SKILL.md"), "---\ndescription: fine\n---\n").unwrap();
    nix::unistd::mkfifo(&ok.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(ok.join("sock")).unwrap();
    cloud_harness_store::walk::make_chain(&ok, "d", 100).unwrap();
    let cache = SkillCache::default();
    let source = dir_source(&store, &cache, Tier::Repository, &skills, Some(&project)).unwrap();
    let names: Vec<&str> = source
        .discovery
        .skills
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["ok"]);
    let said = source.discovery.warnings.join("\n");
    for needle in [
        "the project's .agents/skills/ok/pipe: a FIFO is not a regular file",
        "the project's .agents/skills/ok/sock: a socket",
        "nested deeper than 32 folders; it is left out",
    ] {
        assert!(said.contains(needle), "{needle:?} in {said}");
    }
    assert!(!said.contains(tmp.path().to_str().unwrap()), "{said}");
    let served = store.tree(&source.discovery.skills[0].info.digest).unwrap();
    assert!(served.get("pipe").is_none() && served.get("SKILL.md").is_some());

    let err = store.import_dir(&skills, &Limits::default()).unwrap_err();
    assert!(err.message.contains("FIFO"), "{err}");
    cloud_harness_store::removal::remove_tree(&project).unwrap();
}

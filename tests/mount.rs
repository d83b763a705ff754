//! The skills file system mounted for real, compared with the expected tree materialized into a
//! plain directory. Needs root, /dev/fuse and fusermount3 (`.ci/setup` installs fuse3); where
//! they are missing the tests say so and pass, except under CI, where they fail.

use cloud_harness::cli::tiers::TierArgs;
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::generation::{Generation, View};
use cloud_harness_skills::namespace::{RESOLUTION_FILE, TIERS_DIR, XATTR_PREFIX};
use cloud_harness_store::cas::{materialize, ObjectKind, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");

fn fuse_available() -> bool {
    let ok = nix::unistd::geteuid().is_root()
        && Path::new("/dev/fuse").exists()
        && Command::new("fusermount3")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the mount tests: needs root, /dev/fuse and fusermount3"
        );
        eprintln!("skipped: needs root, /dev/fuse and fusermount3 (run .ci/setup)");
    }
    ok
}

fn is_mounted(mountpoint: &Path) -> bool {
    let Ok(real) = mountpoint.canonicalize() else {
        return false;
    };
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(real.to_str().unwrap_or("")))
}

const LIVE_DEADLINE: Duration = Duration::from_secs(10);

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// A running `cloud-harness mount`.
struct Daemon {
    child: Option<Child>,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(store: &Path, mountpoint: &Path, args: &[OsString]) -> Daemon {
        fs::create_dir_all(mountpoint).unwrap();
        let log = mountpoint.with_extension("log");
        let child = Command::new(BIN)
            .arg("mount")
            .arg(mountpoint)
            .args(args)
            .env("TOOLKIT_CACHE_ROOT", store)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child: Some(child),
            mountpoint: mountpoint.to_owned(),
            log,
        };
        let start = Instant::now();
        while !is_mounted(mountpoint) {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("daemon exited with {status}: {}", d.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no mount: {}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and the daemon must unmount and exit 0; returns what it logged.
    fn stop(mut self) -> String {
        let mut child = self.child.take().unwrap();
        let status =
            terminate(&mut child, Duration::from_secs(10)).expect("daemon ignored SIGTERM");
        assert!(
            status.success(),
            "daemon exit {status}: {}",
            self.log_text()
        );
        assert!(!is_mounted(&self.mountpoint), "still mounted after SIGTERM");
        self.log_text()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if terminate(&mut child, Duration::from_secs(5)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if is_mounted(&self.mountpoint) {
            let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// SIGTERM, then up to `timeout` for the exit.
fn terminate(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().ok().flatten() {
            return Some(status);
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The names in a folder, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn write(root: &Path, rel: &str, content: impl AsRef<[u8]>) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

fn skill(root: &Path, rel: &str, name: &str, body: &str) {
    write(
        root,
        &format!("{rel}/SKILL.md"),
        format!("---\nname: {name}\ndescription: {name} ({rel})\n---\n{body}\n"),
    );
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Owner, workspace and repository folders with the real-world shapes: category folders,
/// scripts with and without their executable bit, an extensionless executable, sibling links
/// (as text and as a symlink), nested references, an empty file and a larger binary file.
struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    store: PathBuf,
    owner: PathBuf,
    workspace: PathBuf,
    project: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        let (owner, workspace, project) = (
            root.join("owner"),
            root.join("workspace"),
            root.join("project"),
        );
        skill(
            &owner,
            "engineering/tdd",
            "tdd",
            "Ask for a review: ../code-review/reviewer.md",
        );
        write(
            &owner,
            "engineering/tdd/scripts/run.sh",
            "#!/bin/sh\necho run\n",
        );
        chmod(&owner.join("engineering/tdd/scripts/run.sh"), 0o755);
        write(
            &owner,
            "engineering/tdd/scripts/no-exec.sh",
            "echo no exec bit\n",
        );
        write(
            &owner,
            "engineering/tdd/scripts/helper",
            "#!/usr/bin/env python3\nprint(1)\n",
        );
        chmod(&owner.join("engineering/tdd/scripts/helper"), 0o755);
        write(
            &owner,
            "engineering/tdd/references/deep/notes.md",
            "deep notes\n".repeat(50),
        );
        write(&owner, "engineering/tdd/empty", "");
        symlink(
            "../code-review/reviewer.md",
            owner.join("engineering/tdd/reviewer-link.md"),
        )
        .unwrap();
        skill(
            &owner,
            "engineering/code-review",
            "code-review",
            "Review code.",
        );
        write(
            &owner,
            "engineering/code-review/reviewer.md",
            "You are a reviewer.\n",
        );
        skill(&owner, "assets-skill", "assets-skill", "Has a big file.");
        let big: Vec<u8> = (0..(3u32 << 20))
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        write(&owner, "assets-skill/assets/data.bin", big);

        skill(
            &workspace,
            "tdd",
            "tdd",
            "Workspace copy, shadowed by the owner tier.",
        );
        skill(&workspace, "ws-only", "ws-only", "Only in the workspace.");
        skill(
            &project,
            ".agents/skills/code-review",
            "code-review",
            "Repository copy.",
        );
        skill(&project, ".claude/skills/lint", "lint", "Lint things.");
        Fixture {
            store: root.join("store"),
            _tmp: tmp,
            root,
            owner,
            workspace,
            project,
        }
    }

    fn tier_args(&self) -> TierArgs {
        TierArgs {
            no_builtin: false,
            bundle: vec![],
            owner: vec![self.owner.clone()],
            workspace: vec![self.workspace.clone()],
            repository: Some(self.project.clone()),
            overrides: vec![],
        }
    }

    /// The fixture mounted at `<root>/mnt`.
    fn mount(&self) -> (PathBuf, Daemon) {
        self.mount_with(&[])
    }

    fn mount_with(&self, extra: &[&str]) -> (PathBuf, Daemon) {
        let mnt = self.root.join("mnt");
        let mut args = self.cli_args();
        args.extend(extra.iter().map(OsString::from));
        let daemon = Daemon::start(&self.store, &mnt, &args);
        (mnt, daemon)
    }

    fn cli_args(&self) -> Vec<OsString> {
        vec![
            "--owner".into(),
            self.owner.clone().into(),
            "--workspace".into(),
            self.workspace.clone().into(),
            "--repository".into(),
            self.project.clone().into(),
        ]
    }

    /// What the mount must show, materialized into a plain directory.
    fn expected(&self, dest: &Path) -> Generation {
        let store = Store::open(&self.store).unwrap();
        let cache = SkillCache::default();
        let g = self
            .tier_args()
            .stack(&store, &cache)
            .unwrap()
            .generation(&store, &cache)
            .unwrap();
        fs::create_dir_all(dest.join(TIERS_DIR)).unwrap();
        for (name, origin) in g.view(View::Merged) {
            materialize(&store, &origin.digest, &dest.join(name)).unwrap();
        }
        for tier in g.tiers() {
            let dir = dest.join(TIERS_DIR).join(tier.as_str());
            fs::create_dir(&dir).unwrap();
            for (name, origin) in g.view(View::Tier(tier)) {
                materialize(&store, &origin.digest, &dir.join(name)).unwrap();
            }
        }
        fs::write(dest.join(RESOLUTION_FILE), &g.resolution_json).unwrap();
        chmod(&dest.join(RESOLUTION_FILE), 0o444);
        g
    }
}

/// Every path below `root`, relative, sorted.
fn walk(root: &Path) -> Vec<PathBuf> {
    fn go(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(base).unwrap().to_owned());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                go(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    go(root, root, &mut out);
    out.sort();
    out
}

/// Differences in names, types, sizes, modes, symlink targets and bytes.
fn differences(mount: &Path, expected: &Path) -> Vec<String> {
    let (a, b) = (walk(mount), walk(expected));
    if a != b {
        return vec![format!("names differ:\nmount    {a:?}\nexpected {b:?}")];
    }
    let mut out = Vec::new();
    for rel in &a {
        let (x, y) = (mount.join(rel), expected.join(rel));
        let (mx, my) = (
            fs::symlink_metadata(&x).unwrap(),
            fs::symlink_metadata(&y).unwrap(),
        );
        if mx.file_type() != my.file_type() {
            out.push(format!("{rel:?}: type"));
            continue;
        }
        if mx.mode() & 0o7777 != my.mode() & 0o7777 && !mx.is_symlink() {
            out.push(format!(
                "{rel:?}: mode {:o} vs {:o}",
                mx.mode() & 0o7777,
                my.mode() & 0o7777
            ));
        }
        if mx.is_symlink() {
            if fs::read_link(&x).unwrap() != fs::read_link(&y).unwrap() {
                out.push(format!("{rel:?}: symlink target"));
            }
        } else if mx.is_file() {
            if mx.len() != my.len() {
                out.push(format!("{rel:?}: size {} vs {}", mx.len(), my.len()));
            } else if fs::read(&x).unwrap() != fs::read(&y).unwrap() {
                out.push(format!("{rel:?}: bytes"));
            }
        }
    }
    out
}

#[test]
fn the_mount_shows_exactly_the_expected_tree() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new();
    let expected = fx.root.join("expected");
    let g = fx.expected(&expected);
    let (mnt, daemon) = fx.mount();

    let diff = differences(&mnt, &expected);
    assert!(diff.is_empty(), "{diff:#?}");
    // The shapes that matter: winners by tier, the sibling link, the executable bits.
    assert!(fs::read_to_string(mnt.join("tdd/SKILL.md"))
        .unwrap()
        .contains("Ask for a review"));
    assert_eq!(
        fs::read_to_string(mnt.join("tdd/reviewer-link.md")).unwrap(),
        "You are a reviewer.\n"
    );
    assert!(
        fs::read_to_string(mnt.join(".tiers/workspace/tdd/SKILL.md"))
            .unwrap()
            .contains("Workspace copy")
    );
    assert_eq!(
        fs::metadata(mnt.join("tdd/scripts/helper")).unwrap().mode() & 0o777,
        0o755
    );
    assert_eq!(
        fs::metadata(mnt.join("tdd/scripts/no-exec.sh"))
            .unwrap()
            .mode()
            & 0o777,
        0o644
    );
    let resolution: serde_json::Value =
        serde_json::from_slice(&fs::read(mnt.join(RESOLUTION_FILE)).unwrap()).unwrap();
    assert_eq!(resolution["generation"], g.digest().to_string());

    // Provenance without opening files.
    let get = |p: &str, k: &str| {
        String::from_utf8(
            xattr::get(mnt.join(p), format!("{XATTR_PREFIX}{k}"))
                .unwrap()
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(get("tdd", "tier"), "owner");
    assert_eq!(
        get("tdd", "source"),
        format!("owner:{}", fx.owner.canonicalize().unwrap().display())
    );
    assert_eq!(
        get("tdd", "skill-digest"),
        g.skill(View::Merged, "tdd").unwrap().digest.to_string()
    );
    assert_eq!(get("tdd/SKILL.md", "tier"), "owner");
    let content = fs::read(mnt.join("tdd/SKILL.md")).unwrap();
    assert_eq!(
        get("tdd/SKILL.md", "digest"),
        cloud_harness_store::cas::Digest::of(&content).to_string()
    );
    assert_eq!(get(".tiers/repository/code-review", "tier"), "repository");
    assert_eq!(get("cloud-harness-skills", "toolkit"), "cloud-harness");
    assert_eq!(get(".", "generation"), g.digest().to_string());
    daemon.stop();
}

#[derive(Debug, Clone)]
enum Op {
    Stat(usize),
    Read {
        path: usize,
        offset: u64,
        len: usize,
    },
    ReadDir(usize),
    SeekRead {
        path: usize,
        from_end: bool,
        offset: u64,
        len: usize,
    },
    ReadLink(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let idx = 0usize..10_000;
    prop_oneof![
        idx.clone().prop_map(Op::Stat),
        (idx.clone(), 0u64..(4 << 20), 0usize..(200 << 10))
            .prop_map(|(path, offset, len)| Op::Read { path, offset, len }),
        idx.clone().prop_map(Op::ReadDir),
        (idx.clone(), any::<bool>(), 0u64..(4 << 20), 1usize..70_000).prop_map(
            |(path, from_end, offset, len)| Op::SeekRead {
                path,
                from_end,
                offset,
                len
            }
        ),
        idx.prop_map(Op::ReadLink),
    ]
}

/// What one operation observes, comparable between the mount and the plain directory.
fn observe(root: &Path, rel: &Path, op: &Op) -> String {
    let p = root.join(rel);
    // Reading a directory fails differently on every file system (its size, its errno):
    // reads and seeks are compared on files only.
    if matches!(op, Op::Read { .. } | Op::SeekRead { .. }) && p.is_dir() {
        return "a directory".into();
    }
    let res: std::io::Result<String> = (|| match op {
        Op::Stat(_) => {
            let m = fs::symlink_metadata(&p)?;
            Ok(format!(
                "{:?} {} {:o}",
                m.file_type(),
                if m.is_dir() { 0 } else { m.len() },
                m.mode() & 0o777
            ))
        }
        Op::Read { offset, len, .. } => {
            let mut f = fs::File::open(&p)?;
            f.seek(SeekFrom::Start(*offset))?;
            let mut buf = vec![0u8; *len];
            let n = f.read(&mut buf)?;
            // A short read is allowed; what was read must match.
            let mut rest = Vec::new();
            f.take((*len - n) as u64).read_to_end(&mut rest)?;
            buf.truncate(n);
            buf.extend(rest);
            Ok(format!(
                "{} {:?}",
                buf.len(),
                cloud_harness_store::cas::Digest::of(&buf)
            ))
        }
        Op::ReadDir(_) => {
            let mut names: Vec<String> = fs::read_dir(&p)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<_, _>>()?;
            names.sort();
            Ok(names.join(","))
        }
        Op::SeekRead {
            from_end,
            offset,
            len,
            ..
        } => {
            let mut f = fs::File::open(&p)?;
            let size = f.metadata()?.len();
            let pos = if *from_end {
                f.seek(SeekFrom::End(-((*offset % (size + 1)) as i64)))?
            } else {
                f.seek(SeekFrom::Start(*offset))?
            };
            let mut buf = Vec::new();
            (&mut f).take(*len as u64).read_to_end(&mut buf)?;
            Ok(format!(
                "{pos} {} {:?}",
                buf.len(),
                cloud_harness_store::cas::Digest::of(&buf)
            ))
        }
        Op::ReadLink(_) => Ok(fs::read_link(&p)?.display().to_string()),
    })();
    match res {
        Ok(s) => s,
        Err(e) => format!("error {:?}", e.raw_os_error()),
    }
}

#[test]
fn random_reads_stats_listings_and_seeks_agree_with_a_plain_directory() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new();
    let expected = fx.root.join("expected");
    fx.expected(&expected);
    let (mnt, daemon) = fx.mount();
    let mut paths = walk(&expected);
    paths.push(PathBuf::new());
    paths.push(PathBuf::from("no-such-skill/SKILL.md"));

    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(op(), 1..40), |ops| {
            for op in &ops {
                let i = match op {
                    Op::Stat(i) | Op::ReadDir(i) | Op::ReadLink(i) => *i,
                    Op::Read { path, .. } | Op::SeekRead { path, .. } => *path,
                };
                let rel = &paths[i % paths.len()];
                prop_assert_eq!(
                    observe(&mnt, rel, op),
                    observe(&expected, rel, op),
                    "{:?} on {:?}",
                    op,
                    rel
                );
            }
            Ok(())
        })
        .unwrap();
    daemon.stop();
}

fn erofs<T: std::fmt::Debug>(what: &str, r: std::io::Result<T>) {
    match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(nix::libc::EROFS), "{what}: {e}"),
        Ok(v) => panic!("{what} succeeded: {v:?}"),
    }
}

fn erofs_nix<T: std::fmt::Debug>(what: &str, r: nix::Result<T>) {
    erofs(what, r.map_err(std::io::Error::from));
}

#[test]
fn every_write_call_fails_with_erofs_and_changes_nothing() {
    if !fuse_available() {
        return;
    }
    use nix::sys::stat::{mknod, utimensat, Mode, SFlag, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let fx = Fixture::new();
    let expected = fx.root.join("expected");
    fx.expected(&expected);
    let (mnt, daemon) = fx.mount();
    let file = mnt.join("tdd/SKILL.md");
    let dir = mnt.join("tdd");

    erofs("create", fs::File::create(mnt.join("new.md")));
    erofs("create in a skill", fs::File::create(dir.join("new.md")));
    erofs(
        "open for writing",
        fs::OpenOptions::new().write(true).open(&file),
    );
    erofs(
        "open read-write",
        fs::OpenOptions::new().read(true).write(true).open(&file),
    );
    erofs(
        "open for append",
        fs::OpenOptions::new().append(true).open(&file),
    );
    erofs(
        "open with O_TRUNC",
        fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&file),
    );
    erofs("mkdir", fs::create_dir(mnt.join("new-skill")));
    erofs("unlink", fs::remove_file(&file));
    erofs("rmdir", fs::remove_dir(dir.join("references/deep")));
    erofs("rename", fs::rename(&file, dir.join("renamed.md")));
    erofs("rename a skill", fs::rename(&dir, mnt.join("tdd2")));
    erofs("link", fs::hard_link(&file, dir.join("hard.md")));
    erofs("symlink", symlink("SKILL.md", dir.join("sym.md")));
    erofs(
        "chmod",
        fs::set_permissions(&file, fs::Permissions::from_mode(0o777)),
    );
    erofs("chown", std::os::unix::fs::chown(&file, Some(1), Some(1)));
    erofs_nix("truncate", nix::unistd::truncate(&file, 0));
    erofs_nix(
        "utimes",
        utimensat(
            nix::fcntl::AT_FDCWD,
            &file,
            &TimeSpec::new(0, 0),
            &TimeSpec::new(0, 0),
            UtimensatFlags::FollowSymlink,
        ),
    );
    erofs("setxattr", xattr::set(&file, "user.test", b"x"));
    erofs(
        "removexattr",
        xattr::remove(&file, format!("{XATTR_PREFIX}tier")),
    );
    erofs_nix(
        "mknod",
        mknod(&dir.join("fifo"), SFlag::S_IFIFO, Mode::S_IRWXU, 0),
    );

    let diff = differences(&mnt, &expected);
    assert!(diff.is_empty(), "a write changed the mount: {diff:#?}");
    daemon.stop();
}

#[test]
/// Live changes reach the kernel mount (even a cached negative entry). The deadline only keeps
/// a broken build from hanging: on a loaded 2-core machine the test suite itself competes with
/// the daemon; how fast a change shows is the mount benchmark's business.
fn a_live_tier_change_becomes_visible() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new();
    let (mnt, daemon) = fx.mount();
    let ws_only = mnt.join("ws-only/SKILL.md");
    assert!(fs::read_to_string(&ws_only)
        .unwrap()
        .contains("Only in the workspace"));
    assert!(!mnt.join("fresh").exists()); // and the kernel now caches the negative entry

    // An edited SKILL.md.
    skill(&fx.workspace, "ws-only", "ws-only", "Edited.");
    let took = wait_for("the edit", LIVE_DEADLINE, || {
        fs::read_to_string(&ws_only)
            .unwrap_or_default()
            .contains("Edited.")
    });
    eprintln!("edit visible after {took:?}");

    // A skill added: the cached negative entry must not hide it.
    skill(&fx.workspace, "fresh", "fresh", "New.");
    wait_for("the new skill", LIVE_DEADLINE, || {
        mnt.join("fresh/SKILL.md").exists()
    });
    let listed = || names(&mnt);
    assert!(listed().contains(&"fresh".into()));

    // A skill removed.
    fs::remove_dir_all(fx.workspace.join("fresh")).unwrap();
    wait_for("the removal", LIVE_DEADLINE, || !mnt.join("fresh").exists());
    assert!(!listed().contains(&"fresh".into()));

    // A repository skill folder that appears later.
    skill(&fx.project, ".claude/skills/late", "late", "Late.");
    wait_for("the repository skill", LIVE_DEADLINE, || {
        mnt.join("late/SKILL.md").exists()
    });
    daemon.stop();
}

/// The kernel's requests of each kind the daemon served, from its last log line.
fn requests(log: &str) -> HashMap<String, u64> {
    let line = log
        .lines()
        .rfind(|l| l.contains("unmounted"))
        .unwrap_or_else(|| panic!("no request counts in the log: {log}"));
    let counts = line.split("requests=").nth(1).expect("requests field");
    counts
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').parse().unwrap_or(0)))
        .collect()
}

#[test]
fn a_warm_walk_asks_the_daemon_nothing() {
    if !fuse_available() {
        return;
    }
    let f = Fixture::new();
    // The same tree walked once, then four times, by two daemons: the three later walks
    // must add no request at all (directories open without a message, listings and entries
    // come from the kernel's caches).
    let mut counts = Vec::new();
    let mut trees = Vec::new();
    for walks in [1, 4] {
        let (mnt, daemon) = f.mount_with(&["--no-prewarm"]);
        for _ in 0..walks {
            trees.push(walk(&mnt));
        }
        // What Python's `open` asks of every file: not a terminal, answered (and counted).
        use std::io::IsTerminal;
        let file = fs::File::open(mnt.join("tdd/SKILL.md")).unwrap();
        assert!(!file.is_terminal());
        drop(file);
        counts.push(requests(&daemon.stop()));
    }
    assert!(trees.windows(2).all(|w| w[0] == w[1]), "walks differ");
    assert!(trees[0].len() > 20, "a real tree: {:?}", trees[0]);
    let get = |c: &HashMap<String, u64>, k: &str| c.get(k).copied().unwrap_or(0);
    let (once, four) = (&counts[0], &counts[1]);
    // One OPENDIR at most: the first, answered ENOSYS, after which the kernel stops asking.
    assert!(get(four, "opendir") <= 1, "opendir requests: {four:?}");
    for op in ["readdir", "readdirplus", "lookup", "getattr", "readlink"] {
        assert!(
            get(four, op) <= get(once, op) + 1,
            "warm walks asked for {op}: one walk {once:?}, four walks {four:?}"
        );
    }
    assert!(get(once, "readdir") + get(once, "readdirplus") > 0);
    assert_eq!(get(four, "ioctl"), 1, "{four:?}");
}

/// Waits for the daemon's prewarm line and returns it.
fn prewarm_line(daemon: &Daemon) -> String {
    let mut line = None;
    wait_for("the prewarm", LIVE_DEADLINE, || {
        line = daemon
            .log_text()
            .lines()
            .find(|l| l.starts_with("cloud-harness: prewarmed "))
            .map(str::to_owned);
        line.is_some()
    });
    line.unwrap()
}

#[test]
fn after_the_prewarm_a_first_walk_and_small_reads_ask_the_daemon_nothing() {
    if !fuse_available() {
        return;
    }
    let f = Fixture::new();
    // Two daemons over the same tree: one only prewarms; the other prewarms and is then
    // walked as an agent walks a new workspace (every folder listed, every entry lstat, every
    // small file read). The agent's walk must add no request at all.
    let mut counts = Vec::new();
    for agent in [false, true] {
        let (mnt, daemon) = f.mount();
        let line = prewarm_line(&daemon);
        assert!(
            !line.contains("failed") && !line.contains("cut short"),
            "{line}"
        );
        if agent {
            let (mut entries, mut files) = (0, 0);
            let mut dirs = vec![mnt.clone()];
            while let Some(dir) = dirs.pop() {
                for e in fs::read_dir(&dir).unwrap() {
                    let path = e.unwrap().path();
                    let meta = fs::symlink_metadata(&path).unwrap();
                    entries += 1;
                    if path == mnt.join(TIERS_DIR) {
                        continue; // listed, not entered: the per-tier views are not prewarmed
                    }
                    if meta.is_dir() {
                        dirs.push(path);
                    } else if meta.is_file() && meta.len() <= 128 << 10 {
                        assert_eq!(fs::read(&path).unwrap().len() as u64, meta.len());
                        files += 1;
                    }
                }
            }
            assert!(
                line.contains(&format!("prewarmed {entries} entries and {files} files")),
                "the agent saw {entries} entries and {files} small files: {line}"
            );
            assert!(files > 10, "a real tree: {files} files");
        }
        counts.push(requests(&daemon.stop()));
    }
    let get = |c: &HashMap<String, u64>, k: &str| c.get(k).copied().unwrap_or(0);
    let (alone, walked) = (&counts[0], &counts[1]);
    for op in [
        "lookup",
        "getattr",
        "read",
        "opendir",
        "readdir",
        "readdirplus",
    ] {
        assert_eq!(
            get(walked, op),
            get(alone, op),
            "the walk after the prewarm asked for {op}: prewarm alone {alone:?}, with the walk {walked:?}"
        );
    }
    assert!(
        get(alone, "read") > 10 && get(alone, "readdirplus") > 0,
        "{alone:?}"
    );
}

#[test]
fn an_open_directory_keeps_the_listing_of_its_generation() {
    open_directory_keeps_its_listing(false);
}

/// The same with the listing in the kernel's cache before the directory is opened, and 600
/// other folders listed by the daemon since (the prewarm): the listing the reader is in was
/// made long ago, and the daemon must still have it when the folder changes.
#[test]
fn a_listing_served_from_the_kernels_cache_keeps_its_generation_too() {
    open_directory_keeps_its_listing(true);
}

fn open_directory_keeps_its_listing(prewarmed: bool) {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    // Long names and many skills: the listing takes several getdents calls.
    let long = "x".repeat(150);
    for i in 0..600 {
        skill(&ws, &format!("{long}-{i:04}"), &format!("s{i}"), "body");
    }
    let mnt = tmp.path().join("mnt");
    let mut args: Vec<OsString> = vec![
        "--no-builtin".into(),
        "--workspace".into(),
        ws.clone().into(),
    ];
    if !prewarmed {
        args.push("--no-prewarm".into());
    }
    let daemon = Daemon::start(&tmp.path().join("store"), &mnt, &args);
    if prewarmed {
        let line = prewarm_line(&daemon);
        assert!(
            line.contains("prewarmed 1202 entries and 600 files"),
            "{line}"
        );
    }

    let mut dir = nix::dir::Dir::open(
        &mnt,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut iter = dir.iter();
    for _ in 0..50 {
        let e = iter.next().unwrap().unwrap();
        seen.push(e.file_name().to_string_lossy().into_owned());
    }
    // Change the tier under the open handle: half the skills go, others arrive.
    for i in 0..300 {
        fs::remove_dir_all(ws.join(format!("{long}-{i:04}"))).unwrap();
        skill(&ws, &format!("{long}-new-{i:04}"), &format!("n{i}"), "body");
    }
    wait_for("the new generation", Duration::from_secs(5), || {
        mnt.join(format!("{long}-new-0000")).exists()
    });
    for e in iter {
        seen.push(e.unwrap().file_name().to_string_lossy().into_owned());
    }
    seen.retain(|n| !n.starts_with('.')); // ".", "..", and the mount's own entries
    let mut want: Vec<String> = (0..600).map(|i| format!("{long}-{i:04}")).collect();
    want.sort();
    let extra: Vec<_> = seen.iter().filter(|n| !want.contains(n)).collect();
    let mut dups = seen.clone();
    dups.sort();
    dups.dedup();
    assert_eq!(
        seen.len(),
        want.len(),
        "the listing mixed generations: extra {extra:?}, {} duplicates",
        seen.len() - dups.len()
    );
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(
        sorted, want,
        "the listing is not the one of the generation it opened"
    );
    drop(dir);
    // A new handle sees the new generation.
    let mut now = names(&mnt);
    now.retain(|n| !n.starts_with('.'));
    assert_eq!(now.len(), 600);
    assert!(now.iter().any(|n| n.contains("-new-")));
    daemon.stop();
}

#[test]
fn a_corrupt_object_gives_eio_and_a_log_line_never_wrong_bytes() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new();
    // Without the prewarm, which may read (and check) the object before it is damaged: bits
    // that rot after a blob's first read go unseen until `cas verify`, as docs/cli.md says.
    let (mnt, daemon) = fx.mount_with(&["--no-prewarm"]);
    let reviewer = b"You are a reviewer.\n";
    let digest = cloud_harness_store::cas::Digest::of(reviewer);
    let hex = digest.hex();
    let object = Store::open(&fx.store)
        .unwrap()
        .object_path(ObjectKind::Blob, &digest);
    chmod(&object, 0o644);
    fs::write(&object, b"You are a hacker!!!\n").unwrap(); // same length, other bytes
    let err = fs::read(mnt.join("code-review/reviewer.md")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EIO), "{err}");
    let log = daemon.log_text();
    assert!(
        log.contains("corrupt object") && log.contains(&hex),
        "{log}"
    );
    daemon.stop();
}

#[test]
fn sigkill_leaves_no_hung_mount_and_a_restart_works() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new();
    let (mnt, mut daemon) = fx.mount();
    assert!(mnt.join("tdd/SKILL.md").exists());
    // Folders opened (by the prewarm, and here): fusermount's auto-unmount alone may now
    // leave the dead mount in place (its check opens the mount point, which no longer asks
    // the daemon), so the guard must be there to detach it.
    prewarm_line(&daemon);
    assert!(names(&mnt).contains(&"tdd".to_owned()));
    let mut child = daemon.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The guard or fusermount3's auto-unmount (which CI once saw come first) detaches it once
    // the daemon is gone: on a loaded machine (a build beside the tests) that once took over
    // 5 s. Either way the guard says what it found.
    wait_for("the unmount", LIVE_DEADLINE, || !is_mounted(&mnt));
    wait_for("the guard's line", LIVE_DEADLINE, || {
        let log = daemon.log_text();
        log.contains("ended without unmounting; detached 1 mount(s)")
            || log.contains("ended without unmounting; its 1 mount(s) were no longer mounted")
    });
    assert!(
        fs::read_dir(&mnt).unwrap().next().is_none(),
        "the mount point is not empty"
    );
    drop(daemon);

    let again = Daemon::start(&fx.store, &mnt, &fx.cli_args());
    assert!(fs::read_to_string(mnt.join("tdd/SKILL.md"))
        .unwrap()
        .contains("Ask for a review"));
    again.stop();
}

#[test]
fn one_tier_alone_can_be_mounted() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new();
    let mnt = fx.root.join("owner-skills");
    let mut args = fx.cli_args();
    args.extend(["--only".into(), "owner".into()]);
    let daemon = Daemon::start(&fx.store, &mnt, &args);
    assert_eq!(names(&mnt), ["assets-skill", "code-review", "tdd"]);
    // The owner's code-review, though the merged view would serve the same one.
    assert!(fs::read_to_string(mnt.join("code-review/SKILL.md"))
        .unwrap()
        .contains("engineering/code-review"));
    daemon.stop();
}

/// A tree whose links are fine where its source keeps them, but lead out once its skill is
/// served at the top of the mount (and ones that lead out anyway): through the kernel mount,
/// every path resolves inside the mount or nowhere.
#[test]
fn no_link_of_a_served_tree_leads_out_of_the_mount() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new();
    let tdd = fx.owner.join("engineering/tdd");
    write(
        &fx.owner,
        "engineering/README.md",
        "the source folder's own file\n",
    );
    symlink("../README.md", tdd.join("up-one.md")).unwrap();
    symlink("../../../../../../etc/passwd", tdd.join("far.md")).unwrap();
    symlink("/etc/passwd", tdd.join("abs.md")).unwrap();
    symlink("..", tdd.join("up")).unwrap();
    symlink("up/../../x", tdd.join("chain.md")).unwrap();
    let (mnt, daemon) = fx.mount();
    let real_mnt = fs::canonicalize(&mnt).unwrap();
    let mut stack = vec![mnt.clone()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            seen += 1;
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
            }
            match fs::canonicalize(&path) {
                Ok(real) => assert!(
                    real.starts_with(&real_mnt),
                    "{} leads to {}",
                    path.display(),
                    real.display()
                ),
                // A link to a sibling that is not served, or a loop: it leads nowhere.
                Err(e) => assert!(
                    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(40),
                    "{}: {e}",
                    path.display()
                ),
            }
        }
    }
    assert!(seen > 20, "walked {seen} paths");
    // `../README.md` names a sibling of the skill (none is served by that name): kept, and
    // leads nowhere. The others leave the mount: dropped.
    assert!(fs::symlink_metadata(mnt.join("tdd/up-one.md")).is_ok());
    for dropped in ["far.md", "abs.md", "chain.md"] {
        assert!(
            fs::symlink_metadata(mnt.join("tdd").join(dropped)).is_err(),
            "{dropped} is served"
        );
    }
    assert!(
        fs::symlink_metadata(mnt.join("tdd/up")).is_ok(),
        "a link within the view is kept"
    );
    assert!(fs::symlink_metadata(mnt.join("tdd/reviewer-link.md")).is_ok());
    daemon.stop();
}

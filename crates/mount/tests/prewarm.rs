//! The prewarm's walk over a plain directory: what it reads, what it refuses to follow, and
//! where its budget and its stop flag end it. (Through a real mount: `tests/mount.rs`.)

use cloud_harness_mount::prewarm::{walk, Budget};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::AtomicBool;

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// Three skills, a per-tier folder, a large file, links out and in, and a FIFO.
fn tree() -> (tempfile::TempDir, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    write(&outside.path().join("secret/SKILL.md"), b"outside");
    let r = root.path();
    for s in ["a", "b", "c"] {
        write(&r.join(s).join("SKILL.md"), b"---\nname: x\n---\n");
        write(&r.join(s).join("refs/notes.md"), &[b'n'; 5000]);
    }
    write(&r.join("a/assets/big.bin"), &vec![0u8; 200 << 10]);
    write(&r.join(".tiers/owner/a/SKILL.md"), b"tier view");
    symlink(outside.path().join("secret"), r.join("escape")).unwrap();
    symlink(
        outside.path().join("secret/SKILL.md"),
        r.join("b/escape.md"),
    )
    .unwrap();
    nix::unistd::mkfifo(&r.join("c/pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    (root, outside)
}

#[test]
fn it_reads_small_regular_files_and_follows_no_link() {
    let (root, _outside) = tree();
    let s = walk(root.path(), Budget::default(), &AtomicBool::new(false));
    // Entries: the root's a, b, c, .tiers, escape; per skill SKILL.md, refs, refs/notes.md;
    // a/assets and big.bin; b/escape.md; c/pipe.
    assert_eq!(s.entries, 5 + 3 * 3 + 2 + 1 + 1, "{s:?}");
    // Three SKILL.md and three notes: not the large file, the links, the FIFO or the tier view.
    assert_eq!(s.files, 6, "{s:?}");
    assert_eq!(s.bytes, 3 * (16 + 5000), "{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
    assert!(!s.cut_short);
}

/// A mount whose loads are counted is walked for its entries only: every folder listed, no
/// file read (an empty one neither), and the walk is not cut short.
#[test]
fn a_metadata_walk_lists_everything_and_reads_nothing() {
    let (root, _outside) = tree();
    write(&root.path().join("a/empty.md"), b"");
    let s = walk(root.path(), Budget::metadata(), &AtomicBool::new(false));
    assert_eq!(s.entries, 5 + 3 * 3 + 2 + 1 + 1 + 1, "{s:?}");
    assert_eq!((s.files, s.bytes, s.errors), (0, 0, 0), "{s:?}");
    assert!(!s.cut_short);
}

#[test]
fn the_budget_and_the_stop_flag_end_it() {
    let (root, _outside) = tree();
    // Pages, not bytes: each small file costs a page or two, and 3 pages run out at once.
    let pages = Budget {
        bytes: 3 * 4096,
        ..Budget::default()
    };
    let s = walk(root.path(), pages, &AtomicBool::new(false));
    assert!(s.cut_short && s.files == 3, "{s:?}"); // the three SKILL.md, first
    let entries = Budget {
        entries: 4,
        ..Budget::default()
    };
    let s = walk(root.path(), entries, &AtomicBool::new(false));
    assert!(s.cut_short && s.entries <= 5, "{s:?}");
    let s = walk(root.path(), Budget::default(), &AtomicBool::new(true));
    assert!(s.cut_short && s.files == 0 && s.entries == 0, "{s:?}");
}

/// A stand-in walker (`<script> prewarm DIR`): marks itself running in DIR, notes how many
/// are, then runs `rest` (which ends with a summary, or never).
fn stand_in(dir: &Path, rest: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("walker.sh");
    let text = format!(
        "#!/bin/sh\nmkdir \"$2/run.$$\"\nls -d \"$2\"/run.* | wc -l >> \"$2/seen\"\n{rest}\n"
    );
    fs::write(&script, text).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn at_most_two_walkers_run_at_once_and_each_summary_arrives() {
    use cloud_harness_mount::prewarm::Prewarm;
    let dir = tempfile::tempdir().unwrap();
    let summary = r#"{"entries":1,"files":0,"bytes":0,"errors":0,"cut_short":false,"took_ms":0}"#;
    let script = stand_in(
        dir.path(),
        &format!("sleep 0.3\nrmdir \"$2/run.$$\"\necho '{summary}'"),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let started: Vec<Prewarm> = (0..4)
        .map(|_| {
            let tx = tx.clone();
            Prewarm::start(&script, dir.path(), true, move |s| {
                tx.send(s.entries).unwrap()
            })
            .unwrap()
        })
        .collect();
    for _ in 0..4 {
        let entries = rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
        assert_eq!(entries, 1);
    }
    drop(started);
    let seen = fs::read_to_string(dir.path().join("seen")).unwrap();
    let counts: Vec<usize> = seen.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(counts.len(), 4, "{seen}");
    assert!(
        counts.iter().all(|&n| n <= 2),
        "walkers at once: {counts:?}"
    );
}

#[test]
fn dropping_a_prewarm_kills_its_walker() {
    use cloud_harness_mount::prewarm::Prewarm;
    let dir = tempfile::tempdir().unwrap();
    let script = stand_in(dir.path(), "exec sleep 60");
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let p = Prewarm::start(&script, dir.path(), true, move |s| {
        tx.send(s.entries).unwrap()
    })
    .unwrap();
    let begun = std::time::Instant::now();
    while !dir.path().join("seen").exists() {
        assert!(begun.elapsed().as_secs() < 30, "the walker never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(p);
    assert!(
        begun.elapsed().as_secs() < 30,
        "waited for the walker's end"
    );
    assert!(rx.try_recv().is_err(), "a killed walker gave a summary");
}

//! The store: canonical encoding, round trips, typed errors on bad input, verify and gc.

use cloud_harness_error::Code;
use cloud_harness_store::cas::{materialize, Digest, Limits, ObjectKind, Store};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

fn store(dir: &tempfile::TempDir) -> Store {
    Store::open(dir.path().join("store")).unwrap()
}

/// A sample tree: nested folders, an executable, an empty file, symlinks (relative, dangling,
/// a loop), and a file name git would sort differently from plain byte order.
fn sample(root: &Path, reverse: bool) {
    let mut ops: Vec<Box<dyn Fn()>> = vec![
        Box::new(|| fs::create_dir_all(root.join("skills/tdd/scripts")).unwrap()),
        Box::new(|| fs::create_dir_all(root.join("skills/review")).unwrap()),
        Box::new(|| fs::create_dir_all(root.join("a")).unwrap()),
    ];
    let files: Vec<(&str, &[u8], u32)> = vec![
        (
            "skills/tdd/SKILL.md",
            b"---\nname: tdd\ndescription: d\n---\n",
            0o644,
        ),
        ("skills/tdd/scripts/run.sh", b"#!/bin/sh\necho hi\n", 0o755),
        (
            "skills/review/SKILL.md",
            b"---\nname: review\ndescription: r\n---\n",
            0o644,
        ),
        ("skills/review/empty", b"", 0o644),
        ("a.md", b"dot sorts before slash", 0o644),
        ("a/inner", &[0u8, 1, 2, 255], 0o600),
        ("a0", b"zero", 0o700),
    ];
    if reverse {
        ops.reverse();
    }
    for op in &ops {
        op();
    }
    let ordered: Vec<_> = if reverse {
        files.into_iter().rev().collect()
    } else {
        files
    };
    for (path, bytes, mode) in ordered {
        let p = root.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, bytes).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
    symlink("../review/SKILL.md", root.join("skills/tdd/sibling.md")).unwrap();
    symlink("does/not/exist", root.join("dangling")).unwrap();
    symlink("loop-b", root.join("loop-a")).unwrap();
    symlink("loop-a", root.join("loop-b")).unwrap();
}

fn set_mtimes(root: &Path, when: SystemTime) {
    for entry in walk(root) {
        if !entry.is_symlink() {
            let f = fs::File::open(&entry).unwrap();
            f.set_modified(when).unwrap();
        }
    }
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(root).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out.sort();
    out
}

#[test]
fn same_tree_from_different_orders_and_mtimes_has_one_digest() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    sample(&one, false);
    sample(&two, true);
    set_mtimes(
        &one,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
    );
    set_mtimes(&two, SystemTime::now());
    let a = s.import_dir(&one, &Limits::default()).unwrap();
    let b = s.import_dir(&two, &Limits::default()).unwrap();
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.files, 11);

    // Any change of content, name, executable bit or link target changes the digest.
    fs::write(two.join("a0"), b"Zero").unwrap();
    let c = s.import_dir(&two, &Limits::default()).unwrap();
    assert_ne!(c.digest, a.digest);
    fs::write(two.join("a0"), b"zero").unwrap();
    fs::set_permissions(two.join("a0"), fs::Permissions::from_mode(0o644)).unwrap();
    assert_ne!(
        s.import_dir(&two, &Limits::default()).unwrap().digest,
        a.digest
    );
    fs::set_permissions(two.join("a0"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(
        s.import_dir(&two, &Limits::default()).unwrap().digest,
        a.digest
    );
    fs::remove_file(two.join("dangling")).unwrap();
    symlink("does/not/exist2", two.join("dangling")).unwrap();
    assert_ne!(
        s.import_dir(&two, &Limits::default()).unwrap().digest,
        a.digest
    );
}

#[test]
fn import_then_materialize_gives_back_bytes_modes_and_symlinks() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let src = tmp.path().join("src");
    sample(&src, false);
    let imported = s.import_dir(&src, &Limits::default()).unwrap();
    let out = tmp.path().join("out");
    materialize(&s, &imported.digest, &out).unwrap();

    let rel = |p: &Path, base: &Path| p.strip_prefix(base).unwrap().to_path_buf();
    let a: Vec<_> = walk(&src).iter().map(|p| rel(p, &src)).collect();
    let b: Vec<_> = walk(&out).iter().map(|p| rel(p, &out)).collect();
    assert_eq!(a, b);
    for path in &a {
        let (x, y) = (src.join(path), out.join(path));
        let (mx, my) = (
            fs::symlink_metadata(&x).unwrap(),
            fs::symlink_metadata(&y).unwrap(),
        );
        assert_eq!(mx.file_type(), my.file_type(), "{path:?}");
        if mx.is_symlink() {
            assert_eq!(fs::read_link(&x).unwrap(), fs::read_link(&y).unwrap());
        } else if mx.is_file() {
            assert_eq!(fs::read(&x).unwrap(), fs::read(&y).unwrap(), "{path:?}");
            // The executable bit is kept; other mode bits are normalized.
            let exec = mx.permissions().mode() & 0o111 != 0;
            let want = if exec { 0o755 } else { 0o644 };
            assert_eq!(my.permissions().mode() & 0o777, want, "{path:?}");
        }
    }
    // Materializing again onto an existing path is refused and changes nothing.
    let err = materialize(&s, &imported.digest, &out).unwrap_err();
    assert_eq!(err.code, Code::Conflict);
    // And the re-import of the materialized copy has the same digest.
    assert_eq!(
        s.import_dir(&out, &Limits::default()).unwrap().digest,
        imported.digest
    );
}

#[test]
fn materialize_of_a_corrupt_object_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let src = tmp.path().join("src");
    sample(&src, false);
    let imported = s.import_dir(&src, &Limits::default()).unwrap();
    let blob = s.object_path(ObjectKind::Blob, &Digest::of(b"zero"));
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&blob, b"evil").unwrap();
    let out = tmp.path().join("out");
    let err = materialize(&s, &imported.digest, &out).unwrap_err();
    assert_eq!(err.code, Code::Internal);
    assert!(err.message.contains("corrupt"), "{err}");
    assert!(!out.exists());
    let leftovers: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn assert_nothing_published(s: &Store) {
    let report = s.verify().unwrap();
    assert_eq!(
        (report.blobs, report.trees),
        (0, 0),
        "objects were published"
    );
    assert_eq!(
        fs::read_dir(s.root().join("tmp")).unwrap().count(),
        0,
        "temp files left"
    );
}

#[test]
fn a_fifo_is_an_error_naming_its_path_and_nothing_is_published() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("skills/x")).unwrap();
    fs::write(src.join("skills/x/SKILL.md"), "---\ndescription: x\n---\n").unwrap();
    nix::unistd::mkfifo(&src.join("skills/x/pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let err = s.import_dir(&src, &Limits::default()).unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(
        err.message.contains("skills/x/pipe") && err.message.contains("FIFO"),
        "{err}"
    );
    assert_nothing_published(&s);
}

#[test]
fn a_non_utf8_name_is_an_error_naming_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let name = std::ffi::OsStr::from_bytes(b"bad-\xff-name");
    fs::write(src.join(name), b"x").unwrap();
    let err = s.import_dir(&src, &Limits::default()).unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(
        err.message.contains("not valid UTF-8") && err.message.contains("bad-"),
        "{err}"
    );
    assert_nothing_published(&s);
}

#[test]
fn limits_are_typed_errors_naming_path_and_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("a/b/c")).unwrap();
    fs::write(src.join("big"), vec![7u8; 3 << 20]).unwrap();
    for i in 0..5 {
        fs::write(src.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let cases = [
        (
            Limits {
                max_file_bytes: 1 << 20,
                ..Limits::default()
            },
            "bytes per file",
        ),
        (
            Limits {
                max_files: 3,
                ..Limits::default()
            },
            "3 files",
        ),
        (
            Limits {
                max_bytes: 1000,
                ..Limits::default()
            },
            "1000 bytes in all",
        ),
        (
            Limits {
                max_depth: 2,
                ..Limits::default()
            },
            "2 levels",
        ),
    ];
    for (limits, needle) in cases {
        let err = s.import_dir(&src, &limits).unwrap_err();
        assert_eq!(err.code, Code::TooLarge, "{err}");
        assert!(err.message.contains(needle), "{err} should say {needle}");
        assert_nothing_published(&s);
    }
}

#[test]
fn folders_count_toward_the_entry_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let src = tmp.path().join("src");
    for i in 0..5 {
        fs::create_dir_all(src.join(format!("empty{i}"))).unwrap();
    }
    let limits = Limits {
        max_files: 3,
        ..Limits::default()
    };
    let err = s.import_dir(&src, &limits).unwrap_err();
    assert_eq!(err.code, Code::TooLarge, "{err}");
    assert!(err.message.contains("3 files and folders"), "{err}");
    assert_nothing_published(&s);
}

#[test]
fn a_root_that_is_a_symlink_loop_is_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    symlink("l2", tmp.path().join("l1")).unwrap();
    symlink("l1", tmp.path().join("l2")).unwrap();
    let err = s
        .import_dir(&tmp.path().join("l1"), &Limits::default())
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument, "{err}");
    let err = s
        .import_dir(&tmp.path().join("missing"), &Limits::default())
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound, "{err}");
}

/// One owner's folder of roots is read alone: a root elsewhere is not read (here, one that
/// does not hold a digest, which a listing of every root refuses), and the folder goes once
/// it is empty.
#[test]
fn a_folder_of_roots_is_read_and_removed_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let d = Digest::of(b"tree");
    s.set_root("workspaces/a/0", &d).unwrap();
    s.set_root("workspaces/a/1", &d).unwrap();
    s.set_root("workspaces/b/0", &d).unwrap();
    let elsewhere = tmp.path().join("store/roots/workspaces/b/1");
    fs::write(&elsewhere, "not a digest\n").unwrap();
    assert!(s.roots().is_err());
    let names = |folder: &str| -> Vec<String> {
        s.roots_in(folder)
            .unwrap()
            .into_iter()
            .map(|(name, digest)| {
                assert_eq!(digest, d);
                name
            })
            .collect()
    };
    assert_eq!(names("workspaces/a"), ["workspaces/a/0", "workspaces/a/1"]);
    assert!(names("workspaces/none").is_empty());
    assert!(s.roots_in("../elsewhere").is_err());

    let folder = tmp.path().join("store/roots/workspaces/a");
    s.remove_root("workspaces/a/0").unwrap();
    s.remove_root_folder("workspaces/a").unwrap();
    assert!(folder.is_dir(), "a folder still holding a root stays");
    s.remove_root("workspaces/a/1").unwrap();
    s.remove_root_folder("workspaces/a").unwrap();
    assert!(!folder.exists());
    s.remove_root_folder("workspaces/a").unwrap();
    assert!(names("workspaces/a").is_empty());
}

#[test]
fn verify_reports_every_corrupt_and_missing_object() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let src = tmp.path().join("src");
    sample(&src, false);
    let imported = s.import_dir(&src, &Limits::default()).unwrap();
    s.set_root("test/sample", &imported.digest).unwrap();
    assert!(s.verify().unwrap().problems.is_empty());

    let corrupt = s.object_path(ObjectKind::Blob, &Digest::of(b"zero"));
    fs::set_permissions(&corrupt, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&corrupt, b"zer0").unwrap();
    let missing = Digest::of(b"dot sorts before slash");
    fs::remove_file(s.object_path(ObjectKind::Blob, &missing)).unwrap();
    let tree_gone = s.tree(&imported.digest).unwrap();
    let skills = tree_gone.get("skills").unwrap().digest;
    fs::remove_file(s.object_path(ObjectKind::Tree, &skills)).unwrap();

    let report = s.verify().unwrap();
    let text: Vec<String> = report
        .problems
        .iter()
        .map(|p| format!("{:?} {} {}", p.problem, p.object, p.detail))
        .collect();
    let has = |kind: &str, d: &Digest| {
        text.iter()
            .any(|t| t.starts_with(kind) && t.contains(&d.to_string()))
    };
    assert!(has("Corrupt", &Digest::of(b"zero")), "{text:#?}");
    assert!(has("Missing", &missing), "{text:#?}");
    assert!(has("Missing", &skills), "{text:#?}");
    assert_eq!(report.problems.len(), 3, "{text:#?}");
}

#[test]
fn gc_keeps_what_roots_reach_and_young_objects() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let keep = tmp.path().join("keep");
    let drop = tmp.path().join("drop");
    fs::create_dir_all(&keep).unwrap();
    fs::create_dir_all(&drop).unwrap();
    fs::write(keep.join("k"), b"kept content").unwrap();
    fs::write(drop.join("d"), b"dropped content").unwrap();
    let kept = s.import_dir(&keep, &Limits::default()).unwrap();
    let dropped = s.import_dir(&drop, &Limits::default()).unwrap();
    s.set_root("workspace/w1", &kept.digest).unwrap();
    fs::write(s.root().join("tmp/stale-temp"), b"half").unwrap();

    // Within the grace period nothing goes.
    let report = s.gc(Duration::from_secs(3600)).unwrap();
    assert_eq!(report.removed, 0);
    assert!(s.contains(ObjectKind::Tree, &dropped.digest));

    let report = s.gc(Duration::ZERO).unwrap();
    assert_eq!(report.removed, 2, "{report:?}"); // the unrooted tree and its blob
    assert_eq!(report.removed_temp, 1);
    assert!(!s.contains(ObjectKind::Tree, &dropped.digest));
    assert!(!s.contains(ObjectKind::Blob, &Digest::of(b"dropped content")));
    assert!(s.contains(ObjectKind::Tree, &kept.digest));
    assert!(s.contains(ObjectKind::Blob, &Digest::of(b"kept content")));
    assert!(s.verify().unwrap().problems.is_empty());

    // Reusing an old object refreshes it, so the grace period protects it again.
    s.remove_root("workspace/w1").unwrap();
    let old = SystemTime::now() - Duration::from_secs(7200);
    for kind in [ObjectKind::Tree, ObjectKind::Blob] {
        let d = if kind == ObjectKind::Tree {
            kept.digest
        } else {
            Digest::of(b"kept content")
        };
        fs::File::open(s.object_path(kind, &d))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    s.import_dir(&keep, &Limits::default()).unwrap();
    assert_eq!(s.gc(Duration::from_secs(3600)).unwrap().removed, 0);
}

#[test]
fn concurrent_writers_of_the_same_objects_all_succeed() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(&tmp);
    let src = tmp.path().join("src");
    sample(&src, false);
    for i in 0..50 {
        fs::write(
            src.join(format!("file{i}")),
            format!("content {i}").repeat(100),
        )
        .unwrap();
    }
    let digests: Vec<Digest> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                let src = src.clone();
                scope.spawn(move || s.import_dir(&src, &Limits::default()).unwrap().digest)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(digests.windows(2).all(|w| w[0] == w[1]));
    let report = s.verify().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(fs::read_dir(s.root().join("tmp")).unwrap().count(), 0);
}

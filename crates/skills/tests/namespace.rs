//! The filesystem logic without the kernel: what each handler's function returns.

use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::generation::{Generation, View};
use cloud_harness_skills::namespace::{
    FileKind, Invalidation, Namespace, Reach, RESOLUTION_FILE, ROOT_INO, TIERS_DIR,
};
use cloud_harness_skills::resolver::Tier;
use cloud_harness_skills::stack::StackSpec;
use cloud_harness_store::cas::Store;
use nix::errno::Errno;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn skill(root: &Path, name: &str, body: &str) {
    let dir = root.join(name);
    fs::create_dir_all(dir.join("refs")).unwrap();
    fs::write(
        dir.join("SKILL.md"),
        format!("---\nname: {name}\ndescription: d\n---\n{body}\n"),
    )
    .unwrap();
    fs::write(dir.join("refs/notes.md"), format!("notes of {name}")).unwrap();
}

struct Setup {
    _tmp: tempfile::TempDir,
    store: Store,
    spec: StackSpec,
    owner: PathBuf,
    ws: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let (owner, ws) = (tmp.path().join("owner"), tmp.path().join("ws"));
    skill(&owner, "tdd", "owner tdd");
    skill(&ws, "tdd", "ws tdd");
    skill(&ws, "lint", "ws lint");
    let store = Store::open(tmp.path().join("store")).unwrap();
    let spec = StackSpec {
        dirs: vec![(Tier::Owner, owner.clone()), (Tier::Workspace, ws.clone())],
        ..StackSpec::default()
    };
    Setup {
        _tmp: tmp,
        store,
        spec,
        owner,
        ws,
    }
}

impl Setup {
    fn generation(&self) -> Arc<Generation> {
        Arc::new(
            self.spec
                .generation(&self.store, &SkillCache::default())
                .unwrap(),
        )
    }
}

fn path(ns: &Namespace, parts: &[&str]) -> u64 {
    parts.iter().fold(ROOT_INO, |dir, p| {
        ns.lookup(dir, p)
            .unwrap()
            .unwrap_or_else(|| panic!("no {p}"))
            .ino
    })
}

fn names(ns: &Namespace, dir: u64) -> Vec<String> {
    let (listing, start) = ns.listing_at(dir, 0).unwrap();
    assert_eq!(start, 0);
    listing.children.iter().map(|c| c.name.clone()).collect()
}

#[test]
fn lookups_listings_and_reads_follow_the_tiers() {
    let s = setup();
    let ns = Namespace::new(s.store.clone(), View::Merged, s.generation());
    assert_eq!(
        names(&ns, ROOT_INO),
        [RESOLUTION_FILE, TIERS_DIR, "lint", "tdd"]
    );
    let tdd_md = path(&ns, &["tdd", "SKILL.md"]);
    let text = ns.read(tdd_md, 0, 4096).unwrap();
    assert!(String::from_utf8(text).unwrap().contains("owner tdd"));
    let ws_md = path(&ns, &[TIERS_DIR, "workspace", "tdd", "SKILL.md"]);
    assert!(String::from_utf8(ns.read(ws_md, 0, 4096).unwrap())
        .unwrap()
        .contains("ws tdd"));
    assert_eq!(names(&ns, path(&ns, &[TIERS_DIR])), ["owner", "workspace"]);

    // Reads past the end, partial reads, a missing name, a file as a directory.
    let size = ns.getattr(tdd_md).unwrap().size;
    assert_eq!(ns.read(tdd_md, size, 10).unwrap(), b"");
    assert_eq!(ns.read(tdd_md, 4, 3).unwrap(), b"nam");
    assert_eq!(ns.lookup(ROOT_INO, "nope").unwrap(), None);
    assert_eq!(ns.lookup(tdd_md, "x"), Err(Errno::ENOTDIR));
    assert_eq!(ns.read(path(&ns, &["tdd"]), 0, 1), Err(Errno::EISDIR));
    assert_eq!(
        ns.getattr(path(&ns, &["tdd", "refs"])).unwrap().kind,
        FileKind::Directory
    );

    let xattrs = ns.xattrs(tdd_md).unwrap();
    let get = |k: &str| {
        xattrs
            .iter()
            .find(|(n, _)| n == &format!("user.cloud-harness.{k}"))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("tier").as_deref(), Some("owner"));
    assert!(get("source").unwrap().starts_with("owner:"));
}

#[test]
fn a_new_generation_keeps_directory_inodes_and_renumbers_changed_files() {
    let s = setup();
    let ns = Namespace::new(s.store.clone(), View::Merged, s.generation());
    let lint_dir = path(&ns, &["lint"]);
    let lint_md = path(&ns, &["lint", "SKILL.md"]);
    let lint_notes = path(&ns, &["lint", "refs", "notes.md"]);
    let refs = path(&ns, &["lint", "refs"]);
    assert_eq!(ns.lookup(ROOT_INO, "fresh").unwrap(), None);

    skill(&s.ws, "lint", "ws lint v2"); // SKILL.md changes, refs/notes.md does not
    skill(&s.ws, "fresh", "new");
    fs::remove_dir_all(s.owner.join("tdd")).unwrap(); // tdd now comes from the workspace
    let inv = ns.set_generation(s.generation());

    let entry = |parent: u64, name: &str| Invalidation::Entry {
        parent,
        name: name.into(),
    };
    assert!(inv.contains(&entry(lint_dir, "SKILL.md")), "{inv:?}");
    assert!(
        inv.contains(&entry(ROOT_INO, "fresh")),
        "the negative entry must go: {inv:?}"
    );
    assert!(
        inv.contains(&Invalidation::Inode { ino: ROOT_INO }),
        "{inv:?}"
    );
    assert!(
        !inv.contains(&entry(refs, "notes.md")),
        "unchanged files stay cached: {inv:?}"
    );

    assert_eq!(
        path(&ns, &["lint"]),
        lint_dir,
        "directory inodes are stable"
    );
    assert_eq!(
        path(&ns, &["lint", "refs", "notes.md"]),
        lint_notes,
        "unchanged file, same inode"
    );
    let new_md = path(&ns, &["lint", "SKILL.md"]);
    assert_ne!(new_md, lint_md, "changed content, new inode");
    assert!(String::from_utf8(ns.read(new_md, 0, 4096).unwrap())
        .unwrap()
        .contains("v2"));
    // The old inode still reads the old bytes until the kernel forgets it.
    assert!(String::from_utf8(ns.read(lint_md, 0, 4096).unwrap())
        .unwrap()
        .contains("ws lint\n"));
    assert!(
        String::from_utf8(ns.read(path(&ns, &["tdd", "SKILL.md"]), 0, 4096).unwrap())
            .unwrap()
            .contains("ws tdd")
    );
}

#[test]
fn forgotten_nodes_are_dropped_so_memory_follows_the_kernel() {
    let s = setup();
    let ns = Namespace::new(s.store.clone(), View::Merged, s.generation());
    let base = ns.node_count();
    let md = path(&ns, &["tdd", "SKILL.md"]); // one reference to tdd and one to SKILL.md
    let dir = path(&ns, &["tdd"]); // tdd: two
    ns.lookup(dir, "SKILL.md").unwrap(); // SKILL.md: two
    assert_eq!(ns.node_count(), base + 2);
    ns.forget(md, 1);
    assert_eq!(ns.node_count(), base + 2);
    ns.forget(md, 1);
    ns.forget(dir, 1);
    assert_eq!(ns.node_count(), base + 1);
    ns.forget(dir, 1);
    assert_eq!(ns.node_count(), base);
    assert_eq!(ns.getattr(md), Err(Errno::ENOENT));
    ns.forget(ROOT_INO, 100);
    assert!(ns.getattr(ROOT_INO).is_ok(), "the root is never forgotten");
}

#[test]
fn one_tier_alone_at_the_root() {
    let s = setup();
    let ns = Namespace::new(s.store.clone(), View::Tier(Tier::Workspace), s.generation());
    assert_eq!(names(&ns, ROOT_INO), ["lint", "tdd"]);
    assert_eq!(ns.lookup(ROOT_INO, TIERS_DIR).unwrap(), None);
}

#[test]
fn a_path_read_follows_links_inside_the_mount_and_remembers_nothing() {
    let s = setup();
    std::os::unix::fs::symlink("../../lint/refs/notes.md", s.owner.join("tdd/refs/lint.md"))
        .unwrap();
    std::os::unix::fs::symlink("loop.md", s.owner.join("tdd/loop.md")).unwrap();
    std::os::unix::fs::symlink("../../../x", s.owner.join("tdd/out.md")).unwrap();
    let ns = Namespace::new(s.store.clone(), View::Merged, s.generation());
    let before = ns.node_count();

    let (size, bytes) = ns
        .read_path(&["tdd", "SKILL.md"], 0, 1 << 20)
        .unwrap()
        .unwrap();
    assert!(String::from_utf8(bytes.clone())
        .unwrap()
        .contains("owner tdd"));
    assert_eq!(size, bytes.len() as u64);
    // A page: offset and length.
    let (_, page) = ns.read_path(&["tdd", "SKILL.md"], 4, 3).unwrap().unwrap();
    assert_eq!(page, bytes[4..7]);
    // The owner's tdd links to the workspace's lint: one mount, one answer.
    let (_, linked) = ns
        .read_path(&["tdd", "refs", "lint.md"], 0, 100)
        .unwrap()
        .unwrap();
    assert_eq!(linked, b"notes of lint");
    assert_eq!(ns.read_path(&["tdd", "nope.md"], 0, 10), Ok(None));
    assert_eq!(ns.read_path(&["nope", "SKILL.md"], 0, 10), Ok(None));
    assert_eq!(ns.read_path(&["tdd", "SKILL.md", "x"], 0, 10), Ok(None));
    assert_eq!(ns.read_path(&["tdd", "out.md"], 0, 10), Ok(None));
    assert_eq!(ns.read_path(&["tdd", "refs"], 0, 10), Err(Errno::EISDIR));
    assert_eq!(ns.read_path(&["tdd", "loop.md"], 0, 10), Err(Errno::ELOOP));
    let (_, resolution) = ns
        .read_path(&[RESOLUTION_FILE], 0, 1 << 20)
        .unwrap()
        .unwrap();
    assert_eq!(resolution, ns.generation().resolution_json.to_vec());
    assert_eq!(
        ns.node_count(),
        before,
        "reads without the kernel hold no nodes"
    );
}

/// A file's digest and size come from the trees alone, links followed as a read follows
/// them: the file's bytes are not read (its object may be gone, and it still answers), so a
/// listing of many links to one large file costs no read of it.
#[test]
fn a_path_stat_follows_links_and_reads_no_file() {
    use cloud_harness_store::cas::{Digest, ObjectKind};
    let s = setup();
    let big = vec![b'x'; 1 << 20];
    fs::write(s.owner.join("tdd/refs/big.bin"), &big).unwrap();
    std::os::unix::fs::symlink("../refs/big.bin", s.owner.join("tdd/refs/link.bin")).unwrap();
    std::os::unix::fs::symlink("loop.md", s.owner.join("tdd/loop.md")).unwrap();
    let ns = Namespace::new(s.store.clone(), View::Merged, s.generation());
    let digest = Digest::of(&big);
    fs::remove_file(s.store.object_path(ObjectKind::Blob, &digest)).unwrap();
    assert_eq!(
        ns.stat_path(&["tdd", "refs", "link.bin"]),
        Ok(Some((digest, big.len() as u64)))
    );
    assert_eq!(
        ns.stat_path(&["tdd", "refs", "big.bin"]),
        Ok(Some((digest, big.len() as u64)))
    );
    assert_eq!(
        ns.read_path(&["tdd", "refs", "link.bin"], 0, 10),
        Err(Errno::EIO),
        "a read needs the object"
    );
    assert_eq!(ns.stat_path(&["tdd", "nope.md"]), Ok(None));
    assert_eq!(ns.stat_path(&[RESOLUTION_FILE]), Ok(None));
    assert_eq!(ns.stat_path(&["tdd", "refs"]), Err(Errno::EISDIR));
    assert_eq!(ns.stat_path(&["tdd", "loop.md"]), Err(Errno::ELOOP));
}

#[test]
fn a_readdir_offset_goes_on_in_its_own_listing_and_a_lost_one_is_estale() {
    let s = setup();
    let ns = Namespace::new(s.store.clone(), View::Merged, s.generation());
    let (first, _) = ns.listing_at(ROOT_INO, 0).unwrap();
    let names_of = |l: &cloud_harness_skills::namespace::Listing| -> Vec<String> {
        l.children.iter().map(|c| c.name.clone()).collect()
    };
    let before = names_of(&first);
    assert!(before.contains(&"lint".to_owned()));
    // A reader has read ".", ".." and one entry; the root changes under it.
    let offset = first.cookie(3);
    skill(&s.ws, "zeta", "new");
    ns.set_generation(s.generation());
    let (now, start) = ns.listing_at(ROOT_INO, 0).unwrap();
    assert_eq!(start, 0);
    assert!(names_of(&now).contains(&"zeta".to_owned()));
    let (kept, start) = ns.listing_at(ROOT_INO, offset).unwrap();
    assert_eq!(start, 3, "the position is the cookie's");
    assert_eq!(
        names_of(&kept),
        before,
        "the reader keeps the listing it started"
    );
    assert_ne!(
        kept.cookie(3),
        now.cookie(3),
        "two listings never share an offset"
    );

    // With the old listing pushed out of the namespace's memory, the reader is told its
    // listing is gone; a folder that did not change goes on from its current listing.
    let tdd = path(&ns, &["tdd"]);
    let (unchanged, _) = ns.listing_at(tdd, 0).unwrap();
    let unchanged_offset = unchanged.cookie(2);
    for i in 0..100 {
        skill(&s.ws, &format!("filler-{i}"), "x");
        let g = s.generation();
        ns.set_generation(g);
        ns.listing_at(ROOT_INO, 0).unwrap();
    }
    assert_eq!(ns.listing_at(ROOT_INO, offset).unwrap_err(), Errno::ESTALE);
    let (again, start) = ns.listing_at(tdd, unchanged_offset).unwrap();
    assert_eq!((names_of(&again), start), (names_of(&unchanged), 2));
    // A file is not a directory.
    let file = path(&ns, &["tdd", "SKILL.md"]);
    assert_eq!(ns.listing_at(file, 0).unwrap_err(), Errno::ENOTDIR);
}

/// A store object is hashed once per process, whichever mount reads it first (two workspaces
/// of one toolkit pay one hash); a file changed on disk since is hashed again and, no longer
/// matching its digest, refused. (Counted on this test's thread: the other tests of the
/// process read objects beside it under `cargo test`.)
#[test]
fn a_blob_is_hashed_once_per_process_and_again_once_changed() {
    use cloud_harness_store::cas::{Digest, ObjectKind};
    use cloud_harness_store::stats::this_thread;
    use std::os::unix::fs::PermissionsExt;
    let s = setup();
    let g = s.generation();
    // File times are coarse: what was written within the last second is hashed on every read.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let counts = || {
        let reads = this_thread();
        (reads.hashed, reads.trusted)
    };
    // A new mount of the process reads lint's SKILL.md: its text, or the errno, and how many
    // objects that read hashed and trusted.
    let read_in_new_mount = || {
        let ns = Namespace::new(s.store.clone(), View::Merged, g.clone());
        let md = path(&ns, &["lint", "SKILL.md"]);
        let before = counts();
        let text = ns.read(md, 0, 4096).map(|t| String::from_utf8(t).unwrap());
        let after = counts();
        (text, after.0 - before.0, after.1 - before.1)
    };
    let (text, hashed, trusted) = read_in_new_mount();
    assert!(text.unwrap().contains("ws lint"));
    assert_eq!((hashed, trusted), (1, 0), "the first read hashes");
    let (text, hashed, trusted) = read_in_new_mount();
    assert!(text.unwrap().contains("ws lint"));
    assert_eq!(
        (hashed, trusted),
        (0, 0),
        "another mount reads the object the first left open"
    );

    // The object is rewritten on disk, same length, other bytes.
    let ns = Namespace::new(s.store.clone(), View::Merged, g.clone());
    let digest = (ns.xattrs(path(&ns, &["lint", "SKILL.md"])).unwrap())
        .into_iter()
        .find(|(k, _)| k == "user.cloud-harness.digest")
        .map(|(_, v)| Digest::parse(&v).unwrap())
        .unwrap();
    let object = s.store.object_path(ObjectKind::Blob, &digest);
    let mut bytes = fs::read(&object).unwrap();
    bytes[0] ^= 1;
    fs::set_permissions(&object, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&object, &bytes).unwrap();
    let (refused, hashed, trusted) = read_in_new_mount();
    assert_eq!(refused, Err(Errno::EIO));
    assert_eq!((hashed, trusted), (1, 0), "a changed file is hashed again");
}

/// Descriptors open on `path`, in this process.
fn open_on(path: &Path) -> usize {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == path))
        .count()
}

/// Views (a runner's workspaces) serving the same bundle share one open descriptor per object,
/// and the objects held open are bounded in all, whatever the number of views.
#[test]
fn views_share_one_descriptor_per_object_and_the_objects_held_are_bounded() {
    use cloud_harness_skills::namespace::blobs;
    use cloud_harness_store::cas::{Digest, ObjectKind};
    let s = setup();
    let g = s.generation();
    let views: Vec<Namespace> = (0..300)
        .map(|_| Namespace::new(s.store.clone(), View::Merged, g.clone()))
        .collect();
    for ns in &views {
        let text = ns.read(path(ns, &["lint", "SKILL.md"]), 0, 4096).unwrap();
        assert!(String::from_utf8(text).unwrap().contains("ws lint"));
    }
    let ns = &views[0];
    let digest = (ns.xattrs(path(ns, &["lint", "SKILL.md"])).unwrap())
        .into_iter()
        .find(|(k, _)| k == "user.cloud-harness.digest")
        .map(|(_, v)| Digest::parse(&v).unwrap())
        .unwrap();
    let object = s.store.object_path(ObjectKind::Blob, &digest);
    assert_eq!(open_on(&object), 1, "300 views, one descriptor");

    // More distinct files than the bound, read through ten views (ten caches of their own
    // would have held 2,560).
    let many = s.ws.join("many");
    fs::create_dir_all(many.join("refs")).unwrap();
    fs::write(
        many.join("SKILL.md"),
        "---\nname: many\ndescription: d\n---\nmany\n",
    )
    .unwrap();
    for i in 0..blobs::HELD + 100 {
        fs::write(many.join(format!("refs/{i}.md")), format!("file {i}")).unwrap();
    }
    let g = s.generation();
    let views: Vec<Namespace> = (0..10)
        .map(|_| Namespace::new(s.store.clone(), View::Merged, g.clone()))
        .collect();
    for i in 0..blobs::HELD + 100 {
        let ns = &views[i % views.len()];
        let name = format!("{i}.md");
        let bytes = ns
            .read_path(&["many", "refs", name.as_str()], 0, 100)
            .unwrap()
            .unwrap()
            .1;
        assert_eq!(bytes, format!("file {i}").as_bytes());
    }
    assert!(blobs::held() <= blobs::HELD, "{} held", blobs::held());
    let objects = fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|fd| fs::read_link(fd.path()).is_ok_and(|t| t.starts_with(s.store.root())))
        .count();
    assert!(objects <= blobs::HELD, "{objects} store files open");
}

/// A read from what the namespace holds (for a thread that must not wait on a disk) reads
/// nothing from the store: before a file was read it says EWOULDBLOCK, after it gives what a
/// read from the store gives; a folder it holds answers for names it lacks.
#[test]
fn a_held_read_answers_from_what_earlier_reads_left_and_never_from_the_store() {
    let s = setup();
    let ns = Namespace::new(s.store.clone(), View::Merged, s.generation());
    let skill = ["tdd", "SKILL.md"];
    assert_eq!(
        ns.read_path_reaching(&skill, 0, 100, Reach::Held),
        Err(Errno::EWOULDBLOCK)
    );
    let stored = ns.read_path(&skill, 0, 100).unwrap().unwrap();
    assert!(String::from_utf8_lossy(&stored.1).contains("owner tdd"));
    assert_eq!(
        ns.read_path_reaching(&skill, 0, 100, Reach::Held)
            .unwrap()
            .unwrap(),
        stored
    );
    let (_, page) = ns
        .read_path_reaching(&skill, 4, 3, Reach::Held)
        .unwrap()
        .unwrap();
    assert_eq!(page, stored.1[4..7]);
    assert_eq!(
        ns.read_path_reaching(&["tdd", "nope.md"], 0, 10, Reach::Held),
        Ok(None)
    );
    // A folder not read yet, and a file of a held folder whose blob was never opened.
    let notes = ["tdd", "refs", "notes.md"];
    assert_eq!(
        ns.read_path_reaching(&notes, 0, 100, Reach::Held),
        Err(Errno::EWOULDBLOCK)
    );
    let (_, bytes) = ns.read_path(&notes, 0, 100).unwrap().unwrap();
    assert_eq!(bytes, b"notes of tdd");
    assert_eq!(
        ns.read_path_reaching(&notes, 0, 100, Reach::Held)
            .unwrap()
            .unwrap()
            .1,
        bytes
    );
    std::os::unix::fs::symlink("notes.md", s.owner.join("tdd/refs/link.md")).unwrap();
    let ns = Namespace::new(s.store.clone(), View::Merged, s.generation());
    ns.read_path(&["tdd", "refs", "link.md"], 0, 100)
        .unwrap()
        .unwrap();
    // A link's target is a blob of the store, read each time.
    assert_eq!(
        ns.read_path_reaching(&["tdd", "refs", "link.md"], 0, 100, Reach::Held),
        Err(Errno::EWOULDBLOCK)
    );
}

/// The first read of a file in a mount checks its blob and answers from the bytes it checked
/// (a small blob is read whole, a large one hashed as a stream, then read where asked): any
/// offset and length gives the file's own bytes either way.
#[test]
fn a_first_read_anywhere_in_a_small_or_large_file_gives_its_bytes() {
    let s = setup();
    let content = |n: usize, seed: u8| -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    };
    let small = content(5000, 7);
    let large = content(300 << 10, 11);
    fs::write(s.owner.join("tdd/refs/small.bin"), &small).unwrap();
    fs::write(s.owner.join("tdd/refs/large.bin"), &large).unwrap();
    let g = s.generation();
    for (name, bytes) in [("small.bin", &small), ("large.bin", &large)] {
        let len = bytes.len() as u64;
        for (offset, size) in [(0, 4096), (1, 100), (4000, 4096), (len - 1, 10), (len, 10)] {
            // A new mount each time: no open blob kept from the read before.
            let ns = Namespace::new(s.store.clone(), View::Merged, g.clone());
            let ino = path(&ns, &["tdd", "refs", name]);
            let start = (offset as usize).min(bytes.len());
            let end = (start + size as usize).min(bytes.len());
            assert_eq!(
                ns.read(ino, offset, size).unwrap(),
                &bytes[start..end],
                "{name} at {offset}, {size} bytes"
            );
        }
    }
}

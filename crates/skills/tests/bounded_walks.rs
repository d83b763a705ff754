//! Wide folders cost what their bounds allow, never what they hold: a walk, an import of a
//! project's folder and a removal read a folder's entries as they go (a folder of ten million
//! entries is never listed whole in memory), and an import counts every entry it lists
//! against its limit, what it leaves out included. Memory is measured by an allocator that
//! counts what the measuring thread holds.

use cloud_harness_error::Code;
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::resolver::Tier;
use cloud_harness_skills::stack::dir_source;
use cloud_harness_store::cas::{Limits, Store, MAX_LEFT_OUT};
use cloud_harness_store::walk::{self, Bounds, Cut, Step};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

/// Counts the bytes each thread holds, and the most it held.
struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    let _ = HELD.try_with(|held| {
        let now = held.get() + delta;
        held.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most `f` held at once on this thread beyond what was held before it, in bytes.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, isize) {
    let base = HELD.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

/// Entries of the wide folders: their listing, held whole, would take megabytes.
const WIDE: usize = 60_000;
/// What a bounded walk of them may hold: a few folders' worth of names and paths.
const SMALL: isize = 256 << 10;

/// A scratch folder on a memory file system where there is one (making 60,000 entries on a
/// disk takes seconds).
fn scratch() -> tempfile::TempDir {
    match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap(),
        false => tempfile::tempdir().unwrap(),
    }
}

fn fifos(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        nix::unistd::mkfifo(&dir.join(format!("p{i}")), nix::sys::stat::Mode::S_IRWXU).unwrap();
    }
}

fn files(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        std::fs::File::create(dir.join(format!("f{i}"))).unwrap();
    }
}

/// A project whose skill `x` holds `n` FIFOs besides its `SKILL.md` (what `mkfifo` in a loop
/// makes).
fn fifo_project(tmp: &Path, n: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let project = tmp.join("project");
    let x = project.join(".agents/skills/x");
    fifos(&x, n);
    std::fs::write(x.join("SKILL.md"), "---\ndescription: fine\n---\n").unwrap();
    (project.clone(), project.join(".agents/skills"))
}

#[test]
fn fifos_count_against_a_projects_limit_and_are_never_held_whole() {
    let tmp = scratch();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let (project, skills) = fifo_project(tmp.path(), Limits::PROJECT.max_files as usize + 10);
    let cache = SkillCache::default();
    // The process's caches made first (each takes what it may hold at once).
    let warm = tmp.path().join("warm");
    std::fs::create_dir_all(&warm).unwrap();
    std::fs::write(warm.join("f"), "x").unwrap();
    store.import_dir(&warm, &Limits::PROJECT).unwrap();
    let (made, peak) =
        peak_of(|| dir_source(&store, &cache, Tier::Repository, &skills, Some(&project)));
    let err = made.expect_err("more entries than the limit are refused");
    assert_eq!(err.code, Code::TooLarge, "{err}");
    assert!(
        err.message
            .contains("more than the limit of 20000 files and folders"),
        "{err}"
    );
    assert!(!err.message.contains(tmp.path().to_str().unwrap()), "{err}");
    assert!(peak < SMALL, "the import held {peak} bytes");
}

#[test]
fn what_is_left_out_is_named_up_to_a_bound_then_counted() {
    let tmp = scratch();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let (project, skills) = fifo_project(tmp.path(), 500);
    let cache = SkillCache::default();
    let source = dir_source(&store, &cache, Tier::Repository, &skills, Some(&project)).unwrap();
    let said = &source.discovery.warnings;
    let fifos = said.iter().filter(|w| w.contains("a FIFO is not")).count();
    assert_eq!(fifos, MAX_LEFT_OUT, "{said:?}");
    let more: Vec<&String> = said.iter().filter(|w| w.contains("more entries")).collect();
    assert_eq!(more.len(), 1, "{said:?}");
    assert!(
        more[0].contains("the project's .agents/skills: 400 more entries"),
        "{}",
        more[0]
    );
    assert_eq!(source.discovery.skills.len(), 1);

    let imported = store.import_dir(&skills, &Limits::PROJECT).unwrap();
    assert_eq!(
        (imported.left_out.len(), imported.left_out_more),
        (MAX_LEFT_OUT, 400)
    );
}

#[test]
fn a_walk_reads_no_more_of_a_folder_than_its_budget() {
    let tmp = scratch();
    let root = tmp.path().join("root");
    files(&root.join("wide"), WIDE);
    let bounds = Bounds {
        depth: 8,
        entries: 1_000,
    };
    let fd = cloud_harness_store::cas::open_dir(&root).unwrap();
    let (cuts, peak) = peak_of(|| walk::folders(fd, bounds, |_| Step::Enter));
    assert_eq!(cuts, [Cut::TooMany("wide".into())]);
    assert!(peak < SMALL, "the walk held {peak} bytes");
}

#[test]
fn a_removal_holds_no_listing_of_a_wide_folder() {
    let tmp = scratch();
    let root = tmp.path().join("root");
    files(&root.join("wide"), WIDE);
    let ((), peak) = peak_of(|| cloud_harness_store::removal::remove_tree(&root).unwrap());
    assert!(!root.exists());
    assert!(peak < SMALL, "the removal held {peak} bytes");
}

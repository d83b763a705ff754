//! The skills mount against a tmpfs copy of the same merged tree and against Debian's mergerfs
//! over the same tier folders, in one run: warm, first (right after mounting: a new daemon
//! and a new mergerfs, the disk cache warm) and cold (the kernel's caches dropped). The walk and
//! the small reads are also timed first with the reader and both daemons on one CPU: what a
//! round trip costs when no request or answer has to wake a thread on another CPU.
//!
//! `cargo bench --bench mount` (root, /dev/fuse, fuse3 and mergerfs; `.ci/setup` installs them).
//! BENCH_RUNS sets the runs per figure (default 9 warm, 5 first and cold); figures are medians.

use cloud_harness::cli::tiers::TierArgs;
use cloud_harness_skills::discovery::SkillCache;
use cloud_harness_skills::generation::View;
use cloud_harness_store::cas::{materialize, Store};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-harness");
const SKILLS: usize = 2000; // x 5 files = the 10,000-file tree
const BIG_DIR: usize = 10_000;
const BIG_FILE: usize = 64 << 20;
const MISSING: usize = 10_000;
/// Missing folders looked into (`missing-N/SKILL.md`), each this many times.
const MISSING_DIRS: usize = 1_000;
const MISSING_REPEATS: usize = 10;

struct Rng(u64);
impl Rng {
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                (self.0 >> 24) as u8
            })
            .collect()
    }
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// Owner: 2,000 skills of 5 files, a skill with a 10,000-entry folder, one with a 64 MiB
/// file. Workspace: 500 of the same names (shadowed) and 200 of its own.
fn make_tiers(root: &Path) -> (PathBuf, PathBuf) {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let (owner, ws) = (root.join("owner"), root.join("workspace"));
    let skill_md = |name: &str, who: &str| {
        format!("---\nname: {name}\ndescription: {name} of the {who}\n---\n# {name}\n")
    };
    for i in 0..SKILLS {
        let dir = owner.join(format!("skill-{i:04}"));
        write(
            &dir.join("SKILL.md"),
            skill_md(&format!("skill-{i:04}"), "owner").as_bytes(),
        );
        write(&dir.join("references/guide.md"), &rng.bytes(4096));
        write(&dir.join("references/api.md"), &rng.bytes(2048));
        write(&dir.join("scripts/run.sh"), &rng.bytes(1024));
        write(&dir.join("assets/template.txt"), &rng.bytes(4096));
    }
    let big_dir = owner.join("big-dir");
    write(
        &big_dir.join("SKILL.md"),
        skill_md("big-dir", "owner").as_bytes(),
    );
    for i in 0..BIG_DIR {
        write(
            &big_dir.join(format!("entries/entry-{i:05}.md")),
            format!("entry {i}\n").as_bytes(),
        );
    }
    let big_file = owner.join("big-file");
    write(
        &big_file.join("SKILL.md"),
        skill_md("big-file", "owner").as_bytes(),
    );
    write(&big_file.join("assets/model.bin"), &rng.bytes(BIG_FILE));
    for i in 0..500 {
        let name = format!("skill-{:04}", i * 4);
        write(
            &ws.join(&name).join("SKILL.md"),
            skill_md(&name, "workspace").as_bytes(),
        );
    }
    for i in 0..200 {
        let name = format!("ws-skill-{i:03}");
        write(
            &ws.join(&name).join("SKILL.md"),
            skill_md(&name, "workspace").as_bytes(),
        );
        write(
            &ws.join(&name).join("references/notes.md"),
            &rng.bytes(3000),
        );
    }
    (owner, ws)
}

fn is_mounted(mountpoint: &Path) -> bool {
    let real = mountpoint.canonicalize().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(real.to_str().unwrap()))
}

fn wait_mounted(mountpoint: &Path) {
    let start = Instant::now();
    while !is_mounted(mountpoint) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} never mounted",
            mountpoint.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn drop_caches() {
    nix::unistd::sync();
    fs::write("/proc/sys/vm/drop_caches", "3").expect("dropping caches needs root");
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

struct Workload {
    files: Vec<PathBuf>,
    small: Vec<PathBuf>,
    missing: Vec<PathBuf>,
    missing_dirs: Vec<PathBuf>,
    big_dir: PathBuf,
    big_file: PathBuf,
}

fn workload() -> Workload {
    let mut files = Vec::new();
    let mut small = Vec::new();
    for i in 0..SKILLS {
        let s = PathBuf::from(format!("skill-{i:04}"));
        for f in [
            "SKILL.md",
            "references/guide.md",
            "references/api.md",
            "scripts/run.sh",
            "assets/template.txt",
        ] {
            files.push(s.join(f));
        }
        small.push(s.join("assets/template.txt"));
    }
    let missing = (0..MISSING)
        .map(|i| PathBuf::from(format!("skill-{:04}/missing-{i}.md", i % SKILLS)))
        .collect();
    let missing_dirs = (0..MISSING_DIRS)
        .map(|i| PathBuf::from(format!("missing-{i}/SKILL.md")))
        .collect();
    Workload {
        files,
        small,
        missing,
        missing_dirs,
        big_dir: PathBuf::from("big-dir/entries"),
        big_file: PathBuf::from("big-file/assets/model.bin"),
    }
}

type Metric = (&'static str, fn(&Path, &Workload) -> Duration);

fn stat_all(root: &Path, w: &Workload) -> Duration {
    let t = Instant::now();
    for f in &w.files {
        std::hint::black_box(fs::symlink_metadata(root.join(f)).unwrap());
    }
    t.elapsed()
}

fn small_reads(root: &Path, w: &Workload) -> Duration {
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    for f in &w.small {
        let mut file = fs::File::open(root.join(f)).unwrap();
        file.read_exact(&mut buf).unwrap();
    }
    t.elapsed()
}

fn ls_l(root: &Path, w: &Workload) -> Duration {
    let t = Instant::now();
    let status = Command::new("ls")
        .arg("-l")
        .arg(root.join(&w.big_dir))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    t.elapsed()
}

fn missing(root: &Path, w: &Workload) -> Duration {
    let t = Instant::now();
    for f in &w.missing {
        assert!(fs::symlink_metadata(root.join(f)).is_err());
    }
    t.elapsed()
}

/// `find`'s work: open every folder, read its entries, lstat each one; the mount's own
/// entries at the root (`.tiers/`, `.resolution.json`) are left out, so every contender walks
/// the same tree.
fn walk(root: &Path, _: &Workload) -> Duration {
    fn go(dir: &Path, top: bool, n: &mut usize) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            if top && e.file_name().as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let path = e.path();
            let meta = fs::symlink_metadata(&path).unwrap();
            *n += 1;
            if meta.is_dir() {
                go(&path, false, n);
            }
        }
    }
    let mut n = 0;
    let t = Instant::now();
    go(root, true, &mut n);
    let took = t.elapsed();
    assert_eq!(n, WALKED, "{} walked {n} entries", root.display());
    took
}

/// Entries under the root, as [`walk`] counts them: per skill of 5 files its folder, 3
/// subfolders and 5 files; the big folder's skill (SKILL.md, `entries/` and its files), the
/// big file's (SKILL.md, `assets/`, the file); the workspace's own skills (folder, SKILL.md,
/// `references/`, notes).
const WALKED: usize = SKILLS * 9 + (1 + 2 + BIG_DIR) + (1 + 3) + 200 * 4;

fn missing_dirs(root: &Path, w: &Workload) -> Duration {
    let t = Instant::now();
    for _ in 0..MISSING_REPEATS {
        for f in &w.missing_dirs {
            assert!(fs::symlink_metadata(root.join(f)).is_err());
        }
    }
    t.elapsed()
}

fn big_read(root: &Path, w: &Workload) -> Duration {
    let mut file = fs::File::open(root.join(&w.big_file)).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut n = 0;
    loop {
        let k = file.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        n += k;
    }
    assert_eq!(n, BIG_FILE);
    t.elapsed()
}

fn main() {
    if !nix::unistd::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: the mount benchmark needs root and /dev/fuse");
        return;
    }
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let cold_runs = runs.div_ceil(2).max(3);
    let work = tempfile::tempdir_in(
        std::env::var_os("BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir),
    )
    .unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    eprintln!("building the tiers...");
    let (owner, ws) = make_tiers(work.path());
    let store_dir = work.path().join("store");

    // The tmpfs baseline: the merged view, materialized.
    let store = Store::open(&store_dir).unwrap();
    let cache = SkillCache::default();
    let args = TierArgs {
        no_builtin: true,
        bundle: vec![],
        owner: vec![owner.clone()],
        workspace: vec![ws.clone()],
        repository: None,
        overrides: vec![],
    };
    let generation = args
        .stack(&store, &cache)
        .unwrap()
        .generation(&store, &cache)
        .unwrap();
    let tmpfs = shm.path().join("merged");
    fs::create_dir(&tmpfs).unwrap();
    for (name, origin) in generation.view(View::Merged) {
        materialize(&store, &origin.digest, &tmpfs.join(name)).unwrap();
    }

    let ours = work.path().join("mnt-cloud-harness");
    let mfs = work.path().join("mnt-mergerfs");
    fs::create_dir(&ours).unwrap();
    fs::create_dir(&mfs).unwrap();
    let mut mounts = Mounts {
        ours: ours.clone(),
        mergerfs: mfs.clone(),
        owner,
        workspace: ws,
        store: store_dir,
        daemon: None,
        prewarmed: None,
        have_mergerfs: false,
    };
    mounts.mount(false, true);
    let mut prewarm_ms = Vec::new();
    if !mounts.have_mergerfs {
        eprintln!("mergerfs is not installed: its column stays empty");
    }

    // Setup wrote a few hundred MiB: let writeback finish before anything is timed.
    nix::unistd::sync();
    let w = workload();
    let metrics: [Metric; 7] = [
        (
            "walk of the merged view (`find`: every folder read, every entry lstat)",
            walk,
        ),
        ("stat of every file, 10,000-file tree", stat_all),
        ("4 KiB open+read+close x2,000", small_reads),
        ("`ls -l` of a 10,000-entry folder", ls_l),
        ("lookups of 10,000 missing names", missing),
        (
            "missing folder then file (`missing-N/SKILL.md`), 1,000 x10",
            missing_dirs,
        ),
        ("64 MiB sequential read", big_read),
    ];
    let mut contenders: Vec<(&str, &Path)> = vec![("tmpfs", &tmpfs), ("cloud-harness", &ours)];
    if mounts.have_mergerfs {
        contenders.push(("mergerfs", &mfs));
    }

    println!(
        "| metric | state | tmpfs | cloud-harness | ratio to tmpfs | mergerfs | ratio to tmpfs |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, f) in metrics {
        let one_cpu = name.starts_with("walk") || name.starts_with("4 KiB");
        // What a prewarm covers: folders and small files, not missing names or large files.
        let prewarmed = one_cpu || name.starts_with("stat") || name.starts_with("`ls");
        let mut states = vec![State::Warm, State::First];
        if one_cpu {
            states.push(State::FirstOneCpu);
        }
        if prewarmed {
            states.extend([State::Racing, State::Prewarmed]);
        }
        states.push(State::Cold);
        for state in states {
            // mergerfs has no prewarm: its first figure is the row above.
            let contenders = match state {
                State::Racing | State::Prewarmed => &contenders[..2],
                _ => &contenders[..],
            };
            // Runs alternate between the contenders, so drift on a shared machine hits all.
            let mut times: Vec<Vec<Duration>> = vec![Vec::new(); contenders.len()];
            if state == State::Warm {
                for (_, root) in contenders {
                    f(root, &w); // warm-up
                }
            }
            let n = if state == State::Warm {
                runs
            } else {
                cold_runs
            };
            for _ in 0..n {
                match state {
                    State::Warm => {}
                    // tmpfs has nothing to mount: its first access is its warm one.
                    State::First => mounts.remount(false, false),
                    State::FirstOneCpu => mounts.remount(true, false),
                    State::Racing => mounts.remount(false, true),
                    State::Prewarmed => {
                        mounts.remount(false, true);
                        prewarm_ms.push(mounts.wait_prewarmed());
                    }
                    State::Cold => drop_caches(),
                }
                let _pinned = (state == State::FirstOneCpu).then(OneCpu::pin);
                for (i, (_, root)) in contenders.iter().enumerate() {
                    times[i].push(f(root, &w));
                }
            }
            if state == State::FirstOneCpu {
                mounts.remount(false, true); // the states after it run with daemons free to move
            }
            let cells: Vec<Duration> = times.into_iter().map(median).collect();
            let show = |d: Duration| {
                if name.starts_with("64 MiB") {
                    format!("{:.0} MiB/s", 64.0 / d.as_secs_f64())
                } else if name.starts_with("walk") {
                    format!("{:.2} µs/entry", d.as_secs_f64() * 1e6 / WALKED as f64)
                } else {
                    format!("{:.1} ms", d.as_secs_f64() * 1e3)
                }
            };
            let ratio = |d: Duration| format!("{:.2}x", d.as_secs_f64() / cells[0].as_secs_f64());
            let (m, mr) = match cells.get(2) {
                Some(d) => (show(*d), ratio(*d)),
                None => ("-".into(), "-".into()),
            };
            println!(
                "| {name} | {} | {} | {} | {} | {m} | {mr} |",
                state.as_str(),
                show(cells[0]),
                show(cells[1]),
                ratio(cells[1]),
            );
        }
    }
    println!("(ratios are time ratios: for the 64 MiB read, below 1.25x means at least 0.8x the throughput)");
    if !prewarm_ms.is_empty() {
        let mid = prewarm_ms.len() / 2;
        let (mut since_start, mut walk): (Vec<u64>, Vec<u64>) = prewarm_ms.into_iter().unzip();
        since_start.sort();
        walk.sort();
        println!(
            "(the prewarm, over {} mounts: its walk took {} ms, median, {}-{}; it ended {} ms after the daemon started, median, {}-{})",
            walk.len(),
            walk[mid],
            walk[0],
            walk[walk.len() - 1],
            since_start[mid],
            since_start[0],
            since_start[since_start.len() - 1],
        );
    }
    mounts.unmount();
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Warm,
    First,
    /// First, with the reader and both daemons on CPU 0.
    FirstOneCpu,
    /// Right after mounting, the daemon's prewarm running beside the reader.
    Racing,
    /// Mounted again, and read once the daemon has said its prewarm ended.
    Prewarmed,
    Cold,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Warm => "warm",
            State::First => "first, no prewarm",
            State::FirstOneCpu => "first, one CPU, no prewarm",
            State::Racing => "first, prewarm running",
            State::Prewarmed => "first, prewarmed",
            State::Cold => "cold",
        }
    }
}

/// The benchmark's thread on CPU 0 until dropped (children it starts, `ls`, inherit it).
struct OneCpu(nix::sched::CpuSet);

impl OneCpu {
    fn pin() -> OneCpu {
        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        let me = nix::unistd::Pid::from_raw(0);
        let before = sched_getaffinity(me).unwrap();
        let mut zero = CpuSet::new();
        zero.set(0).unwrap();
        sched_setaffinity(me, &zero).unwrap();
        OneCpu(before)
    }
}

impl Drop for OneCpu {
    fn drop(&mut self) {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &self.0);
    }
}

/// `program` as a command, run on CPU 0 alone when `pinned` (through util-linux's `taskset`,
/// which every thread and child of it inherits).
fn command(program: &str, pinned: bool) -> Command {
    match pinned {
        true => {
            let mut c = Command::new("taskset");
            c.args(["-c", "0", program]);
            c
        }
        false => Command::new(program),
    }
}

/// The two FUSE contenders, mounted again for each "first" run.
struct Mounts {
    ours: PathBuf,
    mergerfs: PathBuf,
    owner: PathBuf,
    workspace: PathBuf,
    store: PathBuf,
    daemon: Option<Child>,
    prewarmed: Option<std::sync::mpsc::Receiver<(u64, u64)>>,
    have_mergerfs: bool,
}

impl Mounts {
    /// Mounts both; ours prewarms when `prewarm` (the default of `cloud-harness mount`).
    fn mount(&mut self, pinned: bool, prewarm: bool) {
        let mut daemon = command(BIN, pinned)
            .arg("mount")
            .arg(&self.ours)
            .args(["--no-builtin", "--owner"])
            .arg(&self.owner)
            .arg("--workspace")
            .arg(&self.workspace)
            .args((!prewarm).then_some("--no-prewarm"))
            .env("TOOLKIT_CACHE_ROOT", &self.store)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The daemon's stderr, drained; the prewarm's line says how long it took.
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = std::io::BufReader::new(daemon.stderr.take().unwrap());
        let started = Instant::now();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in stderr.lines().map_while(Result::ok) {
                if line.contains(": prewarmed ") {
                    assert!(!line.contains("failed"), "{line}");
                    // "… in T ms": the walk's own time, beside the time since the start.
                    let walk: u64 = line
                        .rsplit_once(" in ")
                        .and_then(|(_, t)| t.split(' ').next()?.parse().ok())
                        .unwrap_or_else(|| panic!("no time in {line:?}"));
                    let _ = tx.send((started.elapsed().as_millis() as u64, walk));
                }
            }
        });
        self.prewarmed = Some(rx);
        self.daemon = Some(daemon);
        wait_mounted(&self.ours);
        let mergerfs = command("mergerfs", pinned)
            .arg("-o")
            .arg("ro,cache.files=full,cache.attr=86400,cache.entry=86400,cache.negative_entry=86400,cache.readdir=true,category.search=ff,fsname=mergerfs-bench")
            .arg(format!("{}:{}", self.owner.display(), self.workspace.display()))
            .arg(&self.mergerfs)
            .status();
        self.have_mergerfs = mergerfs.is_ok_and(|s| s.success());
        if self.have_mergerfs {
            wait_mounted(&self.mergerfs);
        }
    }

    fn unmount(&mut self) {
        if self.have_mergerfs {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mergerfs)
                .status();
        }
        if let Some(mut daemon) = self.daemon.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(daemon.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            daemon.wait().unwrap();
        }
        while is_mounted(&self.ours) || (self.have_mergerfs && is_mounted(&self.mergerfs)) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn remount(&mut self, pinned: bool, prewarm: bool) {
        self.unmount();
        self.mount(pinned, prewarm);
    }

    /// Waits for the prewarm's end: how long after starting the daemon it came, and how long
    /// the walk itself took (the rest is building the generation and mounting).
    fn wait_prewarmed(&mut self) -> (u64, u64) {
        let rx = self.prewarmed.as_ref().expect("mounted");
        rx.recv_timeout(Duration::from_secs(300))
            .expect("the daemon never said it prewarmed")
    }
}

//! Importing a 100 MiB tree of small and large files into a fresh store, against `sha256sum`
//! over the same files in the same run (the floor: reading and hashing every byte once); then
//! reading every blob of that store back, verified, the first time in the process (each one
//! hashed) and again (each one known), against reading the object files plainly.
//!
//! `cargo bench -p cloud-harness-store --bench store` (set BENCH_DIR to pick the disk; default
//! the system temp dir, with the store on the same file system).

use cloud_harness_store::cas::{Digest, Limits, Store};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 7;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: enough to make incompressible, distinct files.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// 2,000 small files (1-32 KiB) in 100 skill folders plus 17 files of 4 MiB: about 100 MiB.
fn make_tree(root: &Path) -> (Vec<PathBuf>, u64) {
    let mut rng = Rng(0x5eed);
    let mut files = Vec::new();
    let mut total = 0u64;
    for s in 0..100 {
        let dir = root.join(format!("skills/bucket{}/skill{s}/references", s % 7));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..20 {
            let len = 1024 + (rng.next() % (31 * 1024)) as usize;
            let mut buf = vec![0u8; len];
            rng.fill(&mut buf);
            let p = dir.join(format!("ref{f}.md"));
            fs::write(&p, &buf).unwrap();
            total += len as u64;
            files.push(p);
        }
    }
    let assets = root.join("assets");
    fs::create_dir_all(&assets).unwrap();
    for i in 0..17 {
        let mut buf = vec![0u8; 4 << 20];
        rng.fill(&mut buf);
        let p = assets.join(format!("model{i}.bin"));
        fs::write(&p, &buf).unwrap();
        total += buf.len() as u64;
        files.push(p);
    }
    (files, total)
}

/// Every blob of `store`: its digest and its file.
fn blobs(store: &Store) -> Vec<(Digest, PathBuf)> {
    let mut out = Vec::new();
    for dir in fs::read_dir(store.root().join("objects/blob")).unwrap() {
        let dir = dir.unwrap();
        let prefix = dir.file_name().into_string().unwrap();
        for f in fs::read_dir(dir.path()).unwrap() {
            let f = f.unwrap();
            let hex = format!("{prefix}{}", f.file_name().into_string().unwrap());
            out.push((Digest::parse(&format!("sha256:{hex}")).unwrap(), f.path()));
        }
    }
    out
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let work = tempfile::tempdir_in(&base).unwrap();
    let src = work.path().join("tree");
    let (files, total) = make_tree(&src);
    // Warm the page cache for both contenders.
    for f in &files {
        std::hint::black_box(fs::read(f).unwrap());
    }

    let mut sha = Vec::new();
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let (mut plain, mut hashed, mut known) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..RUNS {
        let t = Instant::now();
        let status = Command::new("sha256sum")
            .args(&files)
            .stdout(Stdio::null())
            .status()
            .expect("sha256sum (coreutils) is needed for the baseline");
        assert!(status.success());
        sha.push(t.elapsed());

        let store_dir = work.path().join(format!("store{run}"));
        let store = Store::open(&store_dir).unwrap();
        let t = Instant::now();
        let imported = store.import_dir(&src, &Limits::default()).unwrap();
        cold.push(t.elapsed());
        assert_eq!(imported.bytes, total);

        let t = Instant::now();
        store.import_dir(&src, &Limits::default()).unwrap();
        warm.push(t.elapsed());

        // Objects changed within the last second are hashed on every read (file times are
        // coarse): these are read once they have settled.
        std::thread::sleep(Duration::from_millis(1100));
        let blobs = blobs(&store);
        let read_all = || {
            for (digest, _) in &blobs {
                std::hint::black_box(store.blob(digest).unwrap());
            }
        };
        plain.push(timed(|| {
            for (_, path) in &blobs {
                std::hint::black_box(fs::read(path).unwrap());
            }
        }));
        hashed.push(timed(read_all));
        known.push(timed(read_all));
        fs::remove_dir_all(&store_dir).unwrap();
    }
    let (sha, cold, warm) = (median(sha), median(cold), median(warm));
    let mib = total as f64 / (1 << 20) as f64;
    println!(
        "import of {} files, {mib:.1} MiB (median of {RUNS} runs)",
        files.len()
    );
    println!("| what | median | MiB/s | ratio to sha256sum |");
    println!("|---|---|---|---|");
    for (what, d) in [
        ("sha256sum (baseline)", sha),
        ("import, cold store", cold),
        ("import, every object present", warm),
    ] {
        println!(
            "| {what} | {:.1} ms | {:.0} | {:.2}x |",
            d.as_secs_f64() * 1e3,
            mib / d.as_secs_f64(),
            d.as_secs_f64() / sha.as_secs_f64()
        );
    }
    let (plain, hashed, known) = (median(plain), median(hashed), median(known));
    println!("| what | median | ratio to a plain read |");
    println!("|---|---|---|");
    for (what, d) in [
        ("read every object file (baseline)", plain),
        ("read every blob verified, first in the process", hashed),
        ("read every blob verified, again (hashed before)", known),
    ] {
        println!(
            "| {what} | {:.1} ms | {:.2}x |",
            d.as_secs_f64() * 1e3,
            d.as_secs_f64() / plain.as_secs_f64()
        );
    }
}

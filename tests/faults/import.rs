//! A writer killed with SIGKILL in the middle of imports leaves no partial object visible.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn harness(store: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cloud-harness"));
    cmd.env("TOOLKIT_CACHE_ROOT", store);
    cmd
}

/// A tree of many small files and a few large ones; `round` makes its content new.
fn make_tree(dir: &Path, round: u32) {
    let _ = fs::remove_dir_all(dir);
    for bucket in 0..20 {
        let sub = dir.join(format!("bucket{bucket}/skill{bucket}"));
        fs::create_dir_all(&sub).unwrap();
        for i in 0..100 {
            let body = format!("round {round} bucket {bucket} file {i}\n").repeat(100);
            fs::write(sub.join(format!("f{i}.md")), body).unwrap();
        }
    }
    for i in 0..3 {
        let big: Vec<u8> = (0..6u32 << 20)
            .map(|b| (b.wrapping_mul(31) ^ round ^ i) as u8)
            .collect();
        fs::write(dir.join(format!("large{i}.bin")), big).unwrap();
    }
}

#[test]
fn sigkill_mid_import_leaves_no_partial_object() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let src = tmp.path().join("src");
    let delays_ms = [1u64, 5, 15, 30, 60, 100, 150, 250, 400, 700];
    let mut killed_mid_run = 0;
    for (round, delay) in delays_ms.iter().enumerate() {
        make_tree(&src, round as u32);
        let mut child = harness(&store)
            .args(["cas", "import"])
            .arg(&src)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(*delay));
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        if status.signal() == Some(9) {
            killed_mid_run += 1;
        }
        let out = harness(&store)
            .args(["cas", "verify", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "round {round} (killed after {delay} ms): {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    assert!(
        killed_mid_run >= 3,
        "only {killed_mid_run} writers were killed mid-run"
    );

    // A complete import afterwards works, and gc sweeps what the dead writers left in tmp/.
    let out = harness(&store)
        .args(["cas", "import", "--root", "final"])
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = harness(&store)
        .args(["cas", "gc", "--grace", "0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(fs::read_dir(store.join("tmp")).unwrap().count(), 0);
    let out = harness(&store).args(["cas", "verify"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

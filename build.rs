// The commit the binary is built from goes into `--version` (`unknown` outside a git checkout).
fn main() {
    // Where git keeps them (a worktree's HEAD is not under `.git/`); a path that does not
    // exist would rerun this on every build.
    for name in ["HEAD", "refs/heads", "packed-refs"] {
        let at = std::process::Command::new("git")
            .args(["rev-parse", "--git-path", name])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok());
        if let Some(path) = at.map(|p| p.trim().to_owned()) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    println!("cargo:rerun-if-env-changed=CLOUD_HARNESS_COMMIT");
    let commit = std::env::var("CLOUD_HARNESS_COMMIT").ok().or_else(|| {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
    });
    println!(
        "cargo:rustc-env=CLOUD_HARNESS_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}

//! Running a skill's script (`skills_run`): the interpreter its shebang or extension names, in
//! the working tree, with a clean environment, a timeout and capped output, in a process group
//! of its own so that a timeout or a cancellation kills everything it started.

use cloud_harness_fs::{Code, Error, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

/// Output kept per stream; the rest is read and counted, not kept.
pub const OUTPUT_CAP: usize = 256 << 10;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, Clone)]
pub struct Run {
    /// The skill's folder on disk.
    pub skill_dir: PathBuf,
    /// The script, relative to the skill folder.
    pub script: String,
    pub args: Vec<String>,
    /// Where it runs: the working tree.
    pub cwd: PathBuf,
    pub timeout: Duration,
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub millis: u64,
}

/// How to start `script`: its shebang, else its extension, else itself if executable.
pub fn command_for(script: &Path) -> Result<Vec<String>> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| Error::io(script, e))?;
    let path = script.to_string_lossy().into_owned();
    if head[..n].starts_with(b"#!") {
        let line = head[2..n].split(|&b| b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut parts = line.split_whitespace();
        if let Some(program) = parts.next() {
            // Like the kernel: the interpreter and at most one argument.
            let rest: Vec<&str> = parts.collect();
            let mut cmd = vec![program.to_owned()];
            if !rest.is_empty() {
                cmd.push(rest.join(" "));
            }
            cmd.push(path);
            return Ok(cmd);
        }
    }
    let by_extension = match script.extension().and_then(|e| e.to_str()) {
        Some("sh") => Some("sh"),
        Some("bash") => Some("bash"),
        Some("py") => Some("python3"),
        Some("js" | "mjs" | "cjs") => Some("node"),
        Some("rb") => Some("ruby"),
        Some("pl") => Some("perl"),
        _ => None,
    };
    if let Some(interpreter) = by_extension {
        return Ok(vec![interpreter.to_owned(), path]);
    }
    let executable = std::fs::metadata(script)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
        .unwrap_or(false);
    if executable {
        return Ok(vec![path]);
    }
    Err(Error::invalid(format!(
        "script: cannot tell how to run {:?}: no shebang, no known extension, not executable",
        script.file_name().unwrap_or_default()
    ))
    .with_details(serde_json::json!({ "field": "script" })))
}

/// Reads a stream to its end, keeping at most `cap` bytes.
async fn drain(
    mut stream: impl AsyncRead + Unpin,
    cap: usize,
    counter: Arc<AtomicU64>,
) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, total),
            Ok(n) => {
                total += n as u64;
                counter.fetch_add(n as u64, Ordering::Relaxed);
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

fn kill_group(pid: u32) {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Runs the script; `progress(elapsed, output bytes)` is called about once a second.
pub async fn run(
    run: Run,
    cancel: CancellationToken,
    progress: impl Fn(Duration, u64),
) -> Result<Outcome> {
    let script = run.skill_dir.join(&run.script);
    let meta = std::fs::metadata(&script).map_err(|_| {
        Error::not_found(format!("the skill has no script {:?}", run.script))
            .with_details(serde_json::json!({ "field": "script" }))
    })?;
    if !meta.is_file() {
        return Err(
            Error::invalid(format!("script: {:?} is not a file", run.script))
                .with_details(serde_json::json!({ "field": "script" })),
        );
    }
    let mut command = command_for(&script)?;
    command.extend(run.args.iter().cloned());
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .current_dir(&run.cwd)
        .env_clear()
        .env("PATH", SAFE_PATH)
        .env("HOME", &run.cwd)
        .env("LANG", "C.UTF-8")
        .env("CLOUD_HARNESS_SKILL_DIR", &run.skill_dir)
        .envs(run.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            Code::NotFound
        } else {
            Code::Internal
        };
        Error::new(code, format!("cannot start {}: {e}", command[0]))
            .with_details(serde_json::json!({ "command": command }))
    })?;
    let pid = child.id().unwrap_or(0);
    let bytes = Arc::new(AtomicU64::new(0));
    let out = tokio::spawn(drain(
        child.stdout.take().expect("piped"),
        OUTPUT_CAP,
        bytes.clone(),
    ));
    let err = tokio::spawn(drain(
        child.stderr.take().expect("piped"),
        OUTPUT_CAP,
        bytes.clone(),
    ));

    let deadline = tokio::time::sleep(run.timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let (mut timed_out, mut cancelled) = (false, false);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            _ = &mut deadline => {
                timed_out = true;
                kill_group(pid);
                break child.wait().await.ok();
            }
            _ = cancel.cancelled() => {
                cancelled = true;
                kill_group(pid);
                break child.wait().await.ok();
            }
            _ = ticker.tick() => progress(started.elapsed(), bytes.load(Ordering::Relaxed)),
        }
    };
    // Whatever the script left running in its group goes too.
    kill_group(pid);
    let (stdout, stdout_bytes) = out.await.unwrap_or_default();
    let (stderr, stderr_bytes) = err.await.unwrap_or_default();
    use std::os::unix::process::ExitStatusExt;
    Ok(Outcome {
        command,
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        timed_out,
        cancelled,
        stdout_truncated: stdout_bytes > stdout.len() as u64,
        stderr_truncated: stderr_bytes > stderr.len() as u64,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        stdout_bytes,
        stderr_bytes,
        millis: started.elapsed().as_millis() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn the_interpreter_comes_from_the_shebang_or_the_extension() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let cmd =
            command_for(&script(d, "a", "#!/usr/bin/env python3\nprint(1)\n", 0o644)).unwrap();
        assert_eq!(cmd[..2], ["/usr/bin/env".to_owned(), "python3".to_owned()]);
        assert_eq!(
            command_for(&script(d, "b.sh", "echo hi\n", 0o644)).unwrap()[0],
            "sh"
        );
        assert_eq!(
            command_for(&script(d, "c.py", "print(1)\n", 0o644)).unwrap()[0],
            "python3"
        );
        assert_eq!(
            command_for(&script(d, "tool", "\x7fELF", 0o755))
                .unwrap()
                .len(),
            1
        );
        let err = command_for(&script(d, "notes", "plain text", 0o644)).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
    }

    #[tokio::test]
    async fn timeouts_kill_the_whole_group_and_output_is_capped() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        script(d, "slow.sh", "sleep 30 &\nsleep 30\n", 0o644);
        script(
            d,
            "loud.sh",
            "head -c 1000000 /dev/zero | tr '\\0' x\necho done >&2\n",
            0o644,
        );
        let base = Run {
            skill_dir: d.to_path_buf(),
            script: "slow.sh".into(),
            args: vec![],
            cwd: d.to_path_buf(),
            timeout: Duration::from_millis(300),
            env: vec![],
        };
        let o = run(base.clone(), CancellationToken::new(), |_, _| {})
            .await
            .unwrap();
        assert!(o.timed_out && o.millis < 5000, "{o:?}");
        let o = run(
            Run {
                script: "loud.sh".into(),
                timeout: Duration::from_secs(10),
                ..base
            },
            CancellationToken::new(),
            |_, _| {},
        )
        .await
        .unwrap();
        assert_eq!(o.exit_code, Some(0));
        assert!(
            o.stdout_truncated && o.stdout.len() == OUTPUT_CAP && o.stdout_bytes == 1_000_000,
            "{}",
            o.stdout_bytes
        );
        assert_eq!(o.stderr, "done\n");
    }
}

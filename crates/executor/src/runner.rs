//! Running a skill's script (`skills_run`): the command line its shebang or extension names,
//! and the supervision of that command in the workspace's executor: a timeout, capped output,
//! progress, and a kill of everything it started on a timeout or a cancellation.

use crate::process::{Event, Stream};
use crate::{Exit, Process};
use cloud_harness_error::{Error, Result};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// How long output may stay open after the command exited and its group was killed (a
/// process that left the group and holds the pipe is not waited for).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How long a killed command may take to be reported gone before the run ends without its
/// exit (an agent that stopped answering).
const KILL_GRACE: Duration = Duration::from_secs(5);
/// What a process gets at its CPU-time limit (then SIGKILL a second later).
const SIGXCPU: i32 = 24;

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
    /// The limit the run passed, if one ended it or cut its output: `TIMEOUT`,
    /// `MEMORY_LIMIT` (the kernel killed a process of its executor for memory while it ran),
    /// `CPU_LIMIT` (its CPU seconds), `OUTPUT_LIMIT` (output past the cap was counted, not
    /// kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<&'static str>,
    /// The executor's run agent went away during the run (its exit is unknown).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub executor_lost: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub millis: u64,
}

/// How to start a script: its shebang, else its extension, else itself if executable.
/// `script` is read here (a host copy); `run_as` is the path the command names (the same
/// file as the executor sees it).
pub fn command_for(script: &Path, run_as: &str) -> Result<Vec<String>> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| Error::io(script, e))?;
    let path = run_as.to_owned();
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

/// Output of one stream: at most `cap` bytes kept, all counted.
struct Capped {
    kept: Vec<u8>,
    total: u64,
    cap: usize,
}

impl Capped {
    fn new(cap: usize) -> Capped {
        Capped {
            kept: Vec::new(),
            total: 0,
            cap,
        }
    }

    fn add(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// Supervises a started command until it ends, keeping at most `cap` bytes of each stream;
/// `progress(elapsed, output bytes)` is called about once a second.
pub async fn supervise(
    mut process: Process,
    command: Vec<String>,
    timeout: Duration,
    cap: usize,
    cancel: CancellationToken,
    progress: impl Fn(Duration, u64),
) -> Outcome {
    let started = Instant::now();
    let memory = process.memory.clone();
    let oom_before = memory.as_ref().and_then(|m| m.oom_kills());
    let (mut out, mut err) = (Capped::new(cap), Capped::new(cap));
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let drain = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(drain);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let (mut timed_out, mut cancelled) = (false, false);
    let mut exit: Option<Exit> = None;
    let mut open = true;
    while open || exit.is_none() {
        tokio::select! {
            event = process.next() => match event {
                Some(Event::Output(Stream::Stdout, bytes)) => out.add(&bytes),
                Some(Event::Output(Stream::Stderr, bytes)) => err.add(&bytes),
                Some(Event::Closed) => open = false,
                Some(Event::Exited(status)) => {
                    exit = Some(status);
                    // Whatever the script left running in its group goes too.
                    (process.kill)();
                    drain.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
                }
                None => break,
            },
            _ = &mut drain, if exit.is_some() || timed_out || cancelled => break,
            _ = &mut deadline, if !timed_out && !cancelled && exit.is_none() => {
                timed_out = true;
                (process.kill)();
                drain.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
            }
            _ = cancel.cancelled(), if !timed_out && !cancelled && exit.is_none() => {
                cancelled = true;
                (process.kill)();
                drain.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
            }
            _ = ticker.tick() => progress(started.elapsed(), out.total + err.total),
        }
    }
    // A run killed whose end was never reported: the executor no longer answers.
    let lost = exit.is_none();
    let exit = exit.unwrap_or_default();
    let truncated = out.total > out.kept.len() as u64 || err.total > err.kept.len() as u64;
    // A kill for memory in its executor while it ran (in a process of its own, most likely:
    // the kernel picks the largest).
    let oom = match (oom_before, memory.as_ref().and_then(|m| m.oom_kills())) {
        (Some(before), Some(after)) => after > before,
        _ => false,
    };
    let limit = if timed_out {
        Some("TIMEOUT")
    } else if oom {
        Some("MEMORY_LIMIT")
    } else if exit.signal == Some(SIGXCPU) {
        Some("CPU_LIMIT")
    } else if truncated {
        Some("OUTPUT_LIMIT")
    } else {
        None
    };
    Outcome {
        command,
        exit_code: exit.code,
        signal: exit.signal,
        timed_out,
        cancelled,
        limit,
        executor_lost: exit.lost || lost,
        stdout_truncated: out.total > out.kept.len() as u64,
        stderr_truncated: err.total > err.kept.len() as u64,
        stdout: String::from_utf8_lossy(&out.kept).into_owned(),
        stderr: String::from_utf8_lossy(&err.kept).into_owned(),
        stdout_bytes: out.total,
        stderr_bytes: err.total,
        millis: started.elapsed().as_millis() as u64,
    }
}

#[cfg(test)]
mod tests {
    /// Output kept per stream, as `[limits] run_output`'s default.
    const OUTPUT_CAP: usize = 256 << 10;

    use super::*;
    use crate::process::spawn_local;
    use cloud_harness_error::Code;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

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
        let p = script(d, "a", "#!/usr/bin/env python3\nprint(1)\n", 0o644);
        let cmd = command_for(&p, "/opt/x/a").unwrap();
        assert_eq!(cmd, ["/usr/bin/env", "python3", "/opt/x/a"]);
        let p = script(d, "b.sh", "echo hi\n", 0o644);
        assert_eq!(command_for(&p, "b.sh").unwrap()[0], "sh");
        let p = script(d, "c.py", "print(1)\n", 0o644);
        assert_eq!(command_for(&p, "c.py").unwrap()[0], "python3");
        let p = script(d, "tool", "\x7fELF", 0o755);
        assert_eq!(command_for(&p, "/x/tool").unwrap(), ["/x/tool"]);
        let p = script(d, "notes", "plain text", 0o644);
        assert_eq!(
            command_for(&p, "notes").unwrap_err().code,
            Code::InvalidArgument
        );
    }

    async fn supervised(argv: &[&str], timeout: Duration) -> Outcome {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
        let process = spawn_local(&argv, None, &env, None).unwrap();
        supervise(
            process,
            argv,
            timeout,
            OUTPUT_CAP,
            CancellationToken::new(),
            |_, _| {},
        )
        .await
    }

    #[tokio::test]
    async fn timeouts_kill_the_whole_group_and_output_is_capped() {
        let o = supervised(
            &["sh", "-c", "sleep 30 & sleep 30"],
            Duration::from_millis(300),
        )
        .await;
        assert!(o.timed_out && o.millis < 5000, "{o:?}");
        let o = supervised(
            &[
                "sh",
                "-c",
                "head -c 1000000 /dev/zero | tr '\\0' x; echo done >&2",
            ],
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(o.exit_code, Some(0));
        assert!(
            o.stdout_truncated && o.stdout.len() == OUTPUT_CAP && o.stdout_bytes == 1_000_000,
            "{}",
            o.stdout_bytes
        );
        assert_eq!(o.stderr, "done\n");
    }

    #[tokio::test]
    async fn a_background_child_holding_the_output_does_not_hold_the_run() {
        let o = supervised(
            &["sh", "-c", "sleep 30 & echo started"],
            Duration::from_secs(20),
        )
        .await;
        assert_eq!(o.exit_code, Some(0));
        assert_eq!(o.stdout, "started\n");
        assert!(!o.timed_out && o.millis < 10_000, "{o:?}");
    }

    #[tokio::test]
    async fn a_run_whose_executor_stops_answering_ends_as_lost() {
        // Output that stays open, an exit never reported, a kill that does nothing.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let process = Process::local(rx, Box::pin(std::future::pending()), Box::new(|| {}));
        let o = supervise(
            process,
            vec!["wedged".into()],
            Duration::from_millis(100),
            OUTPUT_CAP,
            CancellationToken::new(),
            |_, _| {},
        )
        .await;
        drop(tx);
        assert!(o.timed_out && o.executor_lost, "{o:?}");
        assert_eq!(o.limit, Some("TIMEOUT"));
        assert!(o.millis < 10_000, "{o:?}");
    }
}

//! A command started in an executor, as the runner sees it whatever the backend: its output as
//! chunks, its exit, and a way to kill everything it started.

pub use crate::event::{Event, Exit, Stream};
use crate::run_stream::{Ender, RunInput, RunStream};
use cloud_harness_error::{Code, Error, Result};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

pub(crate) type Killer = Box<dyn Fn() + Send + Sync>;

pub struct Process {
    events: Events,
    /// Kills the command and everything it started (idempotent).
    pub kill: Killer,
    /// Where the kernel counts its executor's kills for memory, if anywhere.
    pub memory: Option<std::sync::Arc<crate::cgroup::Memory>>,
    input: Option<RunInput>,
    /// Ends an agent's run when the process is dropped.
    _ender: Option<EndOnDrop>,
}

enum Events {
    /// A process of this machine's: output from reader tasks, its exit from its child.
    Local {
        output: mpsc::Receiver<(Stream, Vec<u8>)>,
        exit: Pin<Box<dyn Future<Output = Exit> + Send>>,
        open: bool,
        exited: bool,
    },
    /// A run of an executor's agent: frames on its own socket.
    Agent(RunStream),
}

struct EndOnDrop(Ender);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl Process {
    /// A command whose output arrives on `output` and whose exit `exit` resolves to.
    pub fn local(
        output: mpsc::Receiver<(Stream, Vec<u8>)>,
        exit: Pin<Box<dyn Future<Output = Exit> + Send>>,
        kill: Killer,
    ) -> Process {
        Process {
            events: Events::Local {
                output,
                exit,
                open: true,
                exited: false,
            },
            kill,
            memory: None,
            input: None,
            _ender: None,
        }
    }

    /// A run of an agent's, read on `stream`; `ender` ends it.
    pub(crate) fn of_run(
        stream: RunStream,
        input: Option<RunInput>,
        ender: Ender,
        memory: Option<std::sync::Arc<crate::cgroup::Memory>>,
    ) -> Process {
        let kill = ender.clone();
        Process {
            events: Events::Agent(stream),
            kill: Box::new(move || kill.kill()),
            memory,
            input,
            _ender: Some(EndOnDrop(ender)),
        }
    }

    /// The command's standard input, if it was started with one (once).
    pub fn take_input(&mut self) -> Option<RunInput> {
        self.input.take()
    }

    /// The next event; `None` once the output closed and the exit is known. Cancel-safe.
    pub async fn next(&mut self) -> Option<Event> {
        match &mut self.events {
            Events::Agent(stream) => stream.next().await,
            Events::Local {
                output,
                exit,
                open,
                exited,
            } => {
                tokio::select! {
                    chunk = output.recv(), if *open => Some(match chunk {
                        Some((stream, bytes)) => Event::Output(stream, bytes),
                        None => {
                            *open = false;
                            Event::Closed
                        }
                    }),
                    status = exit, if !*exited => {
                        *exited = true;
                        Some(Event::Exited(status))
                    }
                    else => None,
                }
            }
        }
    }
}

/// Forwards a stream into `tx` until its end.
pub async fn forward(
    mut stream: impl AsyncRead + Unpin,
    which: Stream,
    tx: mpsc::Sender<(Stream, Vec<u8>)>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send((which, buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

pub(crate) fn kill_group(pid: i32) {
    if pid > 0 {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn start_error(program: &str, e: std::io::Error) -> Error {
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        Code::NotFound
    } else {
        Code::Internal
    };
    Error::new(code, format!("cannot start {program}: {e}"))
}

/// `program` as an absolute path, searched in `path` (a `PATH` value) when it has no slash.
/// Spawning an absolute path lets the standard library use `posix_spawn` instead of forking
/// a large server (which costs milliseconds per page-table copy).
pub(crate) fn absolute(program: &str, path: &str) -> String {
    if program.contains('/') {
        return program.to_owned();
    }
    for dir in path.split(':').filter(|d| d.starts_with('/')) {
        let candidate = Path::new(dir).join(program);
        let executable = std::fs::metadata(&candidate).is_ok_and(|m| {
            m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        });
        if executable {
            return candidate.display().to_string();
        }
    }
    program.to_owned()
}

/// The `PATH` a command is looked up in: its own, else this process's.
pub(crate) fn lookup_path(env: &[(String, String)]) -> String {
    env.iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default()
}

/// Starts `argv` on this machine in a process group of its own (a bubblewrap sandbox, or a
/// command of the development-only host executor), with a clean environment of `env`.
pub(crate) fn spawn_local(
    argv: &[String],
    cwd: Option<&Path>,
    env: &[(String, String)],
    limits: Option<super::rlimits::RunLimits>,
) -> Result<Process> {
    let mut cmd = tokio::process::Command::new(absolute(&argv[0], &lookup_path(env)));
    cmd.args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    if let Some(limits) = limits {
        // SAFETY: between fork and exec only setrlimit runs, which is async-signal-safe and
        // touches no memory of the parent's.
        unsafe {
            cmd.pre_exec(move || limits.apply());
        }
    }
    let mut child = cmd.spawn().map_err(|e| start_error(&argv[0], e))?;
    let pid = child.id().map_or(0, |p| p as i32);
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(forward(
        child.stdout.take().expect("piped"),
        Stream::Stdout,
        tx.clone(),
    ));
    tokio::spawn(forward(
        child.stderr.take().expect("piped"),
        Stream::Stderr,
        tx,
    ));
    let exit = Box::pin(async move {
        use std::os::unix::process::ExitStatusExt;
        match child.wait().await {
            Ok(s) => Exit {
                code: s.code(),
                signal: s.signal(),
                lost: false,
            },
            Err(_) => Exit::default(),
        }
    });
    Ok(Process::local(rx, exit, Box::new(move || kill_group(pid))))
}

/// Runs `argv` on this machine with this process's standard streams; its exit status, as a
/// shell reports it (128 + the signal for a killed command).
pub(crate) fn run_inherited(
    argv: &[String],
    cwd: Option<&Path>,
    env: &[(String, String)],
) -> Result<i32> {
    let mut cmd = std::process::Command::new(absolute(&argv[0], &lookup_path(env)));
    cmd.args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let status = cmd.status().map_err(|e| start_error(&argv[0], e))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_program_is_looked_up_in_the_command_s_path() {
        let env = vec![("PATH".to_owned(), "/nowhere:/bin".to_owned())];
        assert_eq!(absolute("sh", &lookup_path(&env)), "/bin/sh");
        assert_eq!(absolute("./x", &lookup_path(&env)), "./x");
        assert_eq!(
            absolute("no-such-program", &lookup_path(&env)),
            "no-such-program"
        );
    }
}

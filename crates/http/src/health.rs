//! `/healthz` (the process answers) and `/readyz` (it can do its work: the store takes a
//! write, the database a transaction, and every open workspace's mounts are mounted and served).
//! Both are open to anyone — a probe has no token — so both say only ready or not and which
//! kind of check failed, never a workspace, a key or a path (the log names them).
//!
//! Readiness is assessed in the background every [`READY_EVERY`], each check on the blocking
//! pool and bounded by [`CHECK_TIMEOUT`] (a hung mount never answers; a check still running
//! is not started again beside it). `/readyz` answers the last assessment: it waits on
//! nothing and touches no lock a request can hold, so a flood of probes costs nothing.
//! `/metrics` is served beside them, for operators (`metrics`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cloud_harness_workspace::Workspaces;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often readiness is assessed.
pub const READY_EVERY: Duration = Duration::from_secs(2);
/// Free space below which a disk counts as nearly full, unless `CLOUD_HARNESS_MIN_FREE_MIB`
/// says.
const MIN_FREE_MIB: u64 = 256;

fn min_free() -> u64 {
    std::env::var("CLOUD_HARNESS_MIN_FREE_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(MIN_FREE_MIB)
        .saturating_mul(1 << 20)
}

/// Free inodes below which a disk counts as full: every object of the store, file of a
/// working tree and temporary file takes one, and running out refuses writes (`ENOSPC`) with
/// gigabytes free.
const MIN_FREE_INODES: u64 = 4096;

/// Whether the file systems of `dirs` each have `min` bytes free (for the server's user), and
/// inodes to spare where the file system counts them (some, btrfs among them, report none).
fn space(dirs: &[std::path::PathBuf], min: u64) -> Result<(), String> {
    for dir in dirs {
        let vfs = nix::sys::statvfs::statvfs(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let free = vfs.blocks_available() as u64 * vfs.fragment_size() as u64;
        if free < min {
            return Err(format!(
                "{}: {} MiB free, under the {} MiB of disk.min_free_mib",
                dir.display(),
                free >> 20,
                min >> 20
            ));
        }
        let inodes = vfs.files_available() as u64;
        if vfs.files() as u64 > 0 && inodes < MIN_FREE_INODES {
            return Err(format!(
                "{}: {inodes} inodes free, under {MIN_FREE_INODES}",
                dir.display()
            ));
        }
    }
    Ok(())
}

/// How long one check may take before it counts as failed.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Report {
    pub ready: bool,
    pub checks: Vec<Check>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Check {
    pub check: &'static str,
    pub ok: bool,
    /// Why not, in words that name no workspace, key or path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What an operator should know although it passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Check {
    fn of(check: &'static str, outcome: Result<(), String>) -> Check {
        Check {
            check,
            ok: outcome.is_ok(),
            error: outcome.err(),
            note: None,
        }
    }
}

/// The probes and `/metrics`; starts assessing readiness (call it inside the runtime).
pub fn router(workspaces: Arc<Workspaces>) -> Router {
    let starting = Report {
        ready: false,
        checks: vec![Check::of(
            "started",
            Err("the first checks are under way".into()),
        )],
    };
    let (tx, rx) = watch::channel(starting);
    tokio::spawn(assess_always(workspaces.clone(), tx));
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(rx);
    let metrics = Router::new()
        .route("/metrics", get(metrics))
        .with_state(workspaces);
    probes.merge(metrics)
}

/// `GET /metrics`: every series, the open workspaces counted now.
async fn metrics(
    axum::extract::State(workspaces): axum::extract::State<
        std::sync::Arc<cloud_harness_workspace::Workspaces>,
    >,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let open = workspaces.open_workspaces();
    cloud_harness_control::metrics::set_open_workspaces(open.len());
    cloud_harness_control::metrics::set_paused_workspaces(
        open.iter().filter(|w| w.is_paused()).count(),
    );
    cloud_harness_control::metrics::set_usage(
        crate::usage::all(&workspaces)
            .into_iter()
            .flat_map(|(who, used)| used.into_iter().map(move |(l, n)| (who.clone(), l, n)))
            .collect(),
    );
    let mut r = cloud_harness_control::metrics::text().into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
            .parse()
            .expect("a header"),
    );
    r
}

async fn ready(State(rx): State<watch::Receiver<Report>>) -> Response {
    let report = rx.borrow().clone();
    let status = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(report)).into_response()
}

/// Assesses readiness every [`READY_EVERY`] for as long as anyone may ask.
async fn assess_always(workspaces: Arc<Workspaces>, tx: watch::Sender<Report>) {
    let mut checks = Checks::default();
    let mut said = String::new();
    loop {
        let (report, failures) = checks.assess(&workspaces).await;
        // The log names what failed, once per change (the probe's answer cannot).
        let now = failures.join("; ");
        if now != said {
            if now.is_empty() {
                tracing::info!("ready again");
            } else {
                tracing::warn!(failures = %now, "not ready");
            }
            said = now;
        }
        if tx.send(report).is_err() {
            return;
        }
        tokio::time::sleep(READY_EVERY).await;
    }
}

/// The checks still running, by what they check (`store`, `space`, `database`, `workspace mounts`).
#[derive(Default)]
struct Checks {
    running: HashMap<String, Arc<AtomicBool>>,
}

/// A check started (or refused because the last one of its kind still runs).
enum Started {
    Running(tokio::task::JoinHandle<Result<(), String>>),
    Busy,
}

impl Started {
    /// Its outcome, waited for at most [`CHECK_TIMEOUT`].
    async fn outcome(self) -> Result<(), String> {
        let task = match self {
            Started::Running(task) => task,
            Started::Busy => return Err("the last check has not answered yet".into()),
        };
        match tokio::time::timeout(CHECK_TIMEOUT, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err("the check ended without an answer".to_owned()),
            Err(_) => Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())),
        }
    }
}

impl Checks {
    /// One assessment, all checks at once, and what failed as the log says it (with names
    /// and paths).
    async fn assess(&mut self, ws: &Arc<Workspaces>) -> (Report, Vec<String>) {
        let store = ws.store().root().to_path_buf();
        let stored = self.start("store", move || {
            tempfile::NamedTempFile::new_in(&store)
                .map(drop)
                .map_err(|e| format!("{}: {e}", store.display()))
        });
        let dirs = vec![ws.store().root().to_path_buf(), ws.home().to_path_buf()];
        let spaced = self.start("space", move || space(&dirs, min_free()));
        let db = ws.db().clone();
        // SQLite: a write transaction (its lock is this machine's). PostgreSQL: a read, since
        // a write takes the fleet's one write lock, and every runner's probe every 2 s would
        // put every runner out of service at once behind one long write.
        let database = self.start("database", move || {
            let checked = match db.engine() {
                "postgres" => db
                    .with(|c| {
                        c.query_row("SELECT 1", cloud_harness_control::params![], |r| {
                            r.get::<i64>(0)
                        })
                    })
                    .map(drop),
                _ => db.write(|_| Ok(())),
            };
            checked.map_err(|e| e.to_string())
        });
        // One check for them all, from one read of the mount table: nothing read through a
        // mount, so its cost is one blocking thread however many workspaces are open.
        let all = ws.clone();
        let mounts = self.start("workspace mounts", move || all.check_mounts());
        let (stored, spaced, database, mounts) = tokio::join!(
            stored.outcome(),
            spaced.outcome(),
            database.outcome(),
            mounts.outcome(),
        );
        let mut failures = Vec::new();
        let mut checks = Vec::new();
        match stored {
            Ok(()) => checks.push(Check::of("store writable", Ok(()))),
            Err(e) => {
                failures.push(format!("store: {e}"));
                let said = "the store cannot take a write".into();
                checks.push(Check::of("store writable", Err(said)));
            }
        }
        match spaced {
            Ok(()) => checks.push(Check::of("disk space", Ok(()))),
            Err(e) => {
                failures.push(format!("disk space: {e}"));
                let said = "a disk the server writes to is nearly full".into();
                checks.push(Check::of("disk space", Err(said)));
            }
        }
        match database {
            Ok(()) => checks.push(Check::of("database usable", Ok(()))),
            Err(e) => {
                failures.push(format!("database: {e}"));
                let said = "the state database cannot take a transaction".into();
                checks.push(Check::of("database usable", Err(said)));
            }
        }
        let said = match mounts {
            Ok(()) => Ok(()),
            Err(e) => {
                failures.push(e);
                // Not which nor how many: an unauthenticated probe learns nothing of them.
                Err("a workspace's mount does not answer".to_owned())
            }
        };
        checks.push(Check::of("workspace mounts", said));
        // Said at start in the log as well. A note, not a failure: skills are still served.
        checks.push(Check {
            note: ws.executor_limits(),
            ..Check::of("executor limits", Ok(()))
        });
        let ready = checks.iter().all(|c| c.ok);
        (Report { ready, checks }, failures)
    }

    /// Starts `check` on the blocking pool, unless the last check of `key` still runs.
    fn start(
        &mut self,
        key: &str,
        check: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Started {
        let busy = self.running.entry(key.to_owned()).or_default().clone();
        if busy.swap(true, Ordering::SeqCst) {
            return Started::Busy;
        }
        Started::Running(cloud_harness_memory::idle::spawn_blocking(move || {
            let outcome = check();
            busy.store(false, Ordering::SeqCst);
            outcome
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_check_still_running_is_not_started_again_and_fails() {
        let mut checks = Checks::default();
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let slow = checks.start("mount", move || {
            let _ = hold.recv();
            Ok(())
        });
        let again = checks.start("mount", || panic!("started twice"));
        assert_eq!(
            again.outcome().await,
            Err("the last check has not answered yet".into())
        );
        release.send(()).unwrap();
        assert_eq!(slow.outcome().await, Ok(()));
        // Once it ended, the next one runs.
        assert_eq!(checks.start("mount", || Ok(())).outcome().await, Ok(()));
    }

    #[test]
    fn a_disk_out_of_inodes_is_not_ready_with_space_free() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "mounting a tmpfs needs root"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Its own mount namespace would be cleaner; a tmpfs unmounted at the end does.
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m,nr_inodes=4200", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success());
        let dirs = [dir.path().to_owned()];
        let before = space(&dirs, 1 << 20);
        for i in 0..200 {
            std::fs::write(dir.path().join(i.to_string()), b"").unwrap();
        }
        let after = space(&dirs, 1 << 20);
        let _ = nix::mount::umount2(dir.path(), nix::mount::MntFlags::MNT_DETACH);
        assert_eq!(before, Ok(()));
        let e = after.unwrap_err();
        assert!(e.contains("inodes free, under 4096"), "{e}");
    }
}

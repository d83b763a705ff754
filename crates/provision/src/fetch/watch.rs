//! A download watched as it lands: past its byte ceiling, its deadline or a cancel it is
//! interrupted, and its bytes are shown as they grow.

use crate::observe::Observer;
use cloud_harness_error::{Code, Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How often a running download's size is looked at.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// What a download may not pass: the bytes under `pack_dir`, named by `setting` in the error;
/// and the largest object it may decode (`gitoxide.objects.allocLimit`), so that a small,
/// highly compressed object cannot make the fetch allocate more than that (`object_setting`
/// completes "larger than the limit of N bytes …").
pub struct Ceiling<'a> {
    pub max_bytes: u64,
    pub setting: &'a str,
    pub max_object: u64,
    pub object_setting: &'a str,
}

/// The bytes of the files directly in `dir` (a pack directory: the pack being received is a
/// temporary file there).
fn bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn too_large(url: &str, seen: u64, ceiling: &Ceiling<'_>) -> Error {
    let max = ceiling.max_bytes;
    Error::too_large(format!(
        "fetching {url}: the download passed {max} bytes ({seen} received; {})",
        ceiling.setting
    ))
    .with_details(serde_json::json!({ "url": url, "limit": max }))
}

/// A download faster than the watcher's look is measured once it is there (and before the
/// scratch repository that holds it is dropped).
pub(super) fn check_download(url: &str, pack_dir: &Path, ceiling: &Ceiling<'_>) -> Result<()> {
    let seen = bytes_in(pack_dir);
    match seen > ceiling.max_bytes {
        true => Err(too_large(url, seen, ceiling)),
        false => Ok(()),
    }
}

/// The bytes of the packs a fetch into the bare repository `repo` wrote.
pub(crate) fn pack_bytes(repo: &Path) -> u64 {
    bytes_in(&repo.join("objects/pack"))
}

/// Runs `work` with an interrupt flag that is raised at `deadline` (a TIMEOUT error), when
/// the bytes under `pack_dir` pass the ceiling (TOO_LARGE), or when `observer` is cancelled
/// (CANCELLED); the bytes so far go to `observer`, added to what it had (an acquisition's
/// fetch, then its provenance check, count as one).
pub(crate) fn watched<T>(
    url: &str,
    deadline: Instant,
    pack_dir: PathBuf,
    ceiling: &Ceiling<'_>,
    observer: &Observer,
    work: impl FnOnce(&AtomicBool) -> Result<T>,
) -> Result<T> {
    let interrupt = AtomicBool::new(false);
    let (done, wait) = channel::<()>();
    let max_bytes = ceiling.max_bytes;
    let before = observer.bytes();
    let (interrupt, pack_dir) = (&interrupt, &pack_dir);
    let (result, over) = std::thread::scope(|s| {
        let watcher = s.spawn(move || loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match wait.recv_timeout(left.min(WATCH_EVERY)) {
                Err(RecvTimeoutError::Timeout) if left.is_zero() || observer.is_cancelled() => {
                    interrupt.store(true, Ordering::SeqCst);
                    return None;
                }
                Err(RecvTimeoutError::Timeout) => {
                    let seen = bytes_in(pack_dir);
                    observer.set_bytes(before.saturating_add(seen));
                    if seen > max_bytes {
                        interrupt.store(true, Ordering::SeqCst);
                        return Some(seen);
                    }
                }
                _ => return None,
            }
        });
        let result = work(interrupt);
        drop(done);
        (result, watcher.join().ok().flatten())
    });
    match (result, over) {
        (Err(_), Some(seen)) => Err(too_large(url, seen, ceiling)),
        (Err(_), None) if observer.is_cancelled() => Err(Error::new(
            Code::Cancelled,
            format!("fetching {url} was cancelled"),
        )),
        (Err(_), None) if interrupt.load(Ordering::SeqCst) => Err(Error::new(
            Code::Timeout,
            format!("fetching {url} took longer than the time allowed"),
        )
        .with_details(serde_json::json!({ "url": url, "retryable": true }))),
        (other, _) => other,
    }
}

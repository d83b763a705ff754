//! `cloud-harness fetch-pack`: what a helper container runs. It waits for its one job — a line
//! of JSON on standard input (see [`Job`]) — so that it can be started before a fetch needs it
//! (helpers on standby), then fetches one commit through `HTTPS_PROXY` into a scratch
//! repository in the working folder and writes the pack to standard output, after a one-line
//! header: git objects only, which the host checks itself. Standard input closed before a job
//! came is a helper that was not needed: it exits 0.

use clap::Args;
use cloud_harness_control::toolkit::Revision;
use cloud_harness_error::{Error, Result};
use cloud_harness_provision::fetch::{self, Transport};
use cloud_harness_provision::sandbox::{Job, PACK_MAGIC};
use std::io::{BufRead, Read, Write};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct FetchPackArgs {}

/// The longest job line read: a URL, a revision, ceilings and the extra CA bundle.
const MAX_JOB: u64 = 4 << 20;

pub fn run(_args: &FetchPackArgs) -> Result<u8> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .take(MAX_JOB)
        .read_line(&mut line)
        .map_err(|e| Error::internal(format!("reading the job: {e}")))?;
    if line.trim().is_empty() {
        return Ok(0);
    }
    let job: Job = serde_json::from_str(&line)
        .map_err(|e| Error::invalid(format!("the job is not one this helper reads: {e}")))?;
    let revision = Revision::from_arg(&job.revision).ok_or_else(|| {
        Error::invalid(format!(
            "revision {:?}: commit:<id>, tag:<name> or head",
            job.revision
        ))
    })?;
    let deadline = Instant::now() + Duration::from_secs(job.max_seconds);
    let dir = std::env::current_dir()
        .map_err(|e| Error::internal(e.to_string()))?
        .join("repo");
    // The host refuses more than this of the helper's output; stop receiving it here too.
    let ceiling = fetch::Ceiling {
        max_bytes: job.max_bytes.saturating_mul(2),
        setting: "twice CLOUD_HARNESS_MAX_BYTES",
        // The host indexes the pack itself, within its own per-object limit.
        max_object: job.max_bytes.saturating_mul(2),
        object_setting: "per file (twice CLOUD_HARNESS_MAX_BYTES)",
    };
    let transport = Transport {
        extra_ca: job.extra_ca.map(String::into_bytes),
        proxy: Transport::proxy_from_env(),
        timeout: None,
    };
    let fetched = fetch::fetch(
        &job.url,
        &revision,
        &transport,
        &dir,
        deadline,
        &ceiling,
        &cloud_harness_provision::observe::Observer::default(),
    )?;
    let pack_dir = dir.join("objects").join("pack");
    let packs: Vec<_> = std::fs::read_dir(&pack_dir)
        .map_err(|e| Error::io(&pack_dir, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pack"))
        .collect();
    let [pack] = packs.as_slice() else {
        return Err(Error::internal(format!(
            "expected one pack, found {}",
            packs.len()
        )));
    };
    let mut bytes = std::fs::File::open(pack).map_err(|e| Error::io(pack, e))?;
    let mut out = std::io::stdout().lock();
    let header = format!(
        "{PACK_MAGIC} {} {}\n",
        fetched.repo.object_hash(),
        fetched.commit
    );
    out.write_all(header.as_bytes())
        .and_then(|()| std::io::copy(&mut bytes, &mut out).map(drop))
        .and_then(|()| out.flush())
        .map_err(|e| Error::internal(format!("writing the pack: {e}")))?;
    Ok(0)
}

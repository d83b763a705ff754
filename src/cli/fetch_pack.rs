//! `cloud-harness fetch-pack`: what a helper container runs. Fetches one commit through
//! `HTTPS_PROXY` into a scratch repository in the working folder and writes the pack to
//! standard output, after a one-line header: git objects only, which the host checks itself.

use crate::provision::fetch::{self, Transport};
use crate::provision::sandbox::PACK_MAGIC;
use crate::provision::staging::Limits;
use crate::toolkit::Revision;
use clap::Args;
use cloud_harness_fs::{Error, Result};
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct FetchPackArgs {
    #[arg(long)]
    pub url: String,
    /// `commit:<id>`, `tag:<name>` or `head`.
    #[arg(long)]
    pub revision: String,
}

pub fn run(args: &FetchPackArgs) -> Result<u8> {
    let revision = Revision::from_arg(&args.revision).ok_or_else(|| {
        Error::invalid(format!(
            "--revision {:?}: commit:<id>, tag:<name> or head",
            args.revision
        ))
    })?;
    let limits = Limits::from_env()?;
    let deadline = Instant::now() + Duration::from_secs(limits.max_seconds);
    let dir = std::env::current_dir()
        .map_err(|e| Error::internal(e.to_string()))?
        .join("repo");
    // The host refuses more than this of the helper's output; stop receiving it here too.
    let ceiling = fetch::Ceiling {
        max_bytes: limits.max_bytes.saturating_mul(2),
        setting: "twice CLOUD_HARNESS_MAX_BYTES",
    };
    let fetched = fetch::fetch(
        &args.url,
        &revision,
        &Transport::from_env()?,
        &dir,
        deadline,
        &ceiling,
        &crate::provision::observe::Observer::default(),
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

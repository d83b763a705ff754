//! The pack a helper container hands back: a header naming the object format and the commit,
//! then a git pack. The host indexes it itself (object ids recomputed from the bytes) and
//! checks the commit it was promised is there; nothing the container says is taken on faith.

use crate::fetch::{object_too_large, past_alloc_limit, Fetched};
use crate::staging::Limits;
use cloud_harness_error::{Code, Error, Result};
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// What the helper writes before the pack: `cloud-harness-pack 1 <sha1|sha256> <commit>\n`.
pub const PACK_MAGIC: &str = "cloud-harness-pack 1";

/// Indexes the helper's pack into a new bare repository at `dir`: the host recomputes every
/// object id from the bytes and checks the commit it was promised is there.
pub fn index_pack(output: &[u8], dir: &Path, limits: Limits) -> Result<Fetched> {
    index_pack_from(output, dir, limits)
}

/// [`index_pack`] from a stream (the file the helper's output was written to).
pub fn index_pack_from(
    mut output: impl std::io::BufRead,
    dir: &Path,
    limits: Limits,
) -> Result<Fetched> {
    let bad = |what: &str| {
        Error::new(
            Code::Upstream,
            format!("the helper's output is not a pack: {what}"),
        )
    };
    use std::io::BufRead;
    let mut line = Vec::new();
    std::io::Read::take(&mut output, 512)
        .read_until(b'\n', &mut line)
        .map_err(|_| bad("no header"))?;
    if line.pop() != Some(b'\n') {
        return Err(bad("no header"));
    }
    let header = std::str::from_utf8(&line).map_err(|_| bad("header"))?;
    let mut fields = header
        .strip_prefix(PACK_MAGIC)
        .ok_or_else(|| bad("header"))?
        .split_whitespace();
    let (format, commit) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
    let kind = match format {
        "sha1" => gix::hash::Kind::Sha1,
        "sha256" => gix::hash::Kind::Sha256,
        _ => return Err(bad("object format")),
    };
    let commit = gix::ObjectId::from_hex(commit.as_bytes()).map_err(|_| bad("commit id"))?;
    gix::create::into(
        dir,
        gix::create::Kind::Bare,
        gix::create::Options {
            object_hash: Some(kind),
            ..Default::default()
        },
    )
    .map_err(|e| Error::internal(format!("scratch repository: {e}")))?;
    let pack_dir = dir.join("objects").join("pack");
    let max_object = limits.max_file_bytes.saturating_mul(2);
    gix::odb::pack::Bundle::write_to_directory(
        &mut output,
        Some(&pack_dir),
        &mut gix::progress::Discard,
        &AtomicBool::new(false),
        None::<gix::objs::find::Never>,
        kind,
        gix::odb::pack::bundle::write::Options {
            alloc_limit_bytes: Some(max_object as usize),
            ..Default::default()
        },
    )
    .map_err(|e| match past_alloc_limit(&e) {
        true => object_too_large(
            "indexing the helper's pack",
            max_object,
            "per file (twice CLOUD_HARNESS_MAX_FILE_BYTES)",
        ),
        false => Error::new(Code::Upstream, format!("indexing the helper's pack: {e}")),
    })?;
    let repo = gix::open_opts(dir, gix::open::Options::isolated())
        .map_err(|e| Error::internal(format!("scratch repository: {e}")))?;
    repo.find_commit(commit).map_err(|_| {
        Error::new(
            Code::Upstream,
            format!("the helper's pack lacks commit {commit}"),
        )
    })?;
    // Refs the container says it saw are not taken on faith: the check asks for them itself.
    Ok(Fetched {
        repo,
        commit,
        advertised: None,
    })
}

//! Where the server keeps its state: `CLOUD_HARNESS_HOME`.
//!
//! ```text
//! <home>/operator.json                 operator decisions (overrides, approved skills)
//! <home>/workspaces/<id>/              one workspace (see `workspace`): its record (which
//!                                      holds its idempotency key), working tree, mounts
//! ```

use cloud_harness_error::{Error, Result};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `CLOUD_HARNESS_HOME`, else `$XDG_DATA_HOME/cloud-harness`, else
/// `~/.local/share/cloud-harness`.
pub fn default_home() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLOUD_HARNESS_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir)
        .join("cloud-harness")
}

/// The name this runner goes by in a database that several share (`CLOUD_HARNESS_RUNNER`,
/// else made once from the host's name and a random suffix and kept in `<home>/runner-id`):
/// its workspaces and import jobs are marked with it, so a runner starting up tidies only
/// what is its own.
pub(crate) fn runner_name(home: &Path) -> Result<String> {
    if let Ok(name) = std::env::var("CLOUD_HARNESS_RUNNER") {
        if !name.is_empty() {
            return Ok(name);
        }
    }
    let path = home.join("runner-id");
    match fs::read_to_string(&path) {
        Ok(name) if !name.trim().is_empty() => return Ok(name.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(&path, e)),
    }
    let host: String = fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .take(63)
        .collect();
    let host = if host.is_empty() {
        "runner".to_owned()
    } else {
        host
    };
    let name = crate::ids::new_id(&host);
    fs::create_dir_all(home).map_err(|e| Error::io(home, e))?;
    write_atomic(&path, format!("{name}\n").as_bytes())?;
    Ok(name)
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename, fsync the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().expect("state files have a folder");
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    // A temp name of its own for every writer, threads of one process too; removed if
    // anything fails.
    let prefix = format!(
        ".{}.",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("state")
    );
    let result = (|| -> std::io::Result<()> {
        let mut f = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".tmp")
            .tempfile_in(dir)?;
        f.write_all(bytes)?;
        f.as_file().sync_all()?;
        f.persist(path).map_err(|e| e.error)?;
        fs::File::open(dir)?.sync_all()
    })();
    result.map_err(|e| Error::io(path, e))
}

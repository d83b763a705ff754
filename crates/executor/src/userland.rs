//! The userland an executor's commands find: the host's own programs and libraries, bound
//! read-only (so scripts find `sh`, `python3`, `git`, `node` as the host has them), and a
//! few identity files of the executor's own. Nothing else of the host's `/etc` comes in: no
//! passwords, no keys, no configuration of the harness.

use cloud_harness_error::{Error, Result};
use std::path::Path;

/// One piece of the host's userland inside an executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Bound read-only at the same path.
    Bind(&'static str),
    /// A symbolic link, as the host has it (merged-/usr systems link `/bin` to `usr/bin`).
    Symlink(&'static str, String),
}

/// Folders a userland lives in; each a folder or a link on the host.
const TOP: [&str; 7] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];
/// What of `/etc` programs need to start and to trust TLS servers.
const ETC: [&str; 6] = [
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/localtime",
];

/// The host's userland as this machine has it, looked at once per process (every bubblewrap
/// command binds it).
pub fn entries() -> &'static [Entry] {
    static ENTRIES: std::sync::OnceLock<Vec<Entry>> = std::sync::OnceLock::new();
    ENTRIES.get_or_init(look)
}

fn look() -> Vec<Entry> {
    let mut out = Vec::new();
    for path in TOP.iter().chain(ETC.iter()) {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    out.push(Entry::Symlink(path, target.to_string_lossy().into_owned()));
                }
            }
            Ok(_) => out.push(Entry::Bind(path)),
            Err(_) => {}
        }
    }
    out
}

/// The names of the identity files, in `/etc`.
pub const IDENTITY: [&str; 4] = ["passwd", "group", "hosts", "nsswitch.conf"];

/// The identity files of an executor (`/etc/passwd`, `/etc/group`, `/etc/hosts`,
/// `/etc/nsswitch.conf`): root and the user commands run as, home `/tmp`.
pub fn identity(uid: u32, gid: u32) -> [(&'static str, String); 4] {
    let mut passwd = "root:x:0:0:root:/root:/usr/sbin/nologin\n".to_owned();
    let mut group = "root:x:0:\n".to_owned();
    if uid != 0 {
        passwd.push_str(&format!(
            "executor:x:{uid}:{gid}:Cloud Harness executor:/tmp:/bin/sh\n"
        ));
        group.push_str(&format!("executor:x:{gid}:\n"));
    }
    let [passwd_name, group_name, hosts, nsswitch] = IDENTITY;
    [
        (passwd_name, passwd),
        (group_name, group),
        (hosts, "127.0.0.1 localhost\n::1 localhost\n".to_owned()),
        (
            nsswitch,
            "passwd: files\ngroup: files\nhosts: files dns\n".to_owned(),
        ),
    ]
}

/// Writes the identity files into `dir` (bound into bubblewrap sandboxes).
pub(crate) fn write_identity(dir: &Path, uid: u32, gid: u32) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    for (name, text) in identity(uid, gid) {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

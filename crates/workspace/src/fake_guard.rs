//! A stand-in for `cloud-harness mount-guard` in unit tests (no binary of ours is built for
//! them): says it is ready, then reads its records until the server closes the pipe.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub(crate) fn program(dir: &Path) -> PathBuf {
    let path = dir.join("fake-guard");
    std::fs::write(&path, "#!/bin/sh\nprintf R\nexec cat >/dev/null\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}
